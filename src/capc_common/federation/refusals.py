"""Refuse before spending: a federation that can buy nothing with its privacy is stopped before the first
charge (DESIGN §8), with the reason and the parameter to change.

Every check here reads public quantities only — ``federation.yaml`` (heads, ``bn_batch``, the mechanism's
parameters) and each party's number of examples, which is public by design (the figure its heads are
planned from, docs/threat-model.md) — never the data itself: a refusal is post-processing of what is already
public, so it costs no ε and reveals nothing more. In particular no check reads *which* heads abstain once
trained: that set is a function of which examples hash to which shard, and letting it switch a federation
(or a party) between running and refusing would let one example decide it (docs/privacy.md, "Refusing
before spending").

A check returns a :class:`Refusal` or None; :data:`PRE_SPEND_CHECKS` lists them, and every front end
(``capc local up``, ``capc teacher preflight``, the guardian before it reserves a batch) runs the same list
through :func:`pre_spend_refusals`, so one more check is one more entry. A refusal is ``certain`` when the
federation can learn nothing whatever happens (``--force`` cannot override it) and a judgement otherwise
(``--force "REASON"`` overrides it, and the reason is recorded).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from capc_common.errors import InputError, PreconditionError
from capc_common.federation.config import FederationConfig, ReleaseMember
from capc_common.federation.costs import mechanism_of
from capc_common.federation.cover import cap_cover, cap_order, why_above
from capc_common.federation.exposure import exposure_of
from capc_common.federation.sizing import examples_for, heads_for

__all__ = [
    "FIELD_NAMES",
    "PRE_SPEND_CHECKS",
    "Change",
    "Refusal",
    "SpendPlan",
    "abstaining_parties",
    "below_alone",
    "enforce",
    "expected_voting_heads",
    "pre_spend_refusals",
    "uncovered_caps",
    "unreachable_threshold",
]

#: Below this many expected voting heads a party is not expected to hold even one head that votes: all its
#: heads abstain with probability at least ``1 − E[V]`` (the union bound), and on average less than one head's
#: knowledge is bought with its whole charge. It is a judgement, not "they all abstain more often than not":
#: near the boundary they all abstain less often than that (25 heads over 1,260 examples, chunks of 64:
#: E[V] = 0.83, every head abstains in 39 % of multinomial draws).
MIN_VOTING_HEADS = 1.0
#: Below this chance that a query on which every head that can vote agrees passes the screening, the budget
#: goes on screening queries that are almost never answered.
MIN_PASS_PROBABILITY = 0.01

#: How the parameters a :class:`Change` names are spelled in ``federation.yaml`` (front ends that take
#: flags pass their own spelling to :meth:`Refusal.text`).
FIELD_NAMES: Mapping[str, str] = {
    "budget.epsilon": "budget.epsilon",
    "teachers.heads": "teachers[].heads",
    "teachers.examples": "the party's examples (teachers[].examples, data.fraction at its site)",
    "teachers.cap": "the party's cap (teachers[].cap, and cap.epsilon in its site file)",
    "queries.bn_batch": "queries.bn_batch",
    "mechanism.threshold": "mechanism.threshold",
}


@dataclass(frozen=True)
class Change:
    """One way out of a refusal: ``verb`` the parameter ``field`` to ``value``.

    Attributes:
        field: the parameter, as a ``federation.yaml`` path (a key of :data:`FIELD_NAMES`).
        verb: ``lower`` or ``raise``.
        value: the value that makes the check pass.
    """

    field: str
    verb: Literal["lower", "raise"]
    value: float

    def text(self, names: Mapping[str, str]) -> str:
        """``lower --teachers-per-party to 10``: the change in the front end's spelling."""
        return f"{self.verb} {names.get(self.field, self.field)} to {self.value:,g}"


@dataclass(frozen=True)
class Refusal:
    """Why a federation would spend privacy for nothing, and how to change that.

    Attributes:
        check: a stable name (``heads-abstain``, ``threshold-unreachable``).
        reason: what would happen, with the figures.
        changes: each a way out (any one of them suffices).
        certain: the federation can learn nothing whatever the data: ``--force`` cannot override it.
    """

    check: str
    reason: str
    changes: tuple[Change, ...] = ()
    certain: bool = False

    def fix(self, names: Mapping[str, str] = FIELD_NAMES) -> str:
        """The ways out, in the front end's spelling of the parameters ('' when there is none)."""
        return ", or ".join(change.text(names) for change in self.changes)

    def text(self, names: Mapping[str, str] = FIELD_NAMES) -> str:
        """The reason and the ways out, in the front end's spelling of the parameters."""
        fix = self.fix(names)
        return self.reason + (f"; to fix it, {fix}" if fix else "")


