"""The local ε cap that covers a federation: what a teacher party's own worst-case cap must hold so that it
never stops the party before the federation's own limit stops the federation (DESIGN §4).

The two count differently. The guardian's ledger reserves a batch's worst case before it computes, then
settles it at its actual cost: every query's screening, the answer's cost only for the answered ones. A
teacher party never sees which queries were answered, so its cap charges every batch it votes on at the
worst case (every query answered). Covering a federation limited to ε therefore takes a cap above ε: the
worst case of every batch the ledger could admit (:attr:`~capc_common.federation.exposure.Exposure.plan`).
That bound is data-independent; a cap at or above it never refuses a batch of the plan (a batch collected
again after a quorum abort is charged again, so leave headroom where parties drop out).

**The cap's own order.** A cap record is a Rényi filter of its own, and the order it charges at is fixed
when it is created: nothing ties it to the federation's order, which was chosen for the federation's ε and
for charges settled at their actual cost. A worst case summed over a whole plan costs the least ε at a lower
order — the shipped ε 10 federation's plan costs ε 91.7 at the federation's order 10, ε 28.2 at order 2.1.
A new record therefore charges at :func:`cap_order`, the order at which the plan's worst case costs least;
a record created before it said which order it charges at stays at the federation's.

``capc local up`` gives its simulated hospitals this cap by default and ``capc teacher preflight`` checks a
site's cap against the same figure, so the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from capc_common.federation.exposure import Exposure
from capc_common.privacy.analysis import DEFAULT_ORDERS, epsilon_at_order, epsilon_from_rdp, epsilon_holding


@dataclass(frozen=True)
class CapCover:
    """The local cap that covers a federation.

    Attributes:
        plan_batches: charges of the federation's plan (query batches, or releases).
        admissible_batches: the most of them its ledger's limit can admit (all, or fewer when the limit
            ends the stream first even with no query answered).
        order: the Rényi order the cap charges at.
        rdp: the worst case of those charges at ``order`` (what a party's cap charges).
        epsilon: that at the federation's δ (improved conversion).
        cap: ``epsilon`` rounded up to a plain figure whose budget still holds ``rdp``: a site's
            ``cap.epsilon`` at least this covers the federation.
        kind: what the charges are (``batches`` or ``releases``), for messages.
    """

    plan_batches: int
    admissible_batches: int
    order: float
    rdp: float
    epsilon: float
    cap: float
    kind: str


def cap_order(exposure: Exposure, *, delta: float) -> float:
    """The order at which the worst case of the whole plan costs the least ε (on the default grid): the order
    a new cap record charges at (fixed before any charge, from public parameters only)."""
    _, order = epsilon_from_rdp(DEFAULT_ORDERS, exposure.plan_curve(DEFAULT_ORDERS), delta=delta)
    return order


def cap_cover(exposure: Exposure, *, delta: float, order: float | None = None) -> CapCover:
    """The local cap that covers ``exposure``'s federation at ``order`` (None: :func:`cap_order`).

    Raises:
        InputError: an invalid order or δ.
    """
    lam = cap_order(exposure, delta=delta) if order is None else float(order)
    worst = float(exposure.plan_curve([lam])[0])
    return CapCover(
        plan_batches=exposure.stream,
        admissible_batches=len(exposure.plan),
        order=lam,
        rdp=worst,
        epsilon=max(0.0, float(epsilon_at_order(lam, worst, delta=delta))),
        cap=epsilon_holding(worst, delta=delta, order=lam),
        kind=exposure.kind,
    )


def why_above(cover: CapCover, *, federation_epsilon: float) -> str:
    """Why a cap must be set to ``cover.cap`` beside a federation of ``federation_epsilon``, for a person.

    Both figures are (ε, δ) at the federation's δ; they differ because they count different things.
    """
    head = (
        f"covering this federation takes a cap of ε {cover.cap:g} (at the cap record's order {cover.order:g})"
    )
    if cover.cap <= federation_epsilon and cover.kind == "releases":
        return f"{head}, within its limit ε {federation_epsilon:g}: every release it plans is charged alike"
    if cover.cap <= federation_epsilon:
        return (
            f"{head}, within its limit ε {federation_epsilon:g}: its {cover.admissible_batches} planned "
            f"{cover.kind} cost that much even if every query of them were answered"
        )
    return (
        f"{head}, above its limit ε {federation_epsilon:g}: the cap charges every query this hospital votes "
        "on as if it were answered, since it never sees which were, while the federation's ledger charges "
        "the answer only for the answered queries"
    )
