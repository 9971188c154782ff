"""The checks before spending: from public figures alone, a federation whose heads cannot vote, or whose
screening can essentially never pass, is refused with the parameter to change — and that change fixes it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capc_common.data.partition import partition
from capc_common.errors import InputError, PreconditionError
from capc_common.federation import FederationConfig
from capc_common.federation.refusals import (
    Change,
    Refusal,
    SpendPlan,
    abstaining_parties,
    enforce,
    expected_voting_heads,
    pre_spend_refusals,
    unreachable_threshold,
)
from capc_common.learn.teachers import short_shards

#: The shipped compose federation: Confident-GNMax, chunks of 64, batches of 64.
COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "federation-confident-gnmax.yaml"


def _federation(**overrides: Any) -> dict[str, Any]:
    """The compose federation as a mapping, with ``overrides``."""
    return {**FederationConfig.load(COMPOSE).model_dump(mode="json"), **overrides}


def _config(*, heads: int = 25, parties: int = 3, **overrides: Any) -> FederationConfig:
    """``parties`` × ``heads`` under the library's scaled Confident-GNMax parameters."""
    total = heads * parties
    data = _federation(
        teachers=[{"name": f"hospital-{i + 1}", "heads": heads} for i in range(parties)],
        mechanism={"threshold": 0.6 * total, "sigma1": 0.7 * total, "sigma2": 0.16 * total},
        quorum={"min_parties": parties, "vote_deadline_s": 5, "share_deadline_s": 5},
    )
    return FederationConfig.from_dict({**data, **overrides})


def _with(config: FederationConfig, change: str, value: float) -> FederationConfig:
    """``config`` with one :class:`Change` applied (what a user following the message would run)."""
    data = config.model_dump(mode="json")
    if change == "teachers.heads":
        data["teachers"] = [{**t, "heads": int(value)} for t in data["teachers"]]
    elif change == "queries.bn_batch":
        data["queries"]["bn_batch"] = int(value)
    elif change == "mechanism.threshold":
        data["mechanism"]["threshold"] = value
    return FederationConfig.from_dict(data)