@dataclass(frozen=True)
class SpendPlan:
    """What the checks look at: the federation and each party's number of examples.

    Attributes:
        config: the federation.
        examples: party → its number of examples (declared in ``federation.yaml``, planned by ``capc local
            up``, or a site's own count at its preflight); a party missing here is not judged on it.
    """

    config: FederationConfig
    examples: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def declared(cls, config: FederationConfig, own: Mapping[str, int] | None = None) -> SpendPlan:
        """The plan from ``federation.yaml``'s declared examples, with ``own`` (a site's own count) laid
        over them."""
        known = {t.name: t.examples for t in config.teachers if t.examples is not None}
        return cls(config=config, examples={**known, **(own or {})})


def expected_voting_heads(examples: int, heads: int, *, bn_batch: int) -> float:
    """How many of a party's ``heads`` hash shards of its ``examples`` hold one BatchNorm chunk, on average.

    A head whose shard is shorter than ``bn_batch`` abstains (docs/privacy.md §2); under the keyed content
    hash each example lands in one of ``heads`` shards alike, so a shard's size is Binomial(examples,
    1/heads) and the mean count of voting heads is ``heads · P(size ≥ bn_batch)``. By the union bound it is
    also at least the probability that *any* head votes: every head abstains with probability at least
    ``1 − expected_voting_heads``.
    """
    if examples < bn_batch:
        return 0.0
    return heads * _at_least(bn_batch, examples, 1.0 / heads)


def _at_least(least: int, trials: int, p: float) -> float:
    """``P(Binomial(trials, p) ≥ least)``, by summing the smaller tail's terms outward from ``least`` (each
    from ``lgamma``) until they no longer count. Pure Python: the guardian runs this before it is ready, and
    ``scipy.special`` alone costs it 0.15 s (it loads at the first charge instead)."""
    if least <= 0:
        return 1.0
    if least > trials:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n = math.lgamma(trials + 1)

    def term(k: int) -> float:
        return math.exp(
            log_n - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p + (trials - k) * log_q
        )

    upper = least > trials * p  # the tail that does not hold the mean is the small one: sum that
    k, step, total = (least, 1, 0.0) if upper else (least - 1, -1, 0.0)
    while 0 <= k <= trials:  # past the mode the terms only shrink: once one is 0.0, so is every later one
        t = term(k)
        total += t
        if t <= 1e-17 * total:
            break
        k += step
    return min(1.0, total) if upper else max(0.0, 1.0 - total)


def _votes_heads(config: FederationConfig) -> bool:
    """Whether the federation's parties vote with heads trained on hash shards (who can abstain)."""
    return not isinstance(config.mechanism, ReleaseMember) and mechanism_of(config).trains_heads


def _bn_batch_that_fits(config: FederationConfig, examples: int, heads: int) -> int | None:
    """The largest ``bn_batch`` below the federation's (≥ 16, dividing its batch size) at which ``heads``
    shards of ``examples`` all hold one chunk (:func:`~capc_common.federation.sizing.heads_for`)."""
    q = config.queries
    for chunk in range(q.bn_batch - 1, 15, -1):
        if q.batch_size % chunk == 0 and heads_for(examples, bn_batch=chunk) >= heads:
            return chunk
    return None


def abstaining_parties(plan: SpendPlan) -> Refusal | None:
    """Refuse when, on average, fewer than one of some party's heads would get a shard holding one BatchNorm
    chunk (:func:`expected_voting_heads`, :data:`MIN_VOTING_HEADS`).

    Such a party's votes are then mostly fixed by public positions: on average they add less than one head's
    knowledge, yet every batch is charged to its cap. When it is every party, the labels would mostly be a
    function of the query's position and the noise alone; that is ``certain`` when no party holds even one
    chunk, and a judgement otherwise (a party may also join only for the shared student).
    """
    config = plan.config
    if not _votes_heads(config):
        return None
    bn = config.queries.bn_batch
    short: dict[str, tuple[int, int, float]] = {}
    for party in config.teachers:
        examples = plan.examples.get(party.name)
        if examples is None:
            continue
        voting = expected_voting_heads(examples, party.heads, bn_batch=bn)
        if voting < MIN_VOTING_HEADS:
            short[party.name] = (examples, party.heads, voting)
    if not short:
        return None
    groups: dict[tuple[int, int, float], list[str]] = {}
    for name, figures in short.items():
        groups.setdefault(figures, []).append(name)
    said = "; ".join(_short_party_text(names, *figures, bn_batch=bn) for figures, names in groups.items())
    everyone = len(short) == len(config.teachers)
    consequence = (
        "no party's heads would vote, so every label the student gets would be a function of the query's "
        "position and the noise alone: the federation would spend its ε and learn nothing"
        if everyone
        else f"{', '.join(short)} would be charged for every batch while adding no knowledge"
    )
    changes = _abstention_changes(config, list(short.values()))
    certain = everyone and all(examples < bn for examples, _, _ in short.values())
    return Refusal("heads-abstain", f"{said}; {consequence}", changes, certain=certain)


