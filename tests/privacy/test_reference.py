"""Every known answer in /work/shared/reference/accounting.md (relative error ≤ 1e-9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from capc_common.privacy.analysis import (
    delta_from_rdp,
    discrete_gaussian_delta,
    discrete_gaussian_variance,
    epsilon_from_rdp,
    epsilon_from_zcdp,
    gaussian_delta,
    log_pass_probability,
    log_q_gnmax,
    rdp_gaussian,
    rdp_gnmax_data_dependent,
    rdp_gnmax_data_independent,
    rdp_screening_at,
    rdp_screening_exact,
    rdp_threshold_data_dependent,
    rdp_threshold_gaussian,
    rdp_zcdp,
)

REL = 1e-9
PATE_ORDERS = [1.5, 2, 5, 10, 20, 50, 100]


def close(actual: object, expected: object, rel: float = REL) -> None:
    np.testing.assert_allclose(
        np.asarray(actual, dtype=float), np.asarray(expected, dtype=float), rtol=rel, atol=0
    )


@pytest.mark.parametrize(
    ("counts", "sigma", "expected"),
    [
        ([250] + [0] * 9, 40, -10.019228294289038),
        ([200, 30, 20] + [0] * 7, 40, -5.659945978483009),
        ([130, 120] + [0] * 8, 40, -0.6615187454878643),
        ([100, 90, 60], 10, -1.4184501468396917),
        ([1000, 500, 300, 200, 0], 250, -2.1483911044301687),
        ([25, 25, 25, 25], 40, -0.2876820724517809),  # capped at log(1 - 1/4)
    ],
)
def test_log_q(counts: list[int], sigma: float, expected: float) -> None:
    close(log_q_gnmax(counts, sigma=sigma), expected)


def test_log_q_of_a_batch_is_row_by_row() -> None:
    batch = np.array([[250] + [0] * 9, [200, 30, 20] + [0] * 7, [130, 120] + [0] * 8])
    close(log_q_gnmax(batch, sigma=40), [-10.019228294289038, -5.659945978483009, -0.6615187454878643])


@pytest.mark.parametrize(
    ("log_q", "sigma", "expected"),
    [
        (
            -5,
            40,
            [0.0009375, 0.00125, 0.001744384527, 0.002086480793, 0.003338448708, 0.020243854613, 0.0625],
        ),
        (
            -20,
            40,
            [
                1.003952538349e-09,
                1.032965425996e-09,
                1.263099732083e-09,
                2.008958817953e-09,
                8.091086811040e-09,
                2.487249571708e-06,
                2.327410395345e-02,
            ],
        ),
        (
            -100,
            10,
            [
                3.637991870159e-43,
                4.753829701408e-43,
                2.908053444487e-41,
                2.969592210976e-37,
                7.542311633014e-29,
                4.073397230317e-03,
                9.998989898990e-01,
            ],
        ),
        (math.log(0.5), 40, [lam / 1600 for lam in PATE_ORDERS]),
        (-math.inf, 40, [0.0] * 7),
    ],
)
def test_data_dependent_gnmax(log_q: float, sigma: float, expected: list[float]) -> None:
    close(rdp_gnmax_data_dependent(PATE_ORDERS, log_q=log_q, sigma=sigma), expected)


@pytest.mark.parametrize(
    ("threshold", "sigma1", "counts", "expected"),
    [
        (200, 150, [250, 0], -0.46114909092111317),
        (200, 150, [150, 100], -0.9957633057792302),
        (300, 200, [120, 130], -1.6211940299694811),
    ],
)
def test_log_pass_probability(threshold: float, sigma1: float, counts: list[int], expected: float) -> None:
    log_pass, log_fail = log_pass_probability(counts, threshold=threshold, sigma1=sigma1)
    close(log_pass, expected)
    assert math.isclose(math.exp(log_pass) + math.exp(log_fail), 1.0, rel_tol=1e-14)


@pytest.mark.parametrize("top", [0, 600])
def test_data_dependent_threshold(top: int) -> None:
    log_pass, log_fail = log_pass_probability([top, 0], threshold=300, sigma1=50)
    rdp = rdp_threshold_data_dependent([2, 10, 50], log_pass=log_pass, log_fail=log_fail, sigma1=50)
    close(rdp, [2.712376516213e-10, 3.758062842649e-10, 1.131254769380e-08])


def test_threshold_failure_probability_uses_a_log_cdf() -> None:
    # p = Pr[5000 + N(0, 100²) ≥ 1000] rounds to 1; log(1 - p) must still come out finite and exact.
    log_pass, log_fail = log_pass_probability([5000, 0], threshold=1000, sigma1=100)
    assert log_pass == 0.0
    close(log_fail, special.log_ndtr(-40.0))
    assert -805 < float(log_fail) < -804
    rdp = rdp_threshold_data_dependent([2, 10, 50], log_pass=log_pass, log_fail=log_fail, sigma1=100)
    # The true value is about e^-803 (below the smallest double): tiny, never negative, never the fallback.
    assert np.all(rdp >= 0) and np.all(rdp < 1e-300)


def test_data_independent_threshold_cost() -> None:
    close(rdp_threshold_gaussian([2, 10, 50], sigma1=50), np.array([2, 10, 50]) / (2 * 50**2))
    close(rdp_gnmax_data_independent(PATE_ORDERS, sigma=40), np.array(PATE_ORDERS) / 1600)


SCREEN_ORDERS = [2, 5, 10, 32]


def test_screening_at_one_top_count() -> None:
    rdp = rdp_screening_at(SCREEN_ORDERS, top=210, neighbour=211, threshold=210, sigma1=85)
    close(rdp, [8.811328008418e-05, 2.202443948199e-04, 4.401014453781e-04, 1.390981679560e-03])


def test_screening_supremum_over_every_top_count() -> None:
    rdp = rdp_screening_exact(
        SCREEN_ORDERS, teachers=300, classes=10, threshold=210, sigma1=85, noise="continuous"
    )
    close(rdp, [8.811328008418e-05, 2.202943656228e-04, 4.406651458945e-04, 1.413280576500e-03])
    gaussian = rdp_threshold_gaussian(SCREEN_ORDERS, sigma1=85)
    close(gaussian, [1.384083044983e-04, 3.460207612457e-04, 6.920415224913e-04, 2.214532871972e-03])
    assert np.all(rdp <= gaussian)


def test_screening_checking_two_top_counts_under_reports() -> None:
    """The public Private-kNN code's shortcut (two values of m) is below the true supremum at high orders."""
    shortcut = np.maximum.reduce(
        [
            rdp_screening_at(SCREEN_ORDERS, top=m, neighbour=m + 1, threshold=210, sigma1=85)
            for m in (209, 210)
        ]
    )
    exact = rdp_screening_exact(
        SCREEN_ORDERS, teachers=300, classes=10, threshold=210, sigma1=85, noise="continuous"
    )
    assert exact[-1] > shortcut[-1] * 1.01


