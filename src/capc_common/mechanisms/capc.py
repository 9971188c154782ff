"""CaPC (Choquette-Choo et al. 2021) simulated in plaintext for utility, as the DIET-CaPC paper compares it.

In CaPC a *querying* party improves its own model with labels that the *other* parties' models give its
queries through Confident-GNMax (in CaPC under homomorphic encryption and 2PC; the released labels are the
same, so utility needs only the plaintext rule). There is no public data here, so a querying party's queries
are its own private training images: each answering party holds ``teachers_per_party`` heads on disjoint
parts of its shard (dealt by keyed content hash), every head of every *other* party votes on the query,
Confident-GNMax answers or abstains, and the querying party retrains its head on its own labelled records
plus the answered queries with the ensemble's labels. A querying party's records are not protected by this
release (they are its own); the answering parties' records are, and that is what the accounting covers.

Two budget splits, as in the DIET paper:

* **fair**: every party queries in turn, each ``budget_queries / (parties − 1)`` queries, so each answering
  party's records see ``budget_queries`` queries in all;
* **greedy**: one party sends all ``budget_queries`` queries (the upper bound for that party).

Accounting (rigorous, data-independent, DESIGN §4): a record of party ``j`` sits in exactly one of ``j``'s
heads, so it moves at most one vote of any query that ``j`` answers; the per-record cost is
``budget_queries`` queries of the :class:`~capc_common.mechanisms.ConfidentGNMax` object's own
``costs`` (screening per query, ``λ/σ2²`` per answer), charged as if every query were answered — the
worst case the guardian would admit a batch on, so no order is chosen after seeing the answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from capc_common.aggregation import MechanismNoise, mechanism_noise
from capc_common.errors import InputError
from capc_common.learn.heads import HeadEnsemble, HeadRecipe, train_heads
from capc_common.mechanisms.base import UNANSWERED
from capc_common.mechanisms.central import PartyData
from capc_common.mechanisms.pate import ConfidentGNMax
from capc_common.mechanisms.release import calibrate
from capc_common.privacy.analysis import epsilon_from_rdp

__all__ = ["CaPCResult", "capc_epsilon", "capc_mechanism", "capc_teachers", "run_capc"]


def capc_epsilon(mechanism: ConfidentGNMax, *, queries: int, orders: npt.ArrayLike, delta: float) -> float:
    """ε of ``queries`` Confident-GNMax queries per record, all answered (the worst case), best order."""
    screen, answer = mechanism.costs(orders)
    return float(epsilon_from_rdp(orders, queries * (screen + answer), delta=delta)[0])


def capc_mechanism(
    *,
    classes: int,
    teachers: int,
    budget_queries: int,
    epsilon: float,
    delta: float,
    orders: npt.ArrayLike,
    threshold_share: float,
    sigma1_ratio: float,
) -> ConfidentGNMax:
    """The Confident-GNMax whose ``budget_queries`` worst-case queries cost at most ``epsilon``.

    The threshold is ``threshold_share · teachers`` and ``σ1 = sigma1_ratio · σ2`` (public shape choices, as
    the paper's T 150, σ1 120, σ2 40 for 200 teachers); ``σ2`` is the smallest that fits the budget.

    Raises:
        InputError: no σ2 up to 2,000 fits (too many queries for this ε).
    """
    if not (0 < threshold_share <= 1 and sigma1_ratio > 0):
        raise InputError(
            f"need 0 < threshold_share <= 1 and sigma1_ratio > 0, got {threshold_share}, {sigma1_ratio}"
        )

    def make(sigma2: float) -> ConfidentGNMax:
        return ConfidentGNMax(
            classes=classes,
            teachers=teachers,
            threshold=threshold_share * teachers,
            sigma1=sigma1_ratio * sigma2,
            sigma2=sigma2,
        )

    sigma2 = calibrate(
        lambda s: capc_epsilon(make(s), queries=budget_queries, orders=orders, delta=delta),
        target=epsilon,
        low=0.5,
        high=2000.0,  # the exact screening supremum takes ~ σ/1000 s: keep the bracket tight
    )
    return make(sigma2)


@dataclass(frozen=True)
class CaPCResult:
    """What each querying party ends with.

    Attributes:
        queriers: the querying parties' indices.
        heads: one retrained head per querying party, in the order of ``queriers``.
        queries: queries each querying party sent.
        answered: queries answered per querying party.
        label_accuracy: fraction of answered labels equal to the querying party's own label (a diagnostic
            the querying party can compute itself: the queries are its own labelled records).
    """

    queriers: list[int]
    heads: HeadEnsemble
    queries: list[int]
    answered: list[int]
    label_accuracy: list[float]


def capc_teachers(
    parties: Sequence[PartyData], *, per_party: int, classes: int, recipe: HeadRecipe, seed: int
) -> tuple[HeadEnsemble, npt.NDArray[np.int64]]:
    """Every party's ``per_party`` heads on disjoint parts of its records; each head's party.

    A party's records are dealt to its heads by keyed content hash (:func:`~capc_common.data.partition`,
    scheme ``hash``, key ``seed``), as a teacher party's ``capc teacher train`` deals its shards: adding or
    removing one record changes one head's part by that record and no other head's. Deterministic
    (fixed-step Adam from zero, each head alone), so a benchmark may train them once and pass them to
    :func:`run_capc` for every ε and budget split.

    Raises:
        InputError: a party without its images (the hash needs them), or one too small for ``per_party``
            non-empty parts.
    """
    from capc_common.data import partition

    blind = [p.name for p in parties if p.images is None]
    if blind:
        raise InputError(f"parties {blind} carry no images: their records are dealt to heads by content hash")
    small = [p.name for p in parties if len(p.labels) < per_party]
    if small:
        raise InputError(f"parties {small} hold fewer records than teachers_per_party={per_party}; lower it")
    owners = []
    for t, p in enumerate(parties):
        owner = np.empty(len(p.labels), dtype=np.int64)
        for j, shard in enumerate(
            partition(p.labels, shards=per_party, scheme="hash", seed=seed, images=p.images)
        ):
            owner[shard] = t * per_party + j
        owners.append(owner)
    heads = train_heads(
        np.concatenate([p.features for p in parties]),
        np.concatenate([p.labels for p in parties]),
        owners=np.concatenate(owners),
        heads=len(parties) * per_party,
        classes=classes,
        recipe=recipe,
    )
    return heads, np.repeat(np.arange(len(parties)), per_party)


def run_capc(
    parties: Sequence[PartyData],
    *,
    mechanism: ConfidentGNMax,
    queriers: Sequence[int],
    queries_per_querier: int,
    teachers_per_party: int,
    recipe: HeadRecipe,
    noise: MechanismNoise | None = None,
    seed: int = 0,
    teachers: tuple[HeadEnsemble, npt.NDArray[np.int64]] | None = None,
) -> CaPCResult:
    """Each querying party in turn: the other parties' heads label a random subset of its own records through
    ``mechanism``; it retrains its head on its records plus the answered ones.

    Args:
        parties: all parties' records.
        mechanism: Confident-GNMax over ``(parties − 1) · teachers_per_party`` votes.
        queriers: the querying parties (all of them for *fair*, one for *greedy*).
        queries_per_querier: queries each querying party sends (capped at its record count).
        teachers_per_party: heads each answering party trains on disjoint parts of its shard (dealt by keyed
            content hash, key ``seed``: :func:`capc_teachers`).
        recipe: how every head (teachers and the retrained querying heads) is fitted.
        noise: both noise sources (default: CSPRNGs).
        seed: which of its records a querying party sends (its own public choice), and the key of the
            teachers' hash split.
        teachers: :func:`capc_teachers` of these parties with this recipe, if already trained.

    Raises:
        InputError: a mechanism for a different number of voters, or a shard too small.
    """
    voters = (len(parties) - 1) * teachers_per_party
    if mechanism.teachers != voters:
        raise InputError(
            f"the mechanism counts {mechanism.teachers} votes per query but the other parties hold {voters} "
            f"heads ({len(parties) - 1} parties × {teachers_per_party}); build it with teachers={voters}"
        )
    classes = mechanism.classes
    heads, party_of = teachers or capc_teachers(
        parties, per_party=teachers_per_party, classes=classes, recipe=recipe, seed=seed
    )
    noise = noise or mechanism_noise()
    rng = np.random.default_rng(seed)  # which own records to send: public, not secret
    xs, ys, owners, sent, answered, agree = [], [], [], [], [], []
    for k, i in enumerate(queriers):
        own = parties[i]
        pick = rng.permutation(len(own.labels))[: min(queries_per_querier, len(own.labels))]
        votes = heads.predict(own.features[pick])[party_of != i]
        histograms = np.stack([np.bincount(v, minlength=classes) for v in votes.T])
        labels = mechanism.answer(histograms, noise)
        ok = labels != UNANSWERED
        xs += [own.features, own.features[pick][ok]]
        ys += [own.labels, labels[ok]]
        owners.append(np.full(len(own.labels) + int(ok.sum()), k))
        sent.append(len(pick))
        answered.append(int(ok.sum()))
        agree.append(float(np.mean(labels[ok] == own.labels[pick][ok])) if ok.any() else float("nan"))
    retrained = train_heads(
        np.concatenate(xs),
        np.concatenate(ys),
        owners=np.concatenate(owners),
        heads=len(queriers),
        classes=classes,
        recipe=recipe,
    )
    return CaPCResult(list(queriers), retrained, sent, answered, agree)