def _short_party_text(
    names: Sequence[str], examples: int, heads: int, voting: float, *, bn_batch: int
) -> str:
    """One group of parties with the same figures, in words."""
    who = ", ".join(names)
    each = " each" if len(names) > 1 else ""
    if examples < bn_batch:
        return (
            f"{who}: {examples:,} examples{each}, fewer than one BatchNorm chunk of {bn_batch}: a head votes "
            f"only if its shard holds a chunk, so none of the {heads} heads can"
        )
    per_head = examples / heads
    return (
        f"{who}: {heads} heads over {examples:,} examples{each} is about {per_head:,.0f} per head, and a "
        f"head votes only if its shard holds one BatchNorm chunk of {bn_batch}; on average {voting:.2g} of "
        f"those heads would vote, so they all abstain with probability ≥ {_floor_percent(1 - voting)} %"
    )


def _floor_percent(probability: float) -> str:
    """A lower bound as a percentage, rounded down (99.98 % reads 99.9, never 100)."""
    return f"{math.floor(1000 * max(0.0, probability)) / 10:.1f}"


def _abstention_changes(
    config: FederationConfig, short: Sequence[tuple[int, int, float]]
) -> tuple[Change, ...]:
    """The values of heads, examples and ``bn_batch`` under which every short party's shards hold a chunk
    (the planner's 99.9 % rule), for the worst of them."""
    bn = config.queries.bn_batch
    changes = []
    fewest_heads = min(heads_for(examples, bn_batch=bn) for examples, _, _ in short)
    if fewest_heads >= 1:
        changes.append(Change("teachers.heads", "lower", fewest_heads))
    changes.append(
        Change("teachers.examples", "raise", max(examples_for(heads, bn_batch=bn) for _, heads, _ in short))
    )
    chunks = [_bn_batch_that_fits(config, examples, heads) for examples, heads, _ in short]
    if all(chunk is not None for chunk in chunks):
        changes.append(Change("queries.bn_batch", "lower", min(c for c in chunks if c is not None)))
    return tuple(changes)


def unreachable_threshold(plan: SpendPlan) -> Refusal | None:
    """Refuse when even a query on which every head that can vote agrees would pass the screening with
    probability below :data:`MIN_PASS_PROBABILITY`: every query is charged its screening cost, so the budget
    would go on queries that are almost never answered.

    The top count of such a query is at most the expected voting heads plus the abstaining heads' fixed
    votes on one class (a party's abstaining heads rotate their fixed vote over the classes, so at most
    ``⌈heads/classes⌉`` of them share one); a party whose examples are unknown counts all its heads.
    """
    config = plan.config
    if isinstance(config.mechanism, ReleaseMember):
        return None
    mechanism = mechanism_of(config)
    bn = config.queries.bn_batch
    top = 0.0
    for party in config.teachers:
        examples = plan.examples.get(party.name)
        if examples is None or not mechanism.trains_heads:
            top += party.heads
            continue
        voting = expected_voting_heads(examples, party.heads, bn_batch=bn)
        top += voting + min(party.heads - voting, math.ceil(party.heads / config.classes))
    chance = mechanism.pass_probability(top)
    if chance >= MIN_PASS_PROBABILITY:
        return None
    odds = "< 0.01 %" if chance < 1e-4 else f"{100 * chance:.2g} %"
    return Refusal(
        "threshold-unreachable",
        f"a query on which every head that can vote agrees holds about {top:,.1f} votes, and the screening "
        f"passes it with probability {odds}: every query is charged its screening cost, so the budget "
        "would go on queries that are almost never answered",
        (Change("mechanism.threshold", "lower", math.floor(top)),),
    )