def test_classic_conversion() -> None:
    orders = np.array(PATE_ORDERS, dtype=float)
    eps, order = epsilon_from_rdp(orders, orders * 100 / 1600, delta=1e-5, method="classic")
    close(eps, 1.855943445524749)
    assert order == 20


def test_improved_conversion_single_order() -> None:
    close(epsilon_from_rdp([10], [1.0], delta=1e-5)[0], 1.9180106367839715)
    close(epsilon_from_rdp([10], [1.0], delta=1e-5, method="classic")[0], 2.2792139405522476)


@pytest.mark.parametrize(
    ("delta", "expected"), [(1e-5, 5.377728336819823), (1e-6, 5.953374610068334), (1e-8, 7.104667156565357)]
)
def test_thousand_gnmax_answers(delta: float, expected: float) -> None:
    orders = np.array(PATE_ORDERS, dtype=float)
    rdp = 1000 * rdp_gnmax_data_independent(orders, sigma=40)
    eps, order = epsilon_from_rdp(orders, rdp, delta=delta)
    close(eps, expected)
    assert order == 5
    # δ_from_rdp inverts the same inequality.
    close(delta_from_rdp(orders, rdp, epsilon=expected)[0], delta, rel=1e-9)


def test_thousand_gnmax_answers_classic() -> None:
    orders = np.array(PATE_ORDERS, dtype=float)
    eps, order = epsilon_from_rdp(orders, 1000 * orders / 1600, delta=1e-5, method="classic")
    close(eps, 6.003231366242558)
    assert order == 5


@pytest.mark.parametrize(("rho", "delta", "expected"), [(0.5, 1e-5, 4.7283869849), (0.1, 1e-6, 2.1419389284)])
def test_zcdp_conversion(rho: float, delta: float, expected: float) -> None:
    close(epsilon_from_zcdp(rho, delta=delta)[0], expected)


def test_discrete_gaussian_facts() -> None:
    close(discrete_gaussian_variance(sigma=1.0), 0.9999997887677282)
    assert discrete_gaussian_variance(sigma=1.0) < 1.0
    close(discrete_gaussian_delta(1.0, sigma=1.0), 1.413513394056e-01)
    close(gaussian_delta(1.0, mu=1.0), 1.269367375066e-01)
    close(discrete_gaussian_delta(0.2, sigma=10.0), 9.399225473452e-04)


def test_discrete_gaussian_has_the_gaussian_rdp() -> None:
    """ρ = Δ²/(2σ²) for integer queries: the divergence of integer shifts, summed directly, is ≤ λΔ²/(2σ²)."""
    sigma, shift = 1.0, 1
    x = np.arange(-60, 61, dtype=float)
    log_p = -(x**2) / (2 * sigma**2)
    log_p -= special.logsumexp(log_p)
    log_q = -((x - shift) ** 2) / (2 * sigma**2)
    log_q -= special.logsumexp(log_q)
    orders = np.array([1.5, 2.0, 5.0, 10.0])
    direct = np.array([special.logsumexp(a * log_p + (1 - a) * log_q) / (a - 1) for a in orders])
    bound = rdp_zcdp(orders, rho=shift**2 / (2 * sigma**2))
    close(bound, rdp_gaussian(orders, sigma=sigma, sensitivity=shift), rel=1e-15)
    assert np.all(direct <= bound * (1 + 1e-12)) and np.all(direct >= 0.999 * bound)
