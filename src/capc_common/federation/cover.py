"""The local ε cap that covers a federation: what a teacher party's own worst-case cap must hold so that it
never stops the party before the federation's own limit stops the federation (DESIGN §4).

The two count differently. The guardian's ledger reserves a batch's worst case before it computes, then
settles it at its actual cost: every query's screening, GNMax only for the answered ones. A teacher party
never sees which queries were answered, so its cap charges every batch it votes on at the worst case (every
query answered). Covering a federation limited to ε therefore takes a cap above ε: the worst case of every
batch the ledger could admit. The most batches it can admit is when nothing is answered — each batch then
settles at its screening cost alone — while the next still needs its worst case free to be reserved. That
bound is data-independent; a cap at or above its ε never refuses a batch of the plan (a batch collected
again after a quorum abort is charged again, so leave headroom where parties drop out).

``capc local up`` gives its simulated hospitals this cap by default and ``capc teacher preflight`` checks a
site's cap against the same figure, so the two agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capc_common.federation.config import FederationConfig
from capc_common.federation.costs import batch_costs
from capc_common.federation.plan import usable_queries
from capc_common.privacy.analysis import rdp_budget_at_order

#: A covering cap is rounded up to this many decimals, so it reads as a plain figure in a site file.
_DECIMALS = 2


def plan_batches(config: FederationConfig) -> list[int]:
    """The sizes of the federation's batches, in stream order (every one full but perhaps the last)."""
    total, size = usable_queries(config), config.queries.batch_size
    return [min(size, total - first) for first in range(0, total, size)]


@dataclass(frozen=True)
class CapCover:
    """The local cap that covers a federation of the selection family.

    Attributes:
        plan_batches: batches of the federation's query stream.
        admissible_batches: the most of them its ledger's limit can admit (all, or fewer when the limit
            ends the stream first even with no query answered).
        rdp: the worst case of those batches at the federation's order (what a party's cap charges).
        epsilon: that at the federation's δ (improved conversion).
        cap: ``epsilon`` rounded up to a plain figure whose budget still holds ``rdp``: a site's
            ``cap.epsilon`` at least this covers the federation.
    """

    plan_batches: int
    admissible_batches: int
    rdp: float
    epsilon: float
    cap: float


def cap_cover(config: FederationConfig) -> CapCover:
    """The local cap that covers ``config``'s federation (see the module docstring for why).

    Raises:
        InputError: the federation runs a release mechanism (it has no query batches; a release's charge is
            fixed in advance), or its budget cannot be met at its order.
    """
    costs = batch_costs(config)
    b = config.budget
    limit = rdp_budget_at_order(epsilon=b.epsilon, delta=b.delta, order=b.order)
    sizes = plan_batches(config)
    floor = worst = 0.0
    admitted = 0
    for count in sizes:
        if floor + costs.worst_case(count) > limit:  # the ledger would refuse to reserve it
            break
        floor += costs.actual(count, 0)
        worst += costs.worst_case(count)
        admitted += 1
    epsilon = costs.epsilon(worst)
    step = 10.0**-_DECIMALS
    cap = max(step, math.ceil(epsilon / step) * step)
    while rdp_budget_at_order(epsilon=cap, delta=b.delta, order=b.order) < worst:  # a rounding hair
        cap += step
    return CapCover(
        plan_batches=len(sizes),
        admissible_batches=admitted,
        rdp=worst,
        epsilon=epsilon,
        cap=round(cap, _DECIMALS),
    )
