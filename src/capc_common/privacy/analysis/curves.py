"""Closed-form RDP curves: Gaussian mechanisms, pure ε-DP and zCDP.

* Gaussian mechanism, L2 sensitivity Δ, noise σ: ``λΔ²/(2σ²)`` (Mironov 2017, Proposition 7). The same
  bound holds for discrete Gaussian noise on integer queries (Canonne, Kamath & Steinke 2020, Prop. 5 and
  Theorem 14 for vectors).
* GNMax (one vote moves two counts by 1, Δ = √2): ``λ/σ²``; the threshold step on the top count (Δ = 1):
  ``λ/(2σ1²)`` (Papernot et al. 2018).
* Pure ε-DP: the exact worst case is randomized response, ``1/(λ-1)·log((e^{λε} + e^{(1-λ)ε})/(1 + e^ε))``,
  the bound ``(sinh(λε) - sinh((λ-1)ε))/sinh(ε)`` of Bun & Steinke 2016 (proof of Proposition 3.3). An
  ε-DP exponential mechanism is also ε-bounded-range and so ``ε²/8``-zCDP (Cesar & Rogers 2021).
* ρ-zCDP: ``ρλ`` at every order (Bun & Steinke 2016, Definition 1.1).

Example:
    >>> rdp_gnmax_data_independent([2.0, 10.0], sigma=40.0).tolist()
    [0.00125, 0.00625]
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from capc_common.privacy.analysis._checks import non_negative, positive
from capc_common.privacy.analysis.orders import as_orders

__all__ = [
    "rdp_gaussian",
    "rdp_gnmax_data_independent",
    "rdp_pure_dp",
    "rdp_threshold_gaussian",
    "rdp_zcdp",
]


def rdp_gaussian(orders: npt.ArrayLike, *, sigma: float, sensitivity: float = 1.0) -> npt.NDArray[np.float64]:
    """RDP of the Gaussian mechanism: ``λΔ²/(2σ²)`` (Mironov 2017, Proposition 7).

    Args:
        orders: orders λ > 1.
        sigma: noise standard deviation σ (or the discrete Gaussian's σ).
        sensitivity: L2 sensitivity Δ of the query.
    """
    d = non_negative("sensitivity", sensitivity)
    return _gaussian(orders, sigma=sigma, sensitivity_squared=d * d)


def _gaussian(orders: npt.ArrayLike, *, sigma: float, sensitivity_squared: float) -> npt.NDArray[np.float64]:
    lam = as_orders(orders)
    s = positive("sigma", sigma)
    return lam * sensitivity_squared / (2 * s * s)


def rdp_gnmax_data_independent(orders: npt.ArrayLike, *, sigma: float) -> npt.NDArray[np.float64]:
    """Data-independent RDP of one GNMax answer: ``λ/σ²`` (vote histograms have L2 sensitivity √2)."""
    return _gaussian(orders, sigma=sigma, sensitivity_squared=2.0)


def rdp_threshold_gaussian(orders: npt.ArrayLike, *, sigma1: float) -> npt.NDArray[np.float64]:
    """Gaussian bound on one threshold step: ``λ/(2σ1²)`` (the top count has sensitivity 1)."""
    return _gaussian(orders, sigma=sigma1, sensitivity_squared=1.0)


def rdp_pure_dp(
    orders: npt.ArrayLike, *, epsilon: float, bounded_range: bool = False
) -> npt.NDArray[np.float64]:
    """RDP implied by pure ε-DP (e.g. the exponential or discrete Laplace mechanism).

    Args:
        orders: orders λ > 1.
        epsilon: the mechanism's ε.
        bounded_range: the mechanism is ε-bounded-range (the exponential mechanism is); then the curve is
            also capped by ``λε²/8`` (Cesar & Rogers 2021).

    Returns:
        RDP at each order, never above ε.
    """
    lam = as_orders(orders)
    eps = non_negative("epsilon", epsilon)
    if eps == 0:
        return np.zeros_like(lam)
    curve = (np.logaddexp(lam * eps, (1 - lam) * eps) - np.logaddexp(0.0, eps)) / (lam - 1)
    curve = np.clip(curve, 0.0, eps)
    if bounded_range:
        curve = np.minimum(curve, lam * eps * eps / 8)
    return curve


def rdp_zcdp(orders: npt.ArrayLike, *, rho: float) -> npt.NDArray[np.float64]:
    """RDP of a ρ-zCDP mechanism: ``ρλ`` (Bun & Steinke 2016)."""
    return as_orders(orders) * non_negative("rho", rho)
