"""The Rényi filter (Feldman & Zrnic 2021, "Individual Privacy Accounting via a Rényi Filter").

A filter fixes one order λ and a budget ``B`` in RDP units and admits a charge only while the running total
stays ≤ B. Feldman & Zrnic show the adaptive composition of everything admitted is (λ, B)-RDP even when each
charge is chosen after seeing earlier outputs (here: how many queries of a batch were answered), so the
improved conversion (CKS 2020, Prop. 12) turns it into (ε, δ)-DP. ``B`` is the largest RDP whose conversion
at λ stays within the (ε, δ) the filter was created for.

:class:`RenyiFilter` is the in-memory version (central runs);
:class:`~capc_common.privacy.ledger.BudgetLedger` applies the same rule durably, on integers, across
processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from capc_common.errors import BudgetExhaustedError
from capc_common.privacy.analysis import epsilon_at_order, rdp_budget_at_order
from capc_common.privacy.analysis._checks import non_negative, probability

__all__ = ["RenyiFilter", "refusal_message"]


def refusal_message(
    *, what: str, requested: float, remaining: float, order: float, epsilon: float, delta: float
) -> str:
    """The message of a refused charge: what was asked, what remains, by how much it falls short, the fix."""
    return (
        f"privacy budget exhausted: {what} needs RDP {requested:.6g} at order {order:g} but only "
        f"{max(remaining, 0.0):.6g} remains of the (ε={epsilon:g}, δ={delta:g}) budget; short by "
        f"{requested - max(remaining, 0.0):.6g}. Nothing was charged. Send a smaller batch, or start a new "
        f"ledger with a larger budget."
    )


@dataclass
class RenyiFilter:
    """A Rényi filter at a fixed order: admits charges while their RDP sum stays within the budget.

    Build it with :meth:`for_budget`. The only state is the list of admitted charges.

    Attributes:
        order: the fixed order λ.
        epsilon: the ε the filter guarantees (with ``delta``).
        delta: δ.
        budget_rdp: ``B``, the RDP at ``order`` that converts to exactly ``epsilon``.
        charges: the admitted charges, in order.
    """

    order: float
    epsilon: float
    delta: float
    budget_rdp: float
    charges: list[float] = field(default_factory=list)

    @classmethod
    def for_budget(cls, *, epsilon: float, delta: float, order: float) -> RenyiFilter:
        """A fresh filter guaranteeing (ε, δ)-DP at ``order`` with the improved conversion.

        Raises:
            InputError: (ε, δ) cannot be met at this order.
        """
        eps = non_negative("epsilon", epsilon)
        d = probability("delta", delta)
        budget = rdp_budget_at_order(epsilon=eps, delta=d, order=order)
        return cls(order=float(order), epsilon=eps, delta=d, budget_rdp=budget)

    @property
    def spent_rdp(self) -> float:
        """RDP admitted so far (``math.fsum`` of the charges)."""
        return math.fsum(self.charges)

    @property
    def remaining_rdp(self) -> float:
        """RDP still available."""
        return self.budget_rdp - self.spent_rdp

    def epsilon_of(self, rdp: float) -> float:
        """ε at δ of an RDP total at the filter's order (improved conversion).

        Zero RDP (nothing released) is 0; any positive total costs at least the conversion's fixed term
        ``log(1 - 1/λ) - log(δλ)/(λ-1)`` at the filter's order.
        """
        if rdp <= 0:
            return 0.0
        return max(0.0, float(epsilon_at_order(self.order, rdp, delta=self.delta)))

    @property
    def epsilon_spent(self) -> float:
        """ε of what has been admitted."""
        return self.epsilon_of(self.spent_rdp)

    def charge(self, rdp: float, *, what: str = "charge") -> None:
        """Admit ``rdp`` if it fits, else refuse it and change nothing.

        Raises:
            InputError: ``rdp`` is negative or not finite.
            BudgetExhaustedError: the charge would cross the budget (the message gives the requested and
                remaining RDP and their difference).
        """
        cost = non_negative("rdp", rdp)
        if self.spent_rdp + cost > self.budget_rdp:
            raise BudgetExhaustedError(
                refusal_message(
                    what=what,
                    requested=cost,
                    remaining=self.remaining_rdp,
                    order=self.order,
                    epsilon=self.epsilon,
                    delta=self.delta,
                )
            )
        self.charges.append(cost)
