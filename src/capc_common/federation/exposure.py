"""What a federation may charge one hospital: the worst case of each charge its party records, at any order.

A teacher party charges its own records — its cap record in this federation, its site ledger across
federations — for every set of shares it hands out, at the worst case the federation's public parameters
allow, since it never sees which queries were answered (DESIGN §4): ``count`` queries of a selection
mechanism cost ``count · (screening + answer)``, one release of a release mechanism costs that release's
RDP. These figures are data-independent, so the mechanism states each of them exactly at *any* Rényi order:
a cap record and a site ledger each charge at the order they fixed when they were created, and neither
converts a figure from the federation's order (:mod:`capc_common.privacy.analysis.composition`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.federation.config import FederationConfig, ReleaseMember
from capc_common.federation.costs import batch_costs, mechanism_of, sampler_draws
from capc_common.federation.plan import plan_batches
from capc_common.privacy.analysis import as_orders, rdp_budget_at_order

if TYPE_CHECKING:
    from capc_common.federation.releases import ReleaseProtocol

#: One charge's worst-case RDP at each order: ``(count, orders) -> rdp``.
ChargeCurve = Callable[[int, npt.NDArray[np.float64]], npt.NDArray[np.float64]]


@dataclass(frozen=True)
class Exposure:
    """The charges one federation makes on a hospital's records.

    Build it with :func:`exposure_of`.

    Attributes:
        federation: the federation's name.
        kind: what its charges are, for messages: ``batches`` or ``releases``.
        stream: how many charges its plan makes (query batches, or releases).
        plan: the size of each charge its own limit can admit, in order: a selection federation's ledger may
            stop its stream before the end even if nothing is answered; every release of a release plan fits
            (:func:`~capc_common.federation.releases.protocol_for` refuses one that does not).
        cost: one charge's worst-case RDP at each order.
        sampler_tv: how far, in total variation, everything the federation releases may be from what exact
            discrete Gaussian noise would give (noise values × each one's table bound): what its sampler adds
            to δ, times ``1 + e^ε`` at the ε it is stated at
            (:func:`~capc_common.privacy.analysis.delta_with_sampler_distance`).
    """

    federation: str
    kind: str
    stream: int
    plan: tuple[int, ...]
    cost: ChargeCurve
    sampler_tv: float

    def rdp(self, count: int, order: float) -> float:
        """Worst-case RDP at ``order`` of one charge of ``count`` queries (a release: whatever ``count``)."""
        return float(self.cost(count, np.array([float(as_orders(order))]))[0])

    def plan_curve(self, orders: npt.ArrayLike, *, charges: int | None = None) -> npt.NDArray[np.float64]:
        """Worst-case RDP at each of ``orders`` of the plan's first ``charges`` charges (all by default)."""
        lam = as_orders(orders).ravel()
        return np.sum([self.cost(c, lam) for c in self.plan[:charges]] or [np.zeros_like(lam)], axis=0)

    def admitted(
        self, *, epsilon: float, delta: float, order: float, spent_rdp: float = 0.0, answered: int = 0
    ) -> int:
        """How many of the plan's charges after its first ``answered`` a Rényi filter of (ε, δ) at ``order``
        admits after ``spent_rdp`` (what a cap record admits: the same arithmetic, charge by charge).

        Raises:
            InputError: (ε, δ) cannot be met at ``order``.
        """
        budget = rdp_budget_at_order(epsilon=epsilon, delta=delta, order=order)
        # The exact running sum: ``float`` of it is correctly rounded, as ``math.fsum`` of every charge so far
        # is, at one addition per charge — fsum over the growing list made this quadratic (a plan of 50,000
        # batches took 90 s per cap, and the guardian checks every declared cap before it serves).
        total = Fraction(spent_rdp) if spent_rdp > 0 else Fraction(0)
        cost: dict[int, Fraction] = {}  # a plan's charges come in a few sizes
        rest = self.plan[answered:]
        for admitted, count in enumerate(rest):
            if count not in cost:
                cost[count] = Fraction(self.rdp(count, order))
            total += cost[count]
            if float(total) > budget:
                return admitted
        return len(rest)

    def planned_rdp(self, *, cap_epsilon: float, cap_order: float, delta: float, order: float) -> float:
        """Worst-case RDP at ``order`` of every charge of the plan that a cap of ``cap_epsilon`` (at δ and
        ``cap_order``) admits from the start: the most this federation may charge the hospital by its plan.

        Raises:
            InputError: the cap cannot be met at ``cap_order``.
        """
        charges = self.admitted(epsilon=cap_epsilon, delta=delta, order=cap_order)
        return math.fsum(self.rdp(count, order) for count in self.plan[:charges])


def exposure_of(config: FederationConfig, *, protocol: ReleaseProtocol | None = None) -> Exposure:
    """The charges ``config``'s federation makes on each hospital.

    Args:
        config: the federation.
        protocol: its release protocol, for a release mechanism (what a release costs comes from it).

    Raises:
        InputError: a release federation without its protocol.
    """
    if isinstance(config.mechanism, ReleaseMember):
        if protocol is None:
            raise InputError(
                f"federation {config.name!r} runs the release mechanism {config.mechanism.name!r}: what it "
                "charges comes from its release protocol (check_runnable builds it)"
            )
        per_release = _per_orders(lambda lam: (np.zeros_like(lam), protocol.mechanism.release_rdp(lam)))

        def release(_count: int, orders: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            return per_release(orders)[1]  # every release costs the same, whatever its size

        rounds, (draws, eta) = protocol.rounds, protocol.sampler_draws()
        return Exposure(
            federation=config.name,
            kind="releases",
            stream=rounds,
            plan=(1,) * rounds,
            cost=release,
            sampler_tv=draws * eta,
        )
    per_query = _per_orders(mechanism_of(config).costs)

    def batch(count: int, orders: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        query, answer = per_query(orders)
        return count * query + count * answer  # as BatchCosts.worst_case: count·(q + a) rounds differently

    sizes, (draws, eta) = plan_batches(config), sampler_draws(config)
    return Exposure(
        federation=config.name,
        kind="batches",
        stream=len(sizes),
        plan=_admissible(config, sizes),
        cost=batch,
        sampler_tv=draws * eta,
    )


def _per_orders(curve: Callable[[npt.NDArray[np.float64]], Any]) -> Callable[[npt.NDArray[np.float64]], Any]:
    """``curve`` computed once per array of orders: a record charges every batch at the same order, a plan is
    summed over its charges at the same grid, and the screening's exact divergence is a scan worth not
    repeating."""

    @functools.lru_cache(maxsize=32)
    def cached(key: bytes) -> Any:
        return curve(np.frombuffer(key, dtype=np.float64))

    def at(orders: npt.NDArray[np.float64]) -> Any:
        return cached(np.ascontiguousarray(orders, dtype=np.float64).tobytes())

    return at


def _admissible(config: FederationConfig, sizes: list[int]) -> tuple[int, ...]:
    """The batches of the stream the federation's ledger can admit: the most is when nothing is answered (each
    batch then settles at its screening cost) while the next still needs its worst case free to be
    reserved — a data-independent bound on how many batches any run can have."""
    costs = batch_costs(config)
    b = config.budget
    limit = rdp_budget_at_order(epsilon=b.epsilon, delta=b.delta, order=b.order)
    floor = 0.0
    for admitted, count in enumerate(sizes):
        if floor + costs.worst_case(count) > limit:  # the ledger would refuse to reserve it
            return tuple(sizes[:admitted])
        floor += costs.actual(count, 0)
    return tuple(sizes)
