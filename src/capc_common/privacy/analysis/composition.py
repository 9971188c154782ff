"""Adding up charges made under different Rényi orders: a hospital's lifetime budget across federations.

Each federation runs its own Rényi filter at its own order λ_f (chosen for its own ε), so the RDP figures
its parties record are not comparable across federations. A hospital that sums them under one limit must
state every charge at **one** order λ_s, fixed before the first charge:

* **Fixed-order composition.** RDP at one order adds under adaptive composition (Mironov 2017, Prop. 1),
  also when the parameters of each step are chosen after seeing earlier outputs, provided the running total
  is kept within a budget fixed in advance — a Rényi filter (Feldman & Zrnic 2021) — and also when the
  mechanisms are interactive and run concurrently, interleaved, as federations of one hospital do (Haney et
  al. 2023, "Concurrent Composition for Interactive Differential Privacy with Adaptive Privacy-Loss
  Parameters": every valid filter extends to that setting for RDP of a fixed order). The improved
  conversion (Canonne, Kamath & Steinke 2020, Prop. 12) then gives (ε, δ) at the hospital's own δ: the δ of
  each federation plays no part, since RDP has none.
* **Why not the alternatives.** Basic composition of each federation's (ε_f, δ_f) is sound but adds ε
  linearly: two federations of ε 10 at δ 1e-5 give ε 20 at δ 2e-5, where the same two charges at one order
  give less. Minimising ε over a grid of orders *after* the charges were chosen is valid only for a sequence
  fixed in advance; with adaptively chosen charges a filter over the whole privacy profile is not free in
  general ("Privacy Filters are Captured by Residues", 2026: only totally ordered families of mechanisms
  admit one), so the order is fixed when the site's ledger is created and every charge is stated at it.
* **Stating a charge at λ_s.** The charges of every mechanism here are data-independent worst cases, so the
  federation's mechanism gives them at λ_s exactly (:mod:`capc_common.federation.exposure`). A figure already
  recorded at another order λ_r (a per-federation cap record written before the hospital had a site ledger)
  is carried over only to an order λ_s ≤ λ_r: Rényi divergence does not decrease with its order (van Erven
  & Harremoës 2014, Theorem 3), so the recorded bound is also a bound at every lower order
  (:func:`rdp_at_lower_order`).

Example:
    Two Gaussian charges (Δ = 1) of σ 2 and σ 3, both stated at λ 8 (``λ/(2σ²)`` each), then the ε of their
    sum at δ 1e-5:

    >>> from capc_common.privacy.analysis import epsilon_at_order, rdp_gaussian
    >>> total = float(rdp_gaussian(8.0, sigma=2.0) + rdp_gaussian(8.0, sigma=3.0))
    >>> round(total, 6), round(float(epsilon_at_order(8.0, total, delta=1e-5)), 6)
    (1.444444, 2.658554)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.analysis._checks import non_negative
from capc_common.privacy.analysis.conversion import rdp_budget_curve
from capc_common.privacy.analysis.orders import as_orders

__all__ = ["lifetime_order", "rdp_at_lower_order"]


def lifetime_order(plan: npt.ArrayLike, *, orders: npt.ArrayLike, epsilon: float, delta: float) -> float:
    """The order at which a lifetime limit (ε, δ) holds the most copies of one federation's plan.

    A hospital fixes its ledger's order once, before its first charge. Not knowing the federations to come,
    it takes the order at which its limit's RDP budget ``B(λ)`` divided by the planned charge ``r(λ)`` of the
    federation it joins first is largest: the most federations like that one fit. Any order is sound; this
    one only wastes the least budget on federations like the first.

    Args:
        plan: the first federation's planned charge at each of ``orders`` (RDP, ≥ 0).
        orders: orders λ > 1.
        epsilon: the lifetime limit.
        delta: the lifetime δ.

    Returns:
        The order (one of ``orders``).

    Raises:
        InputError: mismatched inputs, or no order of ``orders`` can meet (ε, δ) at all.

    Example:
        >>> lifetime_order([1.0, 0.5, 1.5], orders=[2.0, 4.0, 8.0], epsilon=20.0, delta=1e-5)
        4.0
    """
    lam = as_orders(orders).ravel()
    cost = np.asarray(plan, dtype=np.float64).ravel()
    if cost.shape != lam.shape or np.any(~np.isfinite(cost)) or np.any(cost < 0):
        raise InputError(f"the plan needs one finite RDP ≥ 0 per order ({lam.size} orders), got {cost[:5]}")
    budget = rdp_budget_curve(lam, epsilon=epsilon, delta=delta)
    if not np.any(budget > 0):
        raise InputError(
            f"a lifetime limit of ε {epsilon:g} at δ {delta:g} cannot be met at any order from {lam.min():g} "
            f"to {lam.max():g}; raise the limit"
        )
    with np.errstate(divide="ignore", invalid="ignore"):  # a free plan fits infinitely often: +inf
        copies = np.where(budget > 0, budget / cost, -np.inf)
    return float(lam[int(np.argmax(copies))])


def rdp_at_lower_order(rdp: float, *, recorded_order: float, order: float) -> float:
    """A worst-case RDP recorded at ``recorded_order``, restated at ``order``.

    Sound only downwards: ``D_λ`` is non-decreasing in λ (van Erven & Harremoës 2014, Theorem 3), so a bound
    at λ_r bounds every λ ≤ λ_r; above λ_r nothing follows from it.

    Raises:
        InputError: ``order`` is above ``recorded_order``, or an argument is invalid.

    Example:
        >>> rdp_at_lower_order(3.5, recorded_order=10.0, order=4.0)
        3.5
    """
    value = non_negative("rdp", rdp)
    recorded, target = float(as_orders(recorded_order)), float(as_orders(order))
    if target > recorded:
        raise InputError(
            f"an RDP of {value:.6g} recorded at order {recorded:g} bounds nothing at the higher order "
            f"{target:g} (Rényi divergence grows with its order); state the charge at order {target:g} from "
            "its mechanism, or keep the ledger at an order ≤ the recorded one"
        )
    return value
