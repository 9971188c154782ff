"""What a batch costs in privacy, at the federation's fixed Rényi order (DESIGN §4).

Data-independent: every query pays the exact screening supremum, every answered query pays GNMax's
``λ/σ2²``. When a batch may proceed with a partial quorum, the fewest votes a query can receive is the heads
of the smallest quorum, and the screening supremum is taken over that wider range, so one per-query figure
is valid whichever parties take part. The guardian's ledger and every teacher party's local cap charge
exactly these figures; the federation's mechanism object (:func:`mechanism_of`) computes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from capc_common.errors import InputError
from capc_common.federation.config import FederationConfig, ReleaseMember, SelectionMember
from capc_common.mechanisms import SelectionMechanism
from capc_common.privacy.analysis import delta_with_sampler_distance, epsilon_at_order, rdp_budget_at_order


@dataclass(frozen=True)
class BatchCosts:
    """Per-query RDP figures of one federation and the arithmetic built on them.

    Attributes:
        order: the filter's fixed Rényi order λ.
        delta: the federation's δ.
        query_rdp: screening cost of one query at λ.
        answer_rdp: GNMax cost of one answered query at λ.
        params: the mechanism's public parameters (recorded with every ledger entry).
    """

    order: float
    delta: float
    query_rdp: float
    answer_rdp: float
    params: dict[str, Any]

    def worst_case(self, count: int) -> float:
        """RDP of a batch of ``count`` queries if all were answered (what is reserved before computing).

        Computed as ``actual(count, count)``, never as ``count · (q + a)``: the two round differently, and a
        reservation one ulp below the all-answered cost made the ledger refuse to settle exactly the batches
        whose queries all passed — a data-dependent failure that charged nothing.
        """
        return self.actual(count, count)

    def actual(self, count: int, answered: int) -> float:
        """RDP of a batch once its pass bits are known (non-decreasing in ``answered``, also in floats)."""
        return count * self.query_rdp + answered * self.answer_rdp

    def epsilon(self, rdp: float) -> float:
        """ε at the federation's δ of an RDP total at λ (improved conversion, never below 0)."""
        return max(0.0, float(epsilon_at_order(self.order, rdp, delta=self.delta)))


def smallest_quorum_heads(config: FederationConfig) -> int:
    """Fewest teacher heads that can vote on a batch: the ``min_parties`` smallest parties together."""
    heads = sorted(t.heads for t in config.teachers)
    return sum(heads[: config.quorum.min_parties])


def selection_config(config: FederationConfig) -> SelectionMember:
    """``federation.yaml``'s mechanism, which must be of the selection family (query batches, 2PC argmax).

    Raises:
        InputError: the federation runs a release mechanism (it has no query batches).
    """
    m = config.mechanism
    if isinstance(m, ReleaseMember):
        raise InputError(
            f"federation {config.name!r} runs the release mechanism {m.name!r}, which has no query batches "
            "or 2PC; its parties contribute noisy totals instead (capc_common.federation.releases)"
        )
    return m


def mechanism_of(config: FederationConfig) -> SelectionMechanism:
    """The federation's mechanism object, with the screening range widened to the smallest quorum."""
    fewest = smallest_quorum_heads(config)
    return selection_config(config).build(
        classes=config.classes,
        teachers=config.total_heads,
        min_teachers=None if fewest == config.total_heads else fewest,
    )


def batch_costs(config: FederationConfig) -> BatchCosts:
    """The per-query figures of ``config`` at its fixed order."""
    mechanism = mechanism_of(config)
    per_query, per_answer = mechanism.costs(np.array([config.budget.order], dtype=np.float64))
    return BatchCosts(
        order=config.budget.order,
        delta=config.budget.delta,
        query_rdp=float(per_query[0]),
        answer_rdp=float(per_answer[0]),
        params={**mechanism.params(), "order": config.budget.order},
    )


def check_batch_fits(config: FederationConfig) -> None:
    """Refuse a federation whose budget cannot pay for even one full batch's worst case.

    Raises:
        InputError: with the batch's worst case, the budget, and the largest batch that would fit.
    """
    costs = batch_costs(config)
    b = config.budget
    budget = rdp_budget_at_order(epsilon=b.epsilon, delta=b.delta, order=b.order)
    batch = config.queries.batch_size
    worst = costs.worst_case(batch)
    if worst > budget:
        per_query = costs.query_rdp + costs.answer_rdp
        fits = int(budget // per_query) // config.queries.bn_batch * config.queries.bn_batch
        smaller = f"use batches of at most {fits} queries" if fits else "no batch size fits"
        raise InputError(
            f"one batch of {batch} queries may cost up to RDP {worst:.4g} at order {b.order:g}, more than "
            f"the whole budget {budget:.4g} (ε={b.epsilon:g}, δ={b.delta:g}), so no batch could ever run; "
            f"raise {selection_config(config).noise_hint()} or budget.epsilon ({smaller})"
        )


def sampler_delta(config: FederationConfig) -> float:
    """What the table samplers' distance from the exact discrete Gaussian adds to the federation's δ.

    Every released output depends on at most ``c + 2`` noise values per query of the stream (the guardian's
    z1_g and ``c`` values of z2, the student's z1_s; ``c`` without screening), each drawn within the table's
    statistical distance
    (≤ 2^-90; the tail cut ≤ 2^-96 plus 128-bit rounding) of N_Z(0, σ²); a query index is released at most
    once. So the guarantee at ``budget.epsilon`` holds with δ + this
    (:func:`~capc_common.privacy.analysis.delta_with_sampler_distance`).
    """
    draws, eta = sampler_draws(config)
    return delta_with_sampler_distance(epsilon=config.budget.epsilon, draws=draws, distance=eta)


def sampler_draws(config: FederationConfig) -> tuple[int, float]:
    """The most noise values the federation's released outputs depend on, and each one's distance bound
    (what :func:`sampler_delta` adds to δ at the federation's ε; a hospital's lifetime adds them up)."""
    from capc_common.federation.plan import usable_queries
    from capc_common.privacy.noise import discrete_gaussian_table

    sigmas = selection_config(config).noise_sigmas()
    eta = max(discrete_gaussian_table(sigma=s).distance_bound for s in sigmas)
    return usable_queries(config) * (config.classes + 2), eta