def test_the_expected_voting_heads_match_the_real_hash_partition() -> None:
    """The model behind every figure: hash shards are Binomial(n, 1/k), so the mean count of heads whose
    shard holds one chunk is k · P(Bin ≥ bn_batch) — checked against the content hash the parties use."""
    rng = np.random.default_rng(0)  # test data only: the partition's own key is public anyway
    examples, heads, bn_batch, draws = 1000, 25, 40, 40
    images = rng.integers(0, 256, size=(examples, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, size=examples)
    voting = [
        heads
        - len(
            short_shards(partition(labels, shards=heads, scheme="hash", seed=s, images=images), bn_batch=40)
        )
        for s in range(draws)
    ]
    expected = expected_voting_heads(examples, heads, bn_batch=bn_batch)
    assert 12 < expected < 14.5  # P(Bin(1000, 1/25) ≥ 40) ≈ 0.53
    assert abs(np.mean(voting) - expected) < 3 * np.std(voting) / np.sqrt(draws) + 0.1
    # The pure-Python tail (run by the guardian before it is ready) against scipy's, both sides of the mean
    from scipy.special import bdtrc  # P(Bin(n, p) > b)

    for n, k, b in [(1000, 25, 64), (3000, 25, 64), (1000, 25, 40), (60000, 600, 64), (20000, 189, 64)]:
        want = k * bdtrc(b - 1, n, 1 / k)
        assert expected_voting_heads(n, k, bn_batch=b) == pytest.approx(want, rel=1e-9, abs=1e-300)
    assert expected_voting_heads(63, 1, bn_batch=64) == 0.0  # fewer than a chunk: certainly none
    assert expected_voting_heads(64, 1, bn_batch=64) == 1.0  # one head holds everything


def test_a_tail_too_small_for_a_float_is_found_at_once() -> None:
    """A party of 1,000,000 examples over 10,000 heads (about 100 each) against chunks of 1,024: the tail's
    first term is below the smallest float, and the terms only shrink from there. Summing zeros through every
    remaining count took seconds per party (the guardian runs this before it is ready, twice per party)."""
    start = time.perf_counter()
    assert expected_voting_heads(1_000_000, 10_000, bn_batch=1024) == 0.0
    assert time.perf_counter() - start < 1.0  # microseconds once it stops at the first zero term


def test_the_useless_federation_is_refused_and_each_fix_really_fixes_it() -> None:
    """`capc local up --parties 3 --train-limit 1000` at 25 heads each: about 40 examples per head, below a
    chunk of 64 — it spent ε 6.07 and published a 7 % student."""
    config = _config()
    plan = SpendPlan.declared(config, {name: 1000 for name in config.teacher_names})
    [refusal] = pre_spend_refusals(plan)
    assert refusal.check == "heads-abstain" and not refusal.certain  # a shard of 64 is possible, not likely
    assert "hospital-1, hospital-2, hospital-3: 25 heads over 1,000 examples each" in refusal.reason
    assert "no party's heads would vote" in refusal.reason
    assert [(c.field, c.verb, c.value) for c in refusal.changes] == [
        ("teachers.heads", "lower", 10),
        ("teachers.examples", "raise", 2494),
        ("queries.bn_batch", "lower", 16),
    ]
    for change in refusal.changes:
        if change.field == "teachers.examples":
            fixed = SpendPlan.declared(config, {n: int(change.value) for n in config.teacher_names})
        else:
            fixed = SpendPlan(_with(config, change.field, change.value), plan.examples)
        assert pre_spend_refusals(fixed) == [], change
    with pytest.raises(PreconditionError, match=r'\[heads-abstain\].*pass --force "REASON"'):
        enforce([refusal], force=None)
    assert enforce([refusal], force="a dry run of the deployment") == (refusal,)
    with pytest.raises(InputError, match="needs a reason"):
        enforce([refusal], force="  ")


def test_a_federation_no_party_of_which_holds_a_chunk_cannot_be_forced() -> None:
    config = _config(parties=2)
    [refusal] = pre_spend_refusals(SpendPlan.declared(config, {"hospital-1": 63, "hospital-2": 40}))
    assert refusal.certain
    assert (
        "fewer than one BatchNorm chunk of 64: a head votes only if its shard holds a chunk" in refusal.reason
    )
    assert [c.field for c in refusal.changes] == ["teachers.examples"]  # fewer heads cannot help
    with pytest.raises(PreconditionError, match="certain, so it cannot be forced"):
        enforce([refusal], force="please")


def test_one_party_whose_heads_all_abstain_is_named_alone() -> None:
    """The others vote, so the federation can learn; that party is charged for nothing (a judgement)."""
    config = _config(parties=3)
    examples = {"hospital-1": 3000, "hospital-2": 3000, "hospital-3": 500}
    [refusal] = pre_spend_refusals(SpendPlan.declared(config, examples))
    assert not refusal.certain
    assert refusal.reason.startswith("hospital-3: 25 heads over 500 examples is about 20 per head")
    assert "hospital-3 would be charged for every batch while adding no knowledge" in refusal.reason
    assert "hospital-1" not in refusal.reason
    # Undeclared examples are not judged; neither is a mechanism whose parties train no heads.
    assert pre_spend_refusals(SpendPlan(config)) == []
    tiny = {"hospital-1": 10, "hospital-2": 10, "hospital-3": 10}  # fewer than one chunk: certain under heads
    knn = _config(
        heads=20, mechanism={"name": "private-knn", "neighbours": 20, "sampling_rate": 0.2, "sigma": 9.6}
    )
    release = FederationConfig.load(COMPOSE.with_name("federation-secagg-dpsgd.yaml"))
    few = {name: 10 for name in release.teacher_names}
    # (10 examples a party: the plan may judge them below the parties alone, but no heads check applies)
    for plan in (SpendPlan.declared(knn, tiny), SpendPlan.declared(release, few)):  # records; no heads
        assert abstaining_parties(plan) is None and unreachable_threshold(plan) is None


def test_the_declared_examples_come_from_federation_yaml_and_leave_old_hashes_alone() -> None:
    plain = _config()
    data = plain.model_dump(mode="json")
    assert "examples" not in data["teachers"][0]  # unset: out of the canonical form, the hash as before
    data["teachers"] = [{**t, "examples": 1000} for t in data["teachers"]]
    declared = FederationConfig.from_dict(data)
    assert declared.config_hash() != plain.config_hash()
    assert [r.check for r in pre_spend_refusals(SpendPlan.declared(declared))] == ["heads-abstain"]
    own = SpendPlan.declared(declared, {"hospital-1": 3000, "hospital-2": 3000, "hospital-3": 3000})
    assert pre_spend_refusals(own) == []  # a site's own count is laid over the declared one
    with pytest.raises(InputError, match="examples"):
        FederationConfig.from_dict({**data, "teachers": [{**data["teachers"][0], "examples": -1}]})


def test_a_threshold_no_unanimous_query_can_pass_is_refused() -> None:
    """Every query pays its screening cost; with T far above the votes and little threshold noise almost
    none is ever answered."""
    config = FederationConfig.from_dict(
        _federation(mechanism={"threshold": 200, "sigma1": 5.0, "sigma2": 12.0})
    )
    [refusal] = pre_spend_refusals(SpendPlan(config))
    heads = config.total_heads
    assert refusal.check == "threshold-unreachable" and not refusal.certain
    assert f"holds about {heads:.1f} votes, and the screening passes it with probability < 0.01 %" in (
        refusal.reason
    )
    [change] = refusal.changes
    assert (change.field, change.value) == ("mechanism.threshold", heads)
    assert pre_spend_refusals(SpendPlan(_with(config, change.field, change.value))) == []
    # Many abstaining heads lower the reachable top count: it counts the voters and one class of fixed votes.
    abstaining = _config(mechanism={"threshold": 40, "sigma1": 4.0, "sigma2": 12.0})
    short = {n: 1000 for n in abstaining.teacher_names}
    assert [r.check for r in pre_spend_refusals(SpendPlan.declared(abstaining, short))] == [
        "heads-abstain",
        "threshold-unreachable",
    ]


def test_the_refusal_names_parameters_in_the_front_ends_spelling() -> None:
    assert Refusal("heads-abstain", "why").text() == "why"  # no change: no dangling "to fix it"
    spelled = Refusal(
        "x", "why", (Change("teachers.heads", "lower", 10), Change("queries.bn_batch", "lower", 16))
    )
    assert spelled.text({"teachers.heads": "--teachers-per-party", "queries.bn_batch": "--bn-batch"}) == (
        "why; to fix it, lower --teachers-per-party to 10, or lower --bn-batch to 16"
    )
    assert "lower teachers[].heads to 10" in spelled.text()
