"""From RDP (or zCDP) to (ε, δ)-DP.

* ``"classic"`` (Mironov 2017, Proposition 3): ``ε = RDP(λ) + log(1/δ)/(λ-1)``.
* ``"improved"`` (Canonne, Kamath & Steinke 2020, Proposition 12; Balle et al. 2020, Theorem 21; also
  Asoodeh et al. 2020): ``ε = RDP(λ) + log(1 - 1/λ) - log(δ·λ)/(λ-1)``, always smaller than the classic one.

Both hold at every order, so ε is minimised over the orders given; the order that achieves it is returned
too. The ``δ`` versions invert the same inequalities. For ρ-zCDP the improved conversion is minimised over
all real orders: its derivative ``ρ + log(δλ)/(λ-1)²`` has a single root.

Example:
    >>> eps, order = epsilon_from_rdp([10.0], [1.0], delta=1e-5)
    >>> round(eps, 10), order
    (1.9180106368, 10.0)
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.analysis._checks import count, non_negative, probability
from capc_common.privacy.analysis.orders import as_orders

__all__ = [
    "delta_from_rdp",
    "delta_with_sampler_distance",
    "epsilon_at_order",
    "epsilon_from_rdp",
    "epsilon_from_zcdp",
    "epsilon_holding",
    "rdp_budget_at_order",
    "rdp_budget_curve",
]

_METHODS = ("improved", "classic")


def _method(method: str) -> str:
    if method not in _METHODS:
        raise InputError(f"conversion method must be one of {_METHODS}, got {method!r}")
    return method


def _curve(
    orders: npt.ArrayLike, rdp: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    lam = as_orders(orders).ravel()
    try:
        values = np.asarray(rdp, dtype=np.float64).ravel()
    except (TypeError, ValueError) as exc:
        raise InputError(f"rdp must be an array of numbers, got {rdp!r}") from exc
    if values.shape != lam.shape:
        raise InputError(f"rdp has {values.size} values but there are {lam.size} orders; give one per order")
    if np.any(np.isnan(values)) or np.any(values < 0):
        raise InputError(
            f"RDP values must be ≥ 0 (or inf), got {values[np.isnan(values) | (values < 0)][:5]}"
        )
    return lam, values


def epsilon_at_order(
    order: float | npt.NDArray[np.float64],
    rdp: float | npt.NDArray[np.float64],
    *,
    delta: float,
    method: str = "improved",
) -> npt.NDArray[np.float64]:
    """ε implied by ``(order, rdp)``-RDP at one δ, for each order separately (no minimisation, no clamp)."""
    d = probability("delta", delta)
    lam = np.asarray(order, dtype=np.float64)
    value = np.asarray(rdp, dtype=np.float64)
    if _method(method) == "classic":
        return value - math.log(d) / (lam - 1)
    return value + np.log1p(-1 / lam) - (math.log(d) + np.log(lam)) / (lam - 1)


def epsilon_from_rdp(
    orders: npt.ArrayLike, rdp: npt.ArrayLike, *, delta: float, method: str = "improved"
) -> tuple[float, float]:
    """Smallest ε over the orders such that the mechanism is (ε, δ)-DP.

    Args:
        orders: orders λ > 1.
        rdp: the RDP curve at those orders (≥ 0; inf allowed).
        delta: target δ in (0, 1).
        method: ``"improved"`` (default) or ``"classic"``.

    Returns:
        ``(ε, order)``; ε is never negative (a negative bound still proves (0, δ)-DP), and a curve that is
        zero everywhere (nothing released) gives ε = 0 at the largest order.

    Raises:
        InputError: mismatched or invalid inputs.
    """
    lam, values = _curve(orders, rdp)
    if not np.any(values):
        probability("delta", delta)
        return 0.0, float(lam.max())
    eps = epsilon_at_order(lam, values, delta=delta, method=method)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(lam[best])


def rdp_budget_curve(
    orders: npt.ArrayLike, *, epsilon: float, delta: float, method: str = "improved"
) -> npt.NDArray[np.float64]:
    """The largest RDP at each order whose conversion stays within (ε, δ); ≤ 0 where none can.

    This is what a Rényi filter at that order may spend; planners take the order that buys the most.
    """
    eps = non_negative("epsilon", epsilon)
    lam = as_orders(orders)
    return eps - epsilon_at_order(lam, np.zeros_like(lam), delta=delta, method=method)


def rdp_budget_at_order(*, epsilon: float, delta: float, order: float, method: str = "improved") -> float:
    """The largest RDP at ``order`` whose conversion stays within (ε, δ): the Rényi filter's budget.

    Raises:
        InputError: invalid ε, δ or order, or an (ε, δ) that no positive RDP at this order can meet
            (:func:`rdp_budget_curve` returns the non-positive value instead).
    """
    eps = non_negative("epsilon", epsilon)
    lam = float(as_orders(order))
    budget = float(rdp_budget_curve(lam, epsilon=eps, delta=delta, method=method))
    if budget <= 0:
        raise InputError(
            f"(ε={eps:g}, δ={delta:g}) cannot be met at order {lam:g}: even zero RDP converts to "
            f"ε={eps - budget:.4g}; raise ε or δ, or pick a larger order"
        )
    return budget


def epsilon_holding(rdp: float, *, delta: float, order: float, decimals: int = 2) -> float:
    """The smallest ε, rounded up to ``decimals`` (a plain figure for a configuration file), whose budget at
    ``order`` (:func:`rdp_budget_at_order`) holds ``rdp``: the limit or cap to set for a charge of ``rdp``.

    Example:
        >>> epsilon_holding(1.0, delta=1e-5, order=10.0)
        1.92
    """
    value = non_negative("rdp", rdp)
    step = 10.0**-decimals
    exact = float(epsilon_at_order(order, value, delta=delta)) if value > 0 else 0.0
    limit = max(step, math.ceil(exact / step) * step)
    while rdp_budget_at_order(epsilon=limit, delta=delta, order=order) < value:  # a rounding hair
        limit += step
    return round(limit, decimals)


def delta_from_rdp(
    orders: npt.ArrayLike, rdp: npt.ArrayLike, *, epsilon: float, method: str = "improved"
) -> tuple[float, float]:
    """Smallest δ over the orders such that the mechanism is (ε, δ)-DP.

    Improved: ``δ = exp((λ-1)(RDP - ε + log(1 - 1/λ)) - log λ)`` (CKS 2020, Prop. 12); classic:
    ``δ = exp((λ-1)(RDP - ε))``. Capped at 1.

    Returns:
        ``(δ, order)``.
    """
    lam, values = _curve(orders, rdp)
    eps = non_negative("epsilon", epsilon)
    if _method(method) == "classic":
        log_delta = (lam - 1) * (values - eps)
    else:
        log_delta = (lam - 1) * (values - eps + np.log1p(-1 / lam)) - np.log(lam)
    best = int(np.argmin(log_delta))
    return min(1.0, math.exp(min(float(log_delta[best]), 0.0))), float(lam[best])


def epsilon_from_zcdp(rho: float, *, delta: float, method: str = "improved") -> tuple[float, float]:
    """ε of a ρ-zCDP mechanism at δ, optimised over every real order.

    Improved: minimises ``ρλ + log(1 - 1/λ) - log(δλ)/(λ-1)`` at the root of ``ρ(λ-1)² + log(δλ) = 0``
    (CKS 2020, Corollary 13). Classic: ``ρ + 2·sqrt(ρ·log(1/δ))`` (Bun & Steinke 2016, Prop. 1.3).

    Returns:
        ``(ε, order)``.
    """
    r = non_negative("rho", rho)
    d = probability("delta", delta)
    if r == 0:
        return 0.0, math.inf
    if _method(method) == "classic":
        return r + 2 * math.sqrt(r * math.log(1 / d)), 1 + math.sqrt(math.log(1 / d) / r)
    # g(λ) = ρ(λ-1)² + log(δλ) increases on λ > 1 (g' = 2ρ(λ-1) + 1/λ), is negative near 1 and positive
    # at ``hi``: bisect to the last bit.
    lo, hi = 1.0, 2 + math.sqrt(-math.log(d) / r)
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if r * (mid - 1) ** 2 + math.log(d * mid) < 0:
            lo = mid
        else:
            hi = mid
    order = hi
    eps = float(epsilon_at_order(order, r * order, delta=d))
    return max(0.0, eps), float(order)


def delta_with_sampler_distance(*, epsilon: float, draws: int, distance: float) -> float:
    """What sampling the noise only approximately adds to δ.

    If each of ``draws`` independent noise values comes from a distribution within total-variation distance
    ``η`` of the exact one, every output of the mechanism is within ``N·η`` of the exact mechanism's output
    (total variation is subadditive over independent draws). An (ε, δ)-DP guarantee of the exact mechanism
    then holds for the real one with ``δ + (1 + e^ε)·N·η``: for every event S and neighbours,
    ``P(S) ≤ P*(S) + Nη ≤ e^ε·P*'(S) + δ + Nη ≤ e^ε·P'(S) + δ + (1 + e^ε)·Nη``.

    Args:
        epsilon: the ε of the guarantee.
        draws: the most noise values the released outputs can depend on.
        distance: the per-draw total-variation bound ``η``
            (:attr:`~capc_common.privacy.noise.SamplerTable.distance_bound`).

    Returns:
        The amount to add to δ (``inf`` when ``e^ε`` overflows).

    Raises:
        InputError: a negative ``draws`` or ``distance``, or a non-finite ε.
    """
    eps = non_negative("epsilon", epsilon)
    n = count("draws", draws)
    eta = non_negative("distance", distance)
    if eps > 700:  # e^ε overflows float64: no useful bound
        return math.inf
    return (1 + math.exp(eps)) * n * eta
