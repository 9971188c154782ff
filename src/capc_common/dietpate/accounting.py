"""The central run's privacy budget from its config sections: :func:`make_budget` builds the configured
mechanism and plans its Rényi-filter budget with :func:`capc_common.privacy.budget.plan_budget`, the budget
every central runner of a selection mechanism charges (see there for the accounting)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capc_common.privacy.budget import RunBudget, plan_budget

if TYPE_CHECKING:
    from capc_common.dietpate.config import BudgetSection, MechanismSection

__all__ = ["make_budget"]


def make_budget(
    mechanism: MechanismSection, budget: BudgetSection, *, teachers: int, classes: int, smallest_batch: int
) -> RunBudget:
    """Build the run's budget from its config sections (:func:`plan_budget` on the configured mechanism).

    Raises:
        InputError: the budget cannot pay for even one batch of ``smallest_batch`` queries.
    """
    return plan_budget(
        mechanism.build(teachers=teachers, classes=classes),
        epsilon=budget.epsilon,
        delta=budget.delta,
        order=budget.order,
        expected_answer_rate=budget.expected_answer_rate,
        smallest_batch=smallest_batch,
    )
