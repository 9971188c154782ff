"""Screening when each party knows its own part of the split threshold noise (issue 10, item 4).

The guardian sees a pass bit as ``1[m + z1_s ≥ T − z1_g]``: screening through the student's unknown
``N_Z(0, σ1²)`` at a threshold shifted by its own known ``z1_g`` (and the student the other way round). The
charge must hold for every integer shift, so it is compared here with a brute force over a wide window of
thresholds, computed independently of the library (its own pmf, tails and Bernoulli divergence).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from capc_common.errors import InputError
from capc_common.privacy import ConfidentGNMaxAccountant
from capc_common.privacy.analysis import rdp_screening_exact

ORDERS = np.array([2.0, 5.0, 10.0, 32.0])


def _brute_force(order: float, *, sigma: float, needs: np.ndarray) -> float:
    """max over the given needs ``d`` (pass iff z ≥ d) and both neighbours (d ± 1) of D_λ(Bern‖Bern)."""
    span = int(np.abs(needs).max()) + math.ceil(60 * sigma) + 2
    x = np.arange(-span, span + 1, dtype=np.float64)
    log_pmf = -(x**2) / (2 * sigma**2)
    log_pmf -= logsumexp(log_pmf)
    log_sf = np.logaddexp.accumulate(log_pmf[::-1])[::-1]  # log Pr[z ≥ x]
    log_cdf = np.logaddexp.accumulate(log_pmf)  # log Pr[z ≤ x]

    def logs(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return log_sf[d + span], log_cdf[d - 1 + span]  # pass: z ≥ d; fail: z ≤ d − 1

    worst = 0.0
    for shift in (1, -1):
        lp, lf = logs(needs)
        lq, lg = logs(needs + shift)
        terms = np.logaddexp(order * lp + (1 - order) * lq, order * lf + (1 - order) * lg)
        worst = max(worst, float(terms.max()) / (order - 1))
    return worst


def _every_shift(
    *, teachers: int, classes: int, threshold: float, sigma1: float, orders: np.ndarray
) -> float:
    """The needs of every feasible top count at every known shift of the threshold within ±(λ + 40σ1)."""
    window = math.ceil(orders.max() + 40 * sigma1)
    tops = np.arange(-(-teachers // classes), teachers + 1)
    shifts = np.arange(-window, window + 1)
    return np.unique((math.ceil(threshold) - shifts[:, None] - tops[None, :]).ravel())


@pytest.mark.parametrize(
    ("teachers", "classes", "threshold", "sigma1"),
    [(200, 10, 300, 40), (5, 10, 3, 2), (9, 10, 5, 3), (120, 10, 90, 72), (250, 10, 170, 100)],
)
def test_the_charge_covers_every_known_shift_of_the_threshold(
    teachers: int, classes: int, threshold: float, sigma1: float
) -> None:
    acc = ConfidentGNMaxAccountant(
        teachers=teachers, classes=classes, threshold=threshold, sigma1=sigma1, sigma2=10.0
    )
    charged = acc.query_rdp(ORDERS)
    needs = _every_shift(
        teachers=teachers, classes=classes, threshold=threshold, sigma1=sigma1, orders=ORDERS
    )
    brute = np.array([_brute_force(o, sigma=sigma1, needs=needs) for o in ORDERS])
    np.testing.assert_allclose(charged, np.minimum(brute, ORDERS / (2 * sigma1**2)), rtol=1e-9)


def test_a_threshold_above_the_teacher_count_is_no_longer_under_charged() -> None:
    """The review's case: T = 300 > k = 200, σ1 = 40. At T alone every top count sits far below the
    threshold; the guardian, knowing z1_g, may see it shifted right onto them."""
    fixed = rdp_screening_exact(ORDERS, teachers=200, classes=10, threshold=300, sigma1=40)
    charged = ConfidentGNMaxAccountant(
        teachers=200, classes=10, threshold=300, sigma1=40, sigma2=10
    ).query_rdp(ORDERS)
    assert np.all(charged > 2 * fixed)  # the old charge under-counted by 5-12x at these orders


@pytest.mark.parametrize(
    ("teachers", "threshold", "sigma1"), [(300, 210, 85), (200, 150, 120), (120, 90, 72), (75, 56.2, 45)]
)
def test_a_realistic_threshold_costs_what_it_did(teachers: int, threshold: float, sigma1: float) -> None:
    """T inside the feasible top counts: the worst shift is already there, the charge is unchanged."""
    orders = np.array([2.0, 4.6, 5.0, 10.0, 32.0])
    fixed = rdp_screening_exact(orders, teachers=teachers, classes=10, threshold=threshold, sigma1=sigma1)
    acc = ConfidentGNMaxAccountant(
        teachers=teachers, classes=10, threshold=threshold, sigma1=sigma1, sigma2=40
    )
    np.testing.assert_array_equal(acc.query_rdp(orders), fixed)


def test_one_teacher_never_moves_the_pass_bit() -> None:
    acc = ConfidentGNMaxAccountant(teachers=1, classes=10, threshold=1, sigma1=2, sigma2=1)
    np.testing.assert_array_equal(acc.query_rdp(ORDERS), 0.0)


def test_known_shifts_need_integer_noise() -> None:
    with pytest.raises(InputError, match="integer"):
        rdp_screening_exact(
            ORDERS, teachers=9, classes=10, threshold=5, sigma1=3, noise="continuous", known_shift=True
        )
