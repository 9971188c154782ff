"""The sum of independent discrete Gaussians (Kairouz, Liu & Steinke 2021) and the noise split it allows: the
bound is never below the exact Rényi divergence of the summed distribution (computed here from its pmf), is
the discrete Gaussian's own for one party, and the split a release uses is at least as private as the plan
without adding variance wherever σ is not tiny."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.errors import InputError
from capc_common.privacy.analysis import (
    distributed_tau,
    rdp_distributed_discrete_gaussian,
    share_sigma,
    zcdp_distributed,
)
from capc_common.privacy.analysis._special import logsumexp

RADIUS = 120  # each part's support [-R, R]: the mass beyond is below e^-800 for σ ≤ 3


def _log_pmf_of_sum(sigma: float, parts: int) -> np.ndarray:
    """``log Pr[Z = s]`` for ``s`` in ``[-parts·R, parts·R]``, Z a sum of ``parts`` independent N_Z(0, σ²),
    by exact convolution in log space."""
    x = np.arange(-RADIUS, RADIUS + 1, dtype=np.float64)
    one = -(x**2) / (2 * sigma**2)
    one -= logsumexp(one)
    total = one
    for _ in range(parts - 1):
        size = len(total) + len(one) - 1
        out = np.full(size, -np.inf)
        for i, value in enumerate(total):  # s = i + j over the two supports
            out[i : i + len(one)] = np.logaddexp(out[i : i + len(one)], value + one)
        total = out
    return total


def _renyi_shifted_by_one(log_p: np.ndarray, alpha: float) -> float:
    """``D_α(Z ‖ Z + 1)`` from Z's log pmf: ``1/(α−1) log Σ p(s)^α p(s−1)^(1−α)``."""
    terms = alpha * log_p[1:] + (1 - alpha) * log_p[:-1]
    return float(logsumexp(terms)) / (alpha - 1)


@pytest.mark.parametrize("sigma", [0.5, 0.6, 0.8, 1.0, 1.5, 3.0])
@pytest.mark.parametrize("alpha", [2.0, 4.0, 16.0])
def test_the_bound_is_never_below_the_exact_divergence_of_the_sum(sigma: float, alpha: float) -> None:
    exact = _renyi_shifted_by_one(_log_pmf_of_sum(sigma, 2), alpha)
    bound = float(rdp_distributed_discrete_gaussian([alpha], sigma=sigma, parties=2, sensitivity=1.0)[0])
    assert exact <= bound * (1 + 1e-12)  # the pmf's own summation is good to a few ulps
    # Where τ vanishes the bound is the Gaussian of variance 2σ², and the exact figure is close to it.
    if sigma >= 1.5:
        assert bound == pytest.approx(alpha / (4 * sigma**2), rel=1e-6)
        assert exact == pytest.approx(bound, rel=1e-3)


def test_one_party_is_the_discrete_gaussian_and_tau_grows_as_sigma_shrinks() -> None:
    orders = np.array([1.5, 2.0, 10.0, 100.0])
    np.testing.assert_allclose(
        rdp_distributed_discrete_gaussian(orders, sigma=40.0, parties=1, sensitivity=3.0, dimension=50),
        orders * 9.0 / (2 * 40.0**2),
        rtol=1e-15,
    )
    # τ = 10 Σ_{k=1}^{n-1} exp(−2π²σ²k/(k+1)): for two parts, 10 exp(−π²σ²).
    assert distributed_tau(sigma=1.0, parties=2) == pytest.approx(10 * math.exp(-(math.pi**2)), rel=1e-14)
    assert distributed_tau(sigma=6.0, parties=3) < 1e-150
    assert distributed_tau(sigma=0.5, parties=2) > distributed_tau(sigma=1.0, parties=2) > 0
    with pytest.raises(InputError, match=r"σ ≥ 0\.5"):
        zcdp_distributed(sigma=0.4, parties=2, sensitivity=1.0, dimension=1)


@pytest.mark.parametrize(
    ("sigma", "sensitivity", "dimension"),
    [
        (5.3241 * 819, 819.0, 10_250),  # the compose plan's DP-SGD round: τ vanishes
        (40.0, 8192.0 / 40.0, 640),  # DP prototypes' sums
        (1.58, 1.0, 10),  # DP prototypes' counts: τ costs a little
        (2.0, 1.0, 3_000),  # DPPL-Public's counts
    ],
)
def test_each_part_is_half_the_planned_variance_and_the_sum_is_as_private(
    sigma: float, sensitivity: float, dimension: int
) -> None:
    part = share_sigma(sigma, sensitivity=sensitivity, dimension=dimension)
    assert 2 * part**2 >= sigma**2  # never less total noise than planned
    assert 2 * part**2 <= sigma**2 * (1 + 1e-3)  # and no more than a rounding of it: no utility lost
    plan = sensitivity**2 / (2 * sigma**2)
    assert zcdp_distributed(sigma=part, parties=2, sensitivity=sensitivity, dimension=dimension) <= plan


def test_a_tiny_sigma_keeps_the_whole_sigma_in_each_part() -> None:
    """σ/√2 below the proposition's 1/2, or τ too large to reach the plan below σ: each part is the whole σ,
    private by post-processing of either part alone (the total variance doubles)."""
    assert share_sigma(0.5, sensitivity=1.0, dimension=100) == 0.5
    assert share_sigma(0.7, sensitivity=1.0, dimension=100_000) == 0.7


@settings(max_examples=60, deadline=None)
@given(
    sigma=st.floats(0.3, 1e5),
    sensitivity=st.floats(1.0, 1e4),
    dimension=st.integers(1, 200_000),
)
def test_the_split_never_falls_below_the_plan(sigma: float, sensitivity: float, dimension: int) -> None:
    part = share_sigma(sigma, sensitivity=sensitivity, dimension=dimension)
    assert part * math.sqrt(2) >= sigma
    if part < sigma:
        rho = zcdp_distributed(sigma=part, parties=2, sensitivity=sensitivity, dimension=dimension)
        assert rho <= sensitivity**2 / (2 * sigma**2)
    else:
        assert part == sigma
