"""What a Confident-GNMax run costs, and how much a budget buys: ``capc budget estimate`` and ``plan``.

Both use the data-independent accounting the federation charges (:class:`ConfidentGNMaxAccountant`):
exact screening for every query plus ``λ/σ2²`` per answer, converted with the improved conversion.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.accountant import ConfidentGNMaxAccountant
from capc_common.privacy.analysis import (
    DEFAULT_ORDERS,
    as_orders,
    epsilon_at_order,
    epsilon_from_rdp,
    rdp_budget_curve,
    rdp_threshold_gaussian,
)
from capc_common.privacy.analysis._checks import count, positive, probability

__all__ = ["estimate", "plan"]

#: Answer rates ``capc budget plan`` tabulates besides the one asked for.
PLAN_RATES = (0.1, 0.25, 0.5, 0.75, 1.0)


def estimate(
    *,
    teachers: int,
    classes: int,
    sigma1: float,
    sigma2: float,
    threshold: float,
    queries: int,
    answered: int | None = None,
    delta: float,
    orders: npt.ArrayLike = DEFAULT_ORDERS,
    noise: str = "discrete",
) -> dict[str, Any]:
    """ε of ``queries`` screened queries of which ``answered`` (default: all) were answered.

    Args:
        teachers: votes per query.
        classes: number of classes.
        sigma1: σ1 of the screening noise.
        sigma2: σ2 of the argmax noise.
        threshold: T.
        queries: queries screened.
        answered: queries answered (≤ queries); all of them when omitted (the worst case).
        delta: δ.
        orders: the orders to optimise over.
        noise: ``"discrete"`` (as deployed) or ``"continuous"``.

    Returns:
        ``{"epsilon", "epsilon_classic", "order", "order_classic", "delta", "queries", "answered",
        "noise", "parameters", "breakdown": {"screening": {...}, "gnmax": {...}}}``; each breakdown entry
        gives its RDP at the chosen order and the ε it would cost alone.
    """
    d = probability("delta", delta)
    lam = as_orders(orders).ravel()
    q = count("queries", queries)
    a = q if answered is None else count("answered", answered)
    accountant = ConfidentGNMaxAccountant(
        teachers=teachers, classes=classes, threshold=threshold, sigma1=sigma1, sigma2=sigma2, noise=noise
    )
    accountant.step(queries=q, answered=a)
    total = accountant.rdp(lam)
    eps, order = epsilon_from_rdp(lam, total, delta=d)
    eps_classic, order_classic = epsilon_from_rdp(lam, total, delta=d, method="classic")
    at = int(np.flatnonzero(lam == order)[0])
    screening = q * accountant.query_rdp(lam)
    gnmax = a * accountant.answer_rdp(lam)
    gaussian = q * rdp_threshold_gaussian(lam, sigma1=accountant.sigma1)

    def alone(curve: npt.NDArray[np.float64]) -> float:
        return epsilon_from_rdp(lam, curve, delta=d)[0]

    return {
        "epsilon": eps,
        "epsilon_classic": eps_classic,
        "order": order,
        "order_classic": order_classic,
        "delta": d,
        "queries": q,
        "answered": a,
        "noise": noise,
        "parameters": accountant.params(),
        "breakdown": {
            "screening": {
                "rdp_at_order": float(screening[at]),
                "rdp_per_query": float(accountant.query_rdp(lam)[at]),
                "gaussian_bound_rdp_per_query": float(gaussian[at] / q) if q else 0.0,
                "epsilon_alone": alone(screening),
                "epsilon_alone_with_gaussian_bound": alone(gaussian),
            },
            "gnmax": {
                "rdp_at_order": float(gnmax[at]),
                "rdp_per_answer": float(accountant.answer_rdp(lam)[at]),
                "epsilon_alone": alone(gnmax),
            },
        },
    }


def plan(
    *,
    teachers: int,
    classes: int,
    sigma1: float,
    sigma2: float,
    threshold: float,
    epsilon: float,
    delta: float,
    answer_rate: float = 1.0,
    orders: npt.ArrayLike = DEFAULT_ORDERS,
    noise: str = "discrete",
) -> dict[str, Any]:
    """How many queries and answers an (ε, δ) budget buys, and the Rényi-filter order to fix.

    For each order λ the filter's budget is ``B(λ)`` (the RDP that converts to ε); with a fraction ``r`` of
    queries answered a query costs ``s(λ) + r·g(λ)``, so ``⌊B/(s + r·g)⌋`` queries fit. The order that fits
    the most queries at the expected ``answer_rate`` is the one to create the ledger with.

    Args:
        teachers, classes, sigma1, sigma2, threshold, noise: the mechanism (as :func:`estimate`).
        epsilon: target ε.
        delta: δ.
        answer_rate: expected fraction of queries that pass screening (1.0 plans for the worst case).
        orders: candidate orders.

    Returns:
        ``{"order", "queries", "answered", "queries_all_answered", "queries_none_answered", "budget_rdp",
        "rdp_per_query", "rdp_per_answer", "epsilon", "delta", "answer_rate", "epsilon_used", "rates":
        [{"answer_rate", "order", "queries", "answered"}, ...]}``.

    Raises:
        InputError: the budget cannot pay for a single query at any order.
    """
    eps = positive("epsilon", epsilon)
    d = probability("delta", delta)
    rate = positive("answer_rate", answer_rate)
    if rate > 1:
        raise InputError(f"answer_rate is a fraction of queries in (0, 1], got {answer_rate!r}")
    lam = as_orders(orders).ravel()
    accountant = ConfidentGNMaxAccountant(
        teachers=teachers, classes=classes, threshold=threshold, sigma1=sigma1, sigma2=sigma2, noise=noise
    )
    budget = rdp_budget_curve(lam, epsilon=eps, delta=d)
    per_query = accountant.query_rdp(lam)
    per_answer = accountant.answer_rdp(lam)

    def capacity(r: float) -> tuple[int, int]:
        with np.errstate(divide="ignore", invalid="ignore"):
            fits = np.where(budget > 0, np.floor(budget / (per_query + r * per_answer)), -1.0)
        best = int(np.argmax(fits))
        return best, int(fits[best])

    best, queries = capacity(rate)
    if queries < 1:
        raise InputError(
            f"(ε={eps:g}, δ={d:g}) does not pay for a single query with σ1={sigma1:g}, σ2={sigma2:g}; "
            "raise ε or the noise"
        )
    answered = math.floor(rate * queries)
    used = accountant.cost(lam[best : best + 1], queries=queries, answered=answered)
    rates = []
    for r in sorted({*PLAN_RATES, rate}):
        i, n = capacity(r)
        rates.append({"answer_rate": r, "order": float(lam[i]), "queries": n, "answered": math.floor(r * n)})
    return {
        "epsilon": eps,
        "delta": d,
        "answer_rate": rate,
        "order": float(lam[best]),
        "queries": queries,
        "answered": answered,
        "queries_all_answered": int(budget[best] // (per_query[best] + per_answer[best])),
        "queries_none_answered": int(budget[best] // per_query[best]) if per_query[best] > 0 else None,
        "budget_rdp": float(budget[best]),
        "rdp_per_query": float(per_query[best]),
        "rdp_per_answer": float(per_answer[best]),
        "epsilon_used": max(0.0, float(epsilon_at_order(lam[best], used[0], delta=d))),
        "noise": noise,
        "parameters": accountant.params(),
        "rates": rates,
    }
