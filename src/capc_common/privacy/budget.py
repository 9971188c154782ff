"""A run's privacy budget: a Rényi filter charged exactly like the federation's guardian, for any selection
mechanism (:func:`plan_budget`).

Rigorous, data-independent accounting (DESIGN §4): every screened query pays the mechanism's screening cost,
every answered query its cost per answer (GNMax ``λ/σ2²``; LNMax the RDP of pure ``2/b``-DP). Charges go into
a :class:`~capc_common.privacy.RenyiFilter` at one order fixed before the first query, so stopping on the
budget after seeing how many queries were answered is still covered (Feldman & Zrnic 2021). As the guardian
does, a batch is admitted only if its *worst case* (every query answered) fits, and is then charged in one
charge for its screening plus its actual answers — never more than the worst case, to the last bit
(:meth:`RunBudget.worst_case` is ``actual(count, count)``). With ``order: auto`` the order is the one
``capc budget plan`` would fix.

Every central runner of a selection mechanism charges through this one budget: the central DIET-PATE pipeline
(``capc dietpate run``, :func:`capc_common.dietpate.make_budget`) and Prom-PATE
(:func:`capc_common.mechanisms.answer_within_budget`). It sits below both: it needs only a mechanism's
:meth:`costs` and :meth:`data_dependent` (:class:`CostedMechanism`).

The PATE-2018 data-dependent ε is tracked alongside for research comparisons only; it depends on the private
histograms and is reported as *unsanitised*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.accountant import DataDependentPATEAccountant
from capc_common.privacy.analysis import DEFAULT_ORDERS, rdp_budget_curve
from capc_common.privacy.filter import RenyiFilter

__all__ = ["CostedMechanism", "RunBudget", "plan_budget"]


class CostedMechanism(Protocol):
    """What a budget needs of a selection mechanism (:class:`capc_common.mechanisms.SelectionMechanism`)."""

    def costs(self, orders: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Data-independent RDP at each order of one screened query and of one answered query."""
        ...

    def data_dependent(self) -> DataDependentPATEAccountant | None:
        """A PATE-2018 data-dependent accountant (UNSANITISED), or None."""
        ...


@dataclass
class RunBudget:
    """The filter plus the per-query and per-answer charges at its order, and the unsanitised tracker.

    Attributes:
        filter: the Rényi filter (order, budget, admitted charges).
        query_rdp: RDP of screening one query at the filter's order.
        answer_rdp: RDP of one answer at the filter's order.
        data_dependent: PATE-2018 data-dependent accountant, or ``None`` for LNMax.
        queries: queries screened so far.
        answered: queries answered so far.
    """

    filter: RenyiFilter
    query_rdp: float
    answer_rdp: float
    data_dependent: DataDependentPATEAccountant | None
    queries: int = 0
    answered: int = 0

    def actual(self, count: int, answered: int) -> float:
        """RDP of a batch of ``count`` screened queries of which ``answered`` were answered.

        Non-decreasing in ``answered`` also in floating point (``answered · a`` and the sum are monotone
        roundings), so no outcome costs more than :meth:`worst_case`.
        """
        return count * self.query_rdp + answered * self.answer_rdp

    def worst_case(self, count: int) -> float:
        """RDP of a batch of ``count`` queries if every one were answered: exactly ``actual(count, count)``.

        Never ``count · (q + a)``: that rounds differently, and a reservation one ulp below the all-answered
        cost would refuse exactly the batches whose queries all passed, after their labels were released —
        a data-dependent failure (the federation's ``BatchCosts`` had the same bug, fixed in 6434fd1).
        """
        return self.actual(count, count)

    def fits(self, count: int) -> bool:
        """Whether a batch of ``count`` queries may start: its worst case fits what remains.

        The test is the filter's own admission test (``spent + cost ≤ budget``), so whatever a started batch
        turns out to cost, :meth:`charge` admits it.
        """
        return self.filter.spent_rdp + self.worst_case(count) <= self.filter.budget_rdp

    def charge(self, histograms: npt.NDArray[np.int64], answered: npt.NDArray[np.bool_]) -> None:
        """Charge a batch in one filter charge: screening for every query, an answer per answered one."""
        count = int(histograms.shape[0])
        n_answered = int(answered.sum())
        self.filter.charge(
            self.actual(count, n_answered), what=f"batch of {count} queries, {n_answered} answered"
        )
        self.queries += count
        self.answered += n_answered
        if self.data_dependent is not None:
            self.data_dependent.step(histograms, answered=answered)

    @property
    def epsilon(self) -> float:
        """ε of the charges admitted so far (data-independent charges, at the filter's order, improved
        conversion): the odometer. The run's guarantee is the filter's limit, ``budget.epsilon``."""
        return self.filter.epsilon_spent

    def epsilon_data_dependent(self, delta: float) -> float | None:
        """PATE-2018 data-dependent ε (best order), UNSANITISED; ``None`` when not tracked or no query."""
        if self.data_dependent is None or self.queries == 0:
            return None
        return float(self.data_dependent.get_epsilon(delta=delta)[0])

    def summary(self) -> dict[str, Any]:
        """Figures for the report."""
        return {
            "order": self.filter.order,
            "budget_rdp": self.filter.budget_rdp,
            "spent_rdp": self.filter.spent_rdp,
            "rdp_per_query": self.query_rdp,
            "rdp_per_answer": self.answer_rdp,
        }