def uncovered_caps(plan: SpendPlan) -> Refusal | None:
    """Refuse when the caps the parties declared stop so many of them before the end of the plan that fewer
    than the quorum can answer all of it: the federation would spend privacy on a plan it cannot finish.

    A declared cap is measured as a new cap record charges it, at :func:`~capc_common.federation.cap_order`
    (a record created before records named their order charges at the federation's, where the same ε
    covers less: its teacher refuses to start unless its cap covers there as much as its declaration does
    here); a party that declared none is counted as covering. A release federation's releases
    all fit its ε by construction, and its parties' caps are checked by each party.
    """
    config = plan.config
    declared = {t.name: t.cap for t in config.teachers if t.cap is not None}
    if not declared or isinstance(config.mechanism, ReleaseMember):
        return None
    exposure, delta, epsilon = exposure_of(config), config.budget.delta, config.budget.epsilon
    order, planned = cap_order(exposure, delta=delta), len(exposure.plan)

    def covers(cap: float) -> int:
        try:
            return exposure.admitted(epsilon=cap, delta=delta, order=order)
        except InputError:  # no RDP at this order meets the cap: it admits no charge at all
            return 0

    covered = {name: covers(cap) for name, cap in declared.items()}
    short = {name: count for name, count in covered.items() if count < planned}
    answering, quorum = len(config.teachers) - len(short), config.quorum.min_parties
    if answering >= quorum:
        return None
    cover = cap_cover(exposure, delta=delta, order=order)
    groups: dict[tuple[float, int], list[str]] = {}
    for name, count in short.items():
        groups.setdefault((declared[name], count), []).append(name)
    said = "; ".join(
        f"{', '.join(names)} declare{'s' if len(names) == 1 else ''} a cap of ε {cap:g}, which covers "
        f"{count} of the {planned} {exposure.kind} the federation's ε {epsilon:g} can admit"
        for (cap, count), names in groups.items()
    )
    return Refusal(
        "caps-short",
        f"{said}; {answering} of its {len(config.teachers)} parties can then answer the whole plan, where "
        f"its quorum needs {quorum}: the federation would spend privacy on a plan it cannot finish "
        f"({why_above(cover, federation_epsilon=epsilon)})",
        (Change("teachers.cap", "raise", cover.cap),),
    )


def below_alone(plan: SpendPlan) -> Refusal | None:
    """Refuse when the plan forecasts the student below the median party alone
    (:func:`capc_common.federation.recommend.refusal`: ``capc federation plan``'s answer from the joining
    benchmark's measurements) — its members would spend privacy for a model worse than most of them train
    alone. A single party is no consortium and is refused the same way.

    The forecast is secure-aggregation DP-SGD's, the best mechanism wherever others were measured, so for
    any mechanism this refuses only what no measured mechanism could make worthwhile. A judgement, never
    certain (the forecast has an interval; ``--force`` overrides). Judged only when every party's examples
    are declared; the change offered is the smallest budget, up to the largest measured ε, at which the
    forecast reaches the median party.
    """
    config = plan.config
    counts = [plan.examples.get(t.name) for t in config.teachers]
    if not counts or any(c is None for c in counts):
        return None
    from capc_common.federation.recommend import forecaster, refusal

    examples = [int(c) for c in counts if c is not None]
    why = refusal(examples, classes=config.classes, epsilon=config.budget.epsilon)
    if not why:
        return None
    changes = []
    largest = forecaster().ranges["epsilon"][1]
    for epsilon in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, largest):
        if (
            config.budget.epsilon < epsilon <= largest
            and len(examples) > 1
            and not refusal(examples, classes=config.classes, epsilon=epsilon)
        ):
            changes.append(Change("budget.epsilon", "raise", epsilon))
            break
    return Refusal("below-alone", why, tuple(changes))


#: Every check run before the first charge, in order; each returns a :class:`Refusal` or None.
PRE_SPEND_CHECKS: tuple[Callable[[SpendPlan], Refusal | None], ...] = (
    abstaining_parties,
    unreachable_threshold,
    uncovered_caps,
    below_alone,
)


def pre_spend_refusals(plan: SpendPlan) -> list[Refusal]:
    """What every check of :data:`PRE_SPEND_CHECKS` refuses for ``plan`` (empty: nothing to refuse)."""
    return [refusal for check in PRE_SPEND_CHECKS if (refusal := check(plan)) is not None]


def enforce(
    refusals: Sequence[Refusal],
    *,
    force: str | None,
    names: Mapping[str, str] = FIELD_NAMES,
    force_with: str = '--force "REASON"',
) -> tuple[Refusal, ...]:
    """Raise the refusals, unless ``force`` gives a reason and none of them is certain.

    Args:
        refusals: what :func:`pre_spend_refusals` found.
        force: the operator's stated reason to run anyway (None: not forced).
        names: how the front end spells the parameters (flags, or ``federation.yaml`` fields).
        force_with: how the front end is forced (named in the message).

    Returns:
        The refusals that ``force`` overrode (for the caller to log and record with the reason).

    Raises:
        InputError: ``force`` is given but blank (a reason is required).
        PreconditionError: a refusal stands: every reason, its fix and, for judgements, how to override.
    """
    if force is not None and not force.strip():
        raise InputError(f"{force_with} needs a reason (why run a federation that may spend for nothing)")
    if not refusals:
        return ()
    certain = any(r.certain for r in refusals)
    if force is not None and not certain:
        return tuple(refusals)
    reasons = "; ".join(f"[{r.check}] {r.text(names)}" for r in refusals)
    way = (
        "this is certain, so it cannot be forced"
        if certain
        else f"if it should run anyway, pass {force_with} (the reason is recorded)"
    )
    raise PreconditionError(f"refusing before any privacy is spent: {reasons}. {way[0].upper()}{way[1:]}")
