"""Hypothesis properties: orderings and monotonicity the accounting must obey whatever the parameters."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.privacy import ConfidentGNMaxAccountant
from capc_common.privacy.analysis import (
    DEFAULT_ORDERS,
    delta_from_rdp,
    epsilon_from_rdp,
    log_pass_probability,
    log_q_gnmax,
    rdp_gnmax_data_dependent,
    rdp_gnmax_data_independent,
    rdp_pure_dp,
    rdp_screening_exact,
    rdp_subsampled_gaussian,
    rdp_threshold_data_dependent,
    rdp_threshold_gaussian,
)

ORDERS = np.array([1.1, 1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0])
SETTINGS = settings(max_examples=40, deadline=None)

sigmas = st.floats(min_value=2.0, max_value=300.0)
noises = st.sampled_from(["continuous", "discrete"])


def _nondecreasing(values: np.ndarray, rel: float = 1e-12) -> bool:
    return bool(np.all(np.diff(values) >= -rel * np.abs(values[1:]) - 1e-300))


@SETTINGS
@given(
    teachers=st.integers(2, 300),
    classes=st.integers(2, 12),
    threshold_frac=st.floats(0.0, 1.2),
    sigma1=sigmas,
    noise=noises,
)
def test_screening_is_below_the_gaussian_bound_and_grows_with_the_order(
    teachers: int, classes: int, threshold_frac: float, sigma1: float, noise: str
) -> None:
    rdp = rdp_screening_exact(
        ORDERS,
        teachers=teachers,
        classes=classes,
        threshold=threshold_frac * teachers,
        sigma1=sigma1,
        noise=noise,
    )
    assert np.all(rdp >= 0)
    assert np.all(rdp <= rdp_threshold_gaussian(ORDERS, sigma1=sigma1) * (1 + 1e-12))
    assert _nondecreasing(rdp, rel=1e-9)


@SETTINGS
@given(teachers=st.integers(20, 300), sigma1=sigmas, factor=st.floats(1.05, 4.0), noise=noises)
def test_screening_decreases_with_more_noise(teachers: int, sigma1: float, factor: float, noise: str) -> None:
    args = {"teachers": teachers, "classes": 10, "threshold": 0.6 * teachers, "noise": noise}
    low = rdp_screening_exact(ORDERS, sigma1=sigma1, **args)
    high = rdp_screening_exact(ORDERS, sigma1=sigma1 * factor, **args)
    assert np.all(high <= low * (1 + 1e-9) + 1e-300)


@SETTINGS
@given(counts=st.lists(st.integers(0, 400), min_size=2, max_size=12), sigma=sigmas, noise=noises)
def test_data_dependent_gnmax_never_exceeds_data_independent(
    counts: list[int], sigma: float, noise: str
) -> None:
    log_q = float(log_q_gnmax(counts, sigma=sigma, noise=noise))
    assert log_q <= math.log1p(-1 / len(counts)) + 1e-12
    dd = rdp_gnmax_data_dependent(ORDERS, log_q=log_q, sigma=sigma)
    di = rdp_gnmax_data_independent(ORDERS, sigma=sigma)
    assert np.all(dd >= 0) and np.all(dd <= di * (1 + 1e-12))


@SETTINGS
@given(top=st.integers(0, 2000), threshold=st.floats(0, 1500), sigma1=sigmas, noise=noises)
def test_data_dependent_threshold_never_exceeds_its_gaussian_bound(
    top: int, threshold: float, sigma1: float, noise: str
) -> None:
    log_pass, log_fail = log_pass_probability([top, 0], threshold=threshold, sigma1=sigma1, noise=noise)
    assert math.isclose(math.exp(log_pass) + math.exp(log_fail), 1.0, rel_tol=1e-9)
    dd = rdp_threshold_data_dependent(ORDERS, log_pass=log_pass, log_fail=log_fail, sigma1=sigma1)
    assert np.all(dd >= 0) and np.all(dd <= rdp_threshold_gaussian(ORDERS, sigma1=sigma1) * (1 + 1e-12))


@SETTINGS
@given(log_q=st.floats(-300, -1e-3), sigma=sigmas)
def test_data_dependent_gnmax_grows_with_q(log_q: float, sigma: float) -> None:
    """A less likely wrong answer never costs more, and no q costs more than the data-independent bound.
    (Issue 25.8: this used to pass through an ``or`` that any constant satisfied; Prop. 10 picks μ from q,
    yet 40 000 random (q, σ) pairs in this range showed no inversion, so none is allowed.)"""
    a = rdp_gnmax_data_dependent(ORDERS, log_q=log_q - 1.0, sigma=sigma)
    b = rdp_gnmax_data_dependent(ORDERS, log_q=log_q, sigma=sigma)
    assert np.all(a >= 0) and np.all(a <= b * (1 + 1e-9))
    assert np.all(b <= rdp_gnmax_data_independent(ORDERS, sigma=sigma) * (1 + 1e-12))


def test_data_dependent_gnmax_is_cheaper_exactly_when_q_is_small() -> None:
    """The data-dependent bound is worth having: far below λ/σ² at low orders for a confident answer (q̃ =
    e^-20), and equal to it when a wrong answer is likely (q̃ → 1). A constant function fails one of them."""
    independent = rdp_gnmax_data_independent(ORDERS, sigma=10.0)
    confident = rdp_gnmax_data_dependent(ORDERS, log_q=-20.0, sigma=10.0)
    low = ORDERS <= 8
    assert np.all(confident[low] < 1e-5 * independent[low])
    np.testing.assert_array_equal(confident[ORDERS >= 64], independent[ORDERS >= 64])  # λ ≥ μ1: fallback
    np.testing.assert_array_equal(rdp_gnmax_data_dependent(ORDERS, log_q=-1e-3, sigma=10.0), independent)


_SCREENING = {
    noise: ConfidentGNMaxAccountant(
        teachers=200, classes=10, threshold=150.0, sigma1=120.0, sigma2=40.0, noise=noise
    ).query_rdp(DEFAULT_ORDERS)
    for noise in ("continuous", "discrete")
}


@SETTINGS
@given(
    queries=st.integers(0, 5000),
    extra=st.integers(1, 2000),
    answered_frac=st.floats(0, 1),
    sigma2=sigmas,
    noise=noises,
)
def test_epsilon_grows_with_queries_and_answers(
    queries: int, extra: int, answered_frac: float, sigma2: float, noise: str
) -> None:
    def eps(q: int, a: int, s2: float) -> float:
        rdp = q * _SCREENING[noise] + a * rdp_gnmax_data_independent(DEFAULT_ORDERS, sigma=s2)
        return epsilon_from_rdp(DEFAULT_ORDERS, rdp, delta=1e-5)[0]

    answered = math.floor(answered_frac * queries)
    base = eps(queries, answered, sigma2)
    assert base <= eps(queries + extra, answered, sigma2) <= eps(queries + extra, answered + extra, sigma2)
    assert eps(queries, answered, sigma2 * 1.5) <= base


@SETTINGS
@given(
    scale=st.floats(1e-4, 50.0),
    power=st.floats(0.5, 2.0),
    delta=st.floats(1e-12, 0.1),
    smaller=st.floats(0.01, 0.9),
)
def test_conversions_are_ordered_and_inverse(
    scale: float, power: float, delta: float, smaller: float
) -> None:
    rdp = scale * ORDERS**power
    improved, _ = epsilon_from_rdp(ORDERS, rdp, delta=delta)
    classic, _ = epsilon_from_rdp(ORDERS, rdp, delta=delta, method="classic")
    assert improved <= classic
    assert epsilon_from_rdp(ORDERS, rdp, delta=delta * smaller)[0] >= improved  # smaller δ, larger ε
    if improved > 0:
        assert delta_from_rdp(ORDERS, rdp, epsilon=improved)[0] <= delta * (1 + 1e-9)


@SETTINGS
@given(epsilon=st.floats(1e-3, 10.0))
def test_pure_dp_curve_bounds(epsilon: float) -> None:
    rdp = rdp_pure_dp(ORDERS, epsilon=epsilon)
    assert np.all(rdp <= epsilon * (1 + 1e-12))
    assert np.all(rdp <= ORDERS * epsilon**2 / 2 * (1 + 1e-9))
    assert _nondecreasing(rdp, rel=1e-9)
    br = rdp_pure_dp(ORDERS, epsilon=epsilon, bounded_range=True)
    assert np.all(br <= rdp) and np.all(br <= ORDERS * epsilon**2 / 8 * (1 + 1e-12))


@settings(max_examples=15, deadline=None)
@given(q=st.floats(1e-4, 0.5), factor=st.floats(1.1, 2.0), sigma=st.floats(0.6, 5.0))
def test_subsampling_amplifies(q: float, factor: float, sigma: float) -> None:
    orders = np.array([1.5, 2.0, 3.0, 8.0, 32.0])
    low = rdp_subsampled_gaussian(orders, sampling_rate=q, noise_multiplier=sigma)
    high = rdp_subsampled_gaussian(orders, sampling_rate=min(1.0, q * factor), noise_multiplier=sigma)
    full = orders / (2 * sigma**2)
    assert np.all(low <= high * (1 + 1e-9)) and np.all(high <= full * (1 + 1e-12))
    assert _nondecreasing(low, rel=1e-9)
