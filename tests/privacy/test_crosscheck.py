"""Independent references: dp-accounting (a test dependency only) and exact Gaussian-DP privacy profiles."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp import rdp_privacy_accountant as dpa
from scipy import integrate, stats

from capc_common.privacy import ConfidentGNMaxAccountant
from capc_common.privacy.analysis import (
    delta_from_rdp,
    discrete_gaussian_delta,
    epsilon_from_rdp,
    gaussian_delta,
    rdp_gnmax_data_independent,
    rdp_pure_dp,
    rdp_subsampled_gaussian,
    rdp_threshold_gaussian,
    rdp_zcdp,
)

ORDERS = np.array([1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.5, 8.0, 10.0, 16.0, 24.0, 32.0, 64.0, 128.0, 256.0])
INTEGER_ORDERS = ORDERS[np.round(ORDERS) == ORDERS]


@pytest.mark.parametrize(
    ("queries", "answered", "sigma1", "sigma2"),
    [(1000, 300, 100.0, 40.0), (5000, 5000, 150.0, 40.0), (64, 3, 30, 15)],
)
def test_gaussian_composition_matches_dp_accounting(
    queries: int, answered: int, sigma1: float, sigma2: float
) -> None:
    ours = queries * rdp_threshold_gaussian(ORDERS, sigma1=sigma1) + answered * rdp_gnmax_data_independent(
        ORDERS, sigma=sigma2
    )
    accountant = RdpAccountant(orders=ORDERS.tolist())
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma1), queries)
    # GNMax: L2 sensitivity √2, so the noise multiplier is σ2/√2.
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma2 / math.sqrt(2)), answered)
    np.testing.assert_allclose(ours, accountant._rdp, rtol=1e-12)
    for delta in (1e-5, 1e-8):
        eps, order = epsilon_from_rdp(ORDERS, ours, delta=delta)
        ref_eps, ref_order = accountant.get_epsilon_and_optimal_order(delta)
        assert eps == pytest.approx(ref_eps, rel=1e-9) and order == ref_order
    # The exact screening cost charged by the federation is never above the Gaussian bound.
    exact = ConfidentGNMaxAccountant(teachers=250, classes=10, threshold=170, sigma1=sigma1, sigma2=sigma2)
    exact.step(queries=queries, answered=answered)
    assert np.all(exact.rdp(ORDERS) <= ours * (1 + 1e-12))


def _exact_gdp_epsilon(mu: float, delta: float) -> float:
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_delta(mid, mu=mu) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize(("queries", "answered"), [(200, 50), (2000, 700), (10000, 4000)])
def test_rdp_bound_dominates_the_exact_gaussian_dp_profile(queries: int, answered: int) -> None:
    """A composition of Gaussians is one Gaussian with μ² = Σ Δ²/σ² (Dong, Roth & Su): exact ε(δ) known."""
    sigma1, sigma2, delta = 100.0, 40.0, 1e-5
    mu = math.sqrt(queries / sigma1**2 + 2 * answered / sigma2**2)
    orders = np.linspace(1.01, 200, 20000)
    rdp = queries * rdp_threshold_gaussian(orders, sigma1=sigma1) + answered * rdp_gnmax_data_independent(
        orders, sigma=sigma2
    )
    np.testing.assert_allclose(rdp, orders * mu**2 / 2, rtol=1e-12)
    exact = _exact_gdp_epsilon(mu, delta)
    improved = epsilon_from_rdp(orders, rdp, delta=delta)[0]
    classic = epsilon_from_rdp(orders, rdp, delta=delta, method="classic")[0]
    assert exact <= improved <= classic
    assert improved <= 1.35 * exact  # the improved conversion is close to exact for Gaussians
    assert delta_from_rdp(orders, rdp, epsilon=exact)[0] >= delta * (1 - 1e-9)


def test_subsampled_gaussian_matches_dp_accounting_at_integer_orders() -> None:
    for q, sigma in [(0.01, 1.0), (0.1, 2.0), (0.001, 0.7), (0.5, 5.0), (0.05, 0.8)]:
        ours = rdp_subsampled_gaussian(INTEGER_ORDERS, sampling_rate=q, noise_multiplier=sigma)
        ref = dpa._compute_rdp_poisson_subsampled_gaussian(q, sigma, INTEGER_ORDERS)
        np.testing.assert_allclose(ours, ref, rtol=1e-10)


def test_subsampled_gaussian_fractional_orders_are_exact_and_below_dp_accounting() -> None:
    """dp-accounting sums the magnitudes of the fractional series (an upper bound); ours sums it exactly."""
    for q, sigma, order in [
        (0.1, 2.0, 1.5),
        (0.05, 0.5, 1.5),
        (0.01, 1.0, 10.3),
        (0.2, 0.8, 3.7),
        (0.5, 5.0, 2.5),
    ]:
        ours = float(rdp_subsampled_gaussian(order, sampling_rate=q, noise_multiplier=sigma))

        def integrand(z: float, q: float = q, sigma: float = sigma, order: float = order) -> float:
            log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma**2))
            return math.exp(stats.norm.logpdf(z, scale=sigma) + order * log_ratio)

        value = integrate.quad(integrand, -80 * sigma, 80 * sigma + order, limit=2000, epsrel=1e-13)[0]
        assert ours == pytest.approx(math.log(value) / (order - 1), rel=1e-9)
        ref = dpa._compute_rdp_poisson_subsampled_gaussian(q, sigma, [order])[0]
        if np.isfinite(ref):
            assert ours <= ref * (1 + 1e-12)


def test_conversions_match_dp_accounting() -> None:
    rdp = 0.37 * ORDERS + 0.01 * ORDERS**1.5
    for delta in (1e-3, 1e-5, 1e-9):
        eps, order = epsilon_from_rdp(ORDERS, rdp, delta=delta)
        ref_eps, ref_order = dpa.compute_epsilon(ORDERS, rdp, delta)
        assert eps == pytest.approx(ref_eps, rel=1e-12) and order == ref_order
    for epsilon in (2.0, 5.0, 9.0):
        d, order = delta_from_rdp(ORDERS, rdp, epsilon=epsilon)
        ref_d, ref_order = dpa.compute_delta(ORDERS, rdp, epsilon)
        assert d == pytest.approx(ref_d, rel=1e-9) and order == ref_order


def test_pure_dp_curve_is_binary_randomized_response() -> None:
    for epsilon in (0.1, 1.0, 3.0):
        p = 2 / (1 + math.exp(epsilon))  # RR keeps the bit w.p. 1 - p/2 = e^ε/(1 + e^ε)
        accountant = RdpAccountant(
            orders=ORDERS.tolist(), neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        accountant.compose(dp_accounting.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=2))
        np.testing.assert_allclose(rdp_pure_dp(ORDERS, epsilon=epsilon), accountant._rdp, rtol=1e-9)


def test_zcdp_matches_dp_accounting() -> None:
    accountant = RdpAccountant(orders=ORDERS.tolist())
    accountant.compose(dp_accounting.ZCDpEvent(0.3))
    np.testing.assert_allclose(rdp_zcdp(ORDERS, rho=0.3), accountant._rdp, rtol=1e-12)


@pytest.mark.parametrize(("sigma", "eps"), [(1.0, 1.0), (10.0, 0.2), (3.0, 0.5), (2.5, 0.75)])
def test_discrete_gaussian_profile_matches_brute_force(sigma: float, eps: float) -> None:
    """δ(ε) = Σ_x max(0, P(x) - e^ε P(x - 1)) summed over every integer that matters."""
    x = np.arange(-60 * math.ceil(sigma) - 10, 60 * math.ceil(sigma) + 11)
    weights = np.exp(-(x**2) / (2 * sigma**2))
    p, p_shifted = weights / weights.sum(), np.exp(-((x - 1) ** 2) / (2 * sigma**2)) / weights.sum()
    brute = float(np.maximum(0.0, p - math.exp(eps) * p_shifted).sum())
    assert discrete_gaussian_delta(eps, sigma=sigma) == pytest.approx(brute, rel=1e-12)
