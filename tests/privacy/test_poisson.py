"""Known answers and properties of the general Poisson-subsampled RDP bound (Zhu & Wang 2019, Theorem 6)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.privacy.analysis import (
    rdp_gaussian,
    rdp_poisson_subsampled,
    rdp_subsampled_discrete_gaussian,
    rdp_subsampled_gaussian,
)


def _theorem6(order: int, q: float, z: float) -> float:
    """Theorem 6 written out term by term (an independent implementation for integer orders)."""
    terms = []
    for ell in range(order + 1):
        c = math.comb(order, ell) * (1 - q) ** (order - ell) * q**ell
        if ell <= 1:
            terms.append(c)
        else:
            terms.append(c * math.exp((ell - 1) * ell / (2 * z * z)) * (3 if ell >= 3 else 1))
    return math.log(sum(terms)) / (order - 1)


def test_known_answer_alpha_3():
    # A = 0.9³ + 3·0.1·0.9² + 3·0.01·0.9·e^1 + 3·0.001·e^(2·1.5), RDP = log(A)/2, computed by hand.
    got = rdp_subsampled_discrete_gaussian(np.array([3.0]), sampling_rate=0.1, noise_multiplier=1.0)
    assert got[0] == pytest.approx(0.050216798212001174, rel=1e-13)


@pytest.mark.parametrize(("order", "q", "z"), [(5, 0.02, 2.0), (10, 0.068, 2.63), (32, 0.001, 1.5)])
def test_matches_the_theorem_term_by_term(order: int, q: float, z: float):
    got = rdp_subsampled_discrete_gaussian(np.array([float(order)]), sampling_rate=q, noise_multiplier=z)
    assert got[0] == pytest.approx(min(_theorem6(order, q, z), order / (2 * z * z)), rel=1e-12)


def test_exact_at_order_2_and_never_below_the_gaussian_analysis():
    orders = np.array([2.0, 3.0, 4.0, 8.0, 16.0, 40.0])
    for q, z in [(0.01, 1.0), (0.068, 2.63), (0.3, 5.0)]:
        general = rdp_subsampled_discrete_gaussian(orders, sampling_rate=q, noise_multiplier=z)
        mironov = rdp_subsampled_gaussian(orders, sampling_rate=q, noise_multiplier=z)
        assert general[0] == pytest.approx(mironov[0], rel=1e-12)
        assert np.all(general >= mironov * (1 - 1e-12))


def test_edges_and_fractional_orders():
    orders = np.array([1.5, 2.0, 2.5, 3.0, 7.25])
    z = 1.5
    np.testing.assert_allclose(
        rdp_subsampled_discrete_gaussian(orders, sampling_rate=1.0, noise_multiplier=z),
        rdp_gaussian(orders, sigma=z),
    )
    np.testing.assert_array_equal(
        rdp_subsampled_discrete_gaussian(orders, sampling_rate=0.0, noise_multiplier=z), 0
    )
    curve = rdp_subsampled_discrete_gaussian(orders, sampling_rate=0.05, noise_multiplier=z)
    # Convex interpolation of log A between integer orders: (λ-1)·RDP lies between its neighbours'.
    log_a = (orders - 1) * curve
    assert log_a[1] <= log_a[2] <= log_a[3]
    assert 0 <= log_a[0] <= log_a[1]
    # More sampling never costs less.
    assert np.all(rdp_subsampled_discrete_gaussian(orders, sampling_rate=0.1, noise_multiplier=z) >= curve)


def test_any_base_curve_and_bad_rates():
    pure = rdp_poisson_subsampled(
        np.array([4.0]), sampling_rate=0.01, base_rdp=lambda a: np.full_like(a, 1.0)
    )
    assert 0 < pure[0] < 1.0
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        rdp_subsampled_discrete_gaussian(np.array([2.0]), sampling_rate=1.5, noise_multiplier=1.0)