def plan_budget(
    mechanism: CostedMechanism,
    *,
    epsilon: float,
    delta: float,
    order: float | str = "auto",
    expected_answer_rate: float = 0.3,
    smallest_batch: int,
) -> RunBudget:
    """A budget for any selection mechanism; with ``order: auto`` pick the order that fits the most queries.

    The filter's budget at each order is :func:`~capc_common.privacy.analysis.rdp_budget_curve`, and the
    automatic order is the one that buys the most whole queries, ``⌊B(λ) / (query(λ) + r · answer(λ))⌋``, at
    the ``expected_answer_rate`` r (a public planning assumption, not a data-dependent choice) — the rule of
    :func:`capc_common.privacy.plan` (``capc budget plan``), applied to every mechanism, so a
    Confident-GNMax run fixes the order a federation's ledger would be created with. Every central runner of
    a selection mechanism (``capc dietpate run``, Prom-PATE) charges through this one budget.

    Raises:
        InputError: the budget cannot pay for even one batch of ``smallest_batch`` queries.
    """
    orders = np.asarray(DEFAULT_ORDERS, dtype=np.float64).ravel()
    if order != "auto":
        orders = np.array([float(order)])
    per_query, per_answer = mechanism.costs(orders)
    budgets = rdp_budget_curve(orders, epsilon=epsilon, delta=delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        capacity = np.where(
            budgets > 0, np.floor(budgets / (per_query + expected_answer_rate * per_answer)), -1.0
        )
    best = int(np.argmax(capacity))
    worst = smallest_batch * per_query[best] + smallest_batch * per_answer[best]
    if budgets[best] <= 0 or worst > budgets[best]:
        raise InputError(
            f"budget (ε={epsilon:g}, δ={delta:g}) is too small for a single batch of "
            f"{smallest_batch} queries: its worst case needs RDP {worst:.4g} at order {orders[best]:g} "
            f"but the budget is {max(float(budgets[best]), 0.0):.4g}; raise epsilon, raise sigma, or "
            "lower bn_batch"
        )
    chosen = float(orders[best])
    return RunBudget(
        filter=RenyiFilter.for_budget(epsilon=epsilon, delta=delta, order=chosen),
        query_rdp=float(per_query[best]),
        answer_rdp=float(per_answer[best]),
        data_dependent=mechanism.data_dependent(),
    )
