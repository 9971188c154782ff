"""The release guardian behind real mutual-TLS gRPC on a real ledger file: one charge buys one noisy total,
each round of the plan is charged once, and the guardian's view never holds the student's part of the noise.

A release is charged durably before its masked total leaves; a round asked again is answered from its
receipt and charged nothing, across restarts; a round beyond the plan, a second seed, a wrong length, an
unknown party, a release asked before the seeds arrived and one the budget cannot pay are each refused with a
precise status, and none of them charges anything or reveals anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from release_harness import BUDGET, RHO, SEED, ReleaseGuardianServer

from capc_common.aggregation import party_noise
from capc_common.errors import InputError
from capc_common.federation.releases import ReleaseProtocol
from capc_common.mechanisms import reveal, share_contribution
from capc_common.mechanisms.release import student_half
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_from_proto
from capc_services.common.errors import KIND_KEY, MISSING_SEEDS_KEY


@pytest.fixture
def guardian(pki: Path, tmp_path: Path) -> Iterator[ReleaseGuardianServer]:
    running = ReleaseGuardianServer(pki, tmp_path)
    yield running
    running.close()


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _vectors(protocol: ReleaseProtocol) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {p: rng.integers(-1000, 1000, size=protocol.length) for p in ("hospital-a", "hospital-b")}


def _half(guardian: ReleaseGuardianServer, shares: list[np.ndarray]) -> np.ndarray:
    """The student's half: its shares plus its part of the noise (its seeded stream)."""
    noise = guardian.protocol.mechanism.noise_part(party_noise("student", seed=SEED))
    return student_half(shares, noise=noise)


def test_release_is_the_noisy_sum_charged_once(guardian: ReleaseGuardianServer) -> None:
    vectors = _vectors(guardian.protocol)
    shares = [guardian.contribute("r1", p, v) for p, v in vectors.items()]
    reply = guardian.release("r1", ["hospital-b", "hospital-a"])
    mechanism = guardian.protocol.mechanism
    z_g = mechanism.noise_part(party_noise("guardian", seed=SEED))
    z_s = mechanism.noise_part(party_noise("student", seed=SEED))
    total = reveal([_half(guardian, shares)], ndarray_from_proto(reply.masked))
    np.testing.assert_array_equal(total, vectors["hospital-a"] + vectors["hospital-b"] + z_g + z_s)
    rdp = guardian.protocol.release_rdp(BUDGET["order"])
    assert reply.charged_rdp == pytest.approx(rdp) and not reply.replayed
    assert (reply.release_id, list(reply.parties)) == ("r1", ["hospital-a", "hospital-b"])
    summary = guardian.ledger.summary()
    assert summary["spent_rdp"] == pytest.approx(rdp, rel=1e-9)
    assert guardian.ledger.batch(guardian.core.batch_id(0)).state == "settled"
    assert reply.ledger.releases == reply.ledger.releases_planned == 1
    # The same attempt again (the reply was lost on the way): the same bytes, nothing charged twice.
    entries = guardian.entries()
    again = guardian.release("r1", ["hospital-a", "hospital-b"])
    assert again.replayed and again.charged_rdp == 0 and again.masked == reply.masked
    # The same round under another attempt: its receipt (the same bytes), nothing charged twice.
    for party, vector in vectors.items():
        guardian.contribute("r2", party, vector)
    again = guardian.release("r2", ["hospital-a", "hospital-b"])
    assert again.replayed and again.charged_rdp == 0 and again.release_id == "r1"
    assert again.masked == reply.masked
    assert guardian.entries() == entries
    assert guardian.ledger.summary()["spent_rdp"] == summary["spent_rdp"]


def test_the_guardians_and_a_teachers_view_still_carries_the_students_noise(
    guardian: ReleaseGuardianServer,
) -> None:
    """The coalition of the guardian (its masks and its own part of the noise; the total deposited with it)
    and one teacher party (its own contribution): the best it can make of the noiseless sum,
    ``T − z_g``, is off by the student's part ``z_s`` — of the variance that part is accounted at. (When the
    guardian drew all the noise, ``T − z_g`` was the exact sum.)"""
    vectors = _vectors(guardian.protocol)
    shares = [guardian.contribute("r1", p, v) for p, v in vectors.items()]
    reply = guardian.release("r1", list(vectors))
    total = reveal([_half(guardian, shares)], ndarray_from_proto(reply.masked))
    guardian.deposit(0, "r1", total)
    mechanism = guardian.protocol.mechanism
    own = mechanism.noise_part(party_noise("guardian", seed=SEED))  # the guardian knows the noise it drew
    kept = guardian.record(0)  # what the guardian holds: the deposited total
    assert kept.state == pb.ReleaseRoundState.RELEASE_ROUND_STATE_DEPOSITED and kept.release_id == "r1"
    coalition = ndarray_from_proto(kept.total) - own  # its view of Σ V (it knows hospital-a's part too)
    residual = coalition - (vectors["hospital-a"] + vectors["hospital-b"])
    np.testing.assert_array_equal(residual, mechanism.noise_part(party_noise("student", seed=SEED)))
    parts = mechanism.part_sigmas()
    for sigma in np.unique(parts):
        block = residual[parts == sigma].astype(np.float64)
        assert np.any(block != 0)
        if block.size >= 50:  # the sums' block: the spread of N_Z(0, s²), 4 standard errors
            assert abs(block.var() / sigma**2 - 1) < 4 * np.sqrt(2 / block.size)
    # Against this coalition the card states the other part's ε, finite and above the outsider's.
    coalitions = {tuple(c.members): c for c in kept.ledger.coalitions}
    against = coalitions[("guardian", "any one teacher party")]
    assert against.HasField("epsilon") and kept.ledger.epsilon < against.epsilon < np.inf


def test_a_round_beyond_the_plan_is_refused_across_restarts(pki: Path, tmp_path: Path) -> None:
    first = ReleaseGuardianServer(pki, tmp_path)
    try:
        vectors = _vectors(first.protocol)
        for party, vector in vectors.items():
            first.contribute("r1", party, vector)
        assert _code(lambda: first.release("r1", list(vectors), round=1)) == grpc.StatusCode.OUT_OF_RANGE
        assert first.entries() == 0
        paid = first.release("r1", list(vectors))
        entries = first.entries()
    finally:
        first.close()
    restarted = ReleaseGuardianServer(pki, tmp_path)  # the same ledger file
    try:
        for party, vector in vectors.items():
            restarted.contribute("r9", party, vector)
        again = restarted.release("r9", list(vectors))
        assert again.replayed and again.masked == paid.masked and restarted.entries() == entries
        assert _code(lambda: restarted.release("r9", list(vectors), round=1)) == grpc.StatusCode.OUT_OF_RANGE
        assert _code(lambda: restarted.record(1)) == grpc.StatusCode.OUT_OF_RANGE
        assert restarted.entries() == entries and restarted.ledger.verify().ok
    finally:
        restarted.close()


DPSGD = {"name": "secagg-dpsgd", "rounds": 3, "noise_multiplier": 4.0, "sampling_rate": 1.0,
         "projection": None, "optimizer": "momentum", "learning_rate": 0.5}  # fmt: skip


def test_an_attempts_seeds_are_released_in_their_round_only_across_restarts(
    pki: Path, tmp_path: Path
) -> None:
    """A student holding the shares of attempt X, charged for round 0, asks a restarted guardian to release X
    again as round 1, and the teachers' kept seeds of X (the same bytes) reach it again. Charged, round 1
    would be a second noisy total of round 0's sample — each teacher charged it once. The guardian refuses
    the seeds and the release for any round but 0 (ALREADY_EXISTS), in the same process and after a restart
    (from the ledger's receipts), and charges nothing; round 1 stays open to a fresh attempt."""
    first = ReleaseGuardianServer(pki, tmp_path, mechanism=DPSGD)
    length, vectors = first.protocol.length, _vectors(first.protocol)
    seeds = {p: share_contribution(v)[0] for p, v in vectors.items()}
    try:
        for party, seed in seeds.items():
            first.send_seed("X", party, seed, length=length, round=0)
        # Seeds sent for round 0 are not released for round 1 (nothing charged), nor joined by one naming it.
        assert _code(lambda: first.release("X", list(vectors), round=1)) == grpc.StatusCode.ALREADY_EXISTS
        assert _code(lambda: first.contribute("X", "hospital-a", vectors["hospital-a"], round=1)) == (
            grpc.StatusCode.ALREADY_EXISTS
        )
        assert first.entries() == 0
        paid = first.release("X", list(vectors), round=0)
        assert not paid.replayed and paid.charged_rdp > 0
        assert _code(lambda: first.release("X", list(vectors), round=1)) == grpc.StatusCode.ALREADY_EXISTS
        entries = first.entries()
    finally:
        first.close()
    restarted = ReleaseGuardianServer(pki, tmp_path, mechanism=DPSGD)  # the same ledger file
    try:
        for party, seed in seeds.items():
            with pytest.raises(grpc.RpcError) as refused:
                restarted.send_seed("X", party, seed, length=length, round=1)
            assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
            # for its own round a seed retried after the charge is taken and dropped, as before the restart
            assert restarted.send_seed("X", party, seed, length=length, round=0).received == 0
        with pytest.raises(grpc.RpcError) as info:
            restarted.release("X", list(vectors), round=1)
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "attempt X was charged for round 0, not 1" in (info.value.details() or "")
        assert restarted.entries() == entries and restarted.ledger.release_plan()[2] == 1
        again = restarted.release("X", list(vectors), round=0)  # round 0 itself: its receipt
        assert again.replayed and again.masked == paid.masked and restarted.entries() == entries
        for party, vector in vectors.items():
            restarted.contribute("Y", party, vector, round=1)
        fresh = restarted.release("Y", list(vectors), round=1)
        assert not fresh.replayed and restarted.ledger.release_plan()[2] == 2
    finally:
        restarted.close()


def test_a_full_ledger_disk_charges_nothing_and_the_retry_pays_once(pki: Path, tmp_path: Path) -> None:
    """SQLite's own SQLITE_FULL (the file may not grow) while a release is charged: nothing is written and
    nothing is sent; with room again, the next attempt at the round is charged once, and a retry after that
    is answered from the receipt (the issue's fault: a full ledger volume, then a release paid twice)."""
    guardian = ReleaseGuardianServer(pki, tmp_path, dim=2000)  # a 160 kB receipt: the file must grow
    try:
        vectors = _vectors(guardian.protocol)
        for release_id in ("r1", "r2"):
            for party, vector in vectors.items():
                guardian.contribute(release_id, party, vector)
        db = guardian.ledger._db  # the guardian's own connection: the limit holds for its writes
        (pages,) = db.execute("PRAGMA page_count").fetchone()
        db.execute(f"PRAGMA max_page_count = {pages}")
        # refused as a full volume (RESOURCE_EXHAUSTED, `capc-error: storage`: waited out, not a spent
        # budget, never DATA_LOSS), and nothing is kept
        with pytest.raises(grpc.RpcError) as refused:
            guardian.release("r1", list(vectors))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (KIND_KEY, "storage") in tuple(refused.value.trailing_metadata() or ())
        assert "backup" not in str(refused.value.details())
        assert guardian.entries() == 0 and guardian.ledger.verify().ok
        db.execute("PRAGMA max_page_count = 1073741823")
        paid = guardian.release("r2", list(vectors))
        assert not paid.replayed and paid.release_id == "r2" and guardian.entries() == 3
        again = guardian.release("r1", list(vectors))
        assert again.replayed and again.masked == paid.masked and guardian.entries() == 3
    finally:
        guardian.close()


def test_deposits_and_the_record_of_a_round(guardian: ReleaseGuardianServer) -> None:
    vectors = _vectors(guardian.protocol)
    length = guardian.protocol.length
    assert guardian.record(0).state == pb.ReleaseRoundState.RELEASE_ROUND_STATE_OPEN
    zeros = np.zeros(length, dtype=np.int64)
    assert _code(lambda: guardian.deposit(0, "r1", zeros)) == grpc.StatusCode.FAILED_PRECONDITION
    shares = [guardian.contribute("r1", p, v) for p, v in vectors.items()]
    reply = guardian.release("r1", list(vectors))
    charged = guardian.record(0)
    assert (charged.state, charged.release_id) == (pb.ReleaseRoundState.RELEASE_ROUND_STATE_CHARGED, "r1")
    total = reveal([_half(guardian, shares)], ndarray_from_proto(reply.masked))
    assert _code(lambda: guardian.deposit(0, "r2", total)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: guardian.deposit(0, "r1", total[:-1])) == grpc.StatusCode.INVALID_ARGUMENT
    entries = guardian.entries()
    for _ in range(2):  # the same total again: accepted (a retry)
        assert guardian.deposit(0, "r1", total).releases == 1
    assert _code(lambda: guardian.deposit(0, "r1", total + 1)) == grpc.StatusCode.ALREADY_EXISTS
    kept = guardian.record(0)
    assert kept.state == pb.ReleaseRoundState.RELEASE_ROUND_STATE_DEPOSITED
    np.testing.assert_array_equal(ndarray_from_proto(kept.total), total)
    assert guardian.entries() == entries and guardian.ledger.verify().ok


def test_a_ledger_of_releases_without_rounds_is_refused_with_what_to_do(pki: Path, tmp_path: Path) -> None:
    """A ledger whose releases an earlier version charged under attempt ids alone: the guardian cannot tell
    which rounds they paid for, so it refuses to start on it and says what to do."""
    first = ReleaseGuardianServer(pki, tmp_path)
    first.ledger.reserve(
        "release-0a1b2c3d4e5f-0", queries=1, parties=["hospital-a", "hospital-b"], mechanism="dp-prototypes",
        params={"rho": RHO}, worst_case_rdp=0.1, actor="guardian",
    )  # fmt: skip
    first.close()
    with pytest.raises(InputError, match=r"1 release\(s\) charged by an earlier version .* new ledger file"):
        ReleaseGuardianServer(pki, tmp_path)


def test_each_release_logs_the_ledger_head(
    guardian: ReleaseGuardianServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Like a batch's, a release's settle logs the entry and head to pin (`verify --expect-head`)."""
    vectors = _vectors(guardian.protocol)
    for party, vector in vectors.items():
        guardian.contribute("pinned", party, vector)
    with caplog.at_level(logging.INFO, logger="capc_services.guardian.releases"):
        guardian.release("pinned", list(vectors))
    summary = guardian.ledger.summary()
    logged = [r for r in caplog.records if r.getMessage() == "release charged and sent"]
    assert [(r.ledger_entry, r.ledger_head) for r in logged] == [(summary["entries"], summary["head"])]


def test_a_release_the_budget_cannot_pay_is_refused_before_anything(guardian: ReleaseGuardianServer) -> None:
    """A plan that fits the budget never meets this; a ledger something else spent on can."""
    guardian.ledger.reserve(
        "elsewhere", queries=1, parties=["hospital-a"], mechanism="other", params={}, worst_case_rdp=0.5
        * guardian.ledger.budget_rdp, actor="admin",
    )  # fmt: skip
    vectors = _vectors(guardian.protocol)
    for party, vector in vectors.items():
        guardian.contribute("first", party, vector)
    entries, spent = guardian.entries(), guardian.ledger.summary()["spent_rdp"]
    with pytest.raises(grpc.RpcError) as info:
        guardian.release("first", list(vectors))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert guardian.core.batch_id(0) in info.value.details()
    assert (guardian.entries(), guardian.ledger.summary()["spent_rdp"]) == (entries, spent)
    assert guardian.ledger.batch(guardian.core.batch_id(0)) is None


def test_a_release_waits_for_the_seeds_of_the_parties_it_names(guardian: ReleaseGuardianServer) -> None:
    """A teacher sends its seed to the guardian and its share to the student at once, so the student may ask
    for a release before a seed it names has arrived: the guardian waits for it (up to the share deadline)
    instead of refusing, then charges once."""
    vectors = _vectors(guardian.protocol)
    shares = {"hospital-a": guardian.contribute("r1", "hospital-a", vectors["hospital-a"])}
    answers: list[pb.ReleaseReply] = []
    asking = threading.Thread(target=lambda: answers.append(guardian.release("r1", list(vectors))))
    asking.start()
    time.sleep(0.2)  # the release waits at the guardian meanwhile
    assert asking.is_alive() and guardian.entries() == 0
    shares["hospital-b"] = guardian.contribute("r1", "hospital-b", vectors["hospital-b"])
    asking.join(timeout=10)
    assert answers and not answers[0].replayed and guardian.entries() == 3
    mechanism = guardian.protocol.mechanism
    noise = mechanism.noise_part(party_noise("guardian", seed=SEED))
    noise = noise + mechanism.noise_part(party_noise("student", seed=SEED))
    total = reveal([_half(guardian, list(shares.values()))], ndarray_from_proto(answers[0].masked))
    np.testing.assert_array_equal(total, vectors["hospital-a"] + vectors["hospital-b"] + noise)
    # A seed retried after the charge is not kept (the attempt's seeds are never used again).
    late = pb.SubmitContributionRequest(release_id="r1", party="hospital-a", seed=b"\3" * 16,
                                        length=guardian.protocol.length)  # fmt: skip
    assert guardian.stub("hospital-a").SubmitContribution(late, timeout=10).received == 0


def test_bad_contributions_and_requests_change_nothing(guardian: ReleaseGuardianServer) -> None:
    vector = _vectors(guardian.protocol)["hospital-a"]
    length = guardian.protocol.length
    assert _code(lambda: guardian.contribute("r", "hospital-a", vector, length=length + 1)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    guardian.contribute("r", "hospital-a", vector)
    assert _code(lambda: guardian.contribute("r", "hospital-a", vector)) == grpc.StatusCode.ALREADY_EXISTS
    # the same seed again is a retry of the same contribution (accepted, nothing new); another is refused
    same = pb.SubmitContributionRequest(release_id="r2", party="hospital-a", seed=b"\1" * 16, length=length)
    for _ in range(2):
        guardian.stub("hospital-a").SubmitContribution(same, timeout=10)
    other = pb.SubmitContributionRequest(release_id="r2", party="hospital-a", seed=b"\2" * 16, length=length)
    assert _code(lambda: guardian.stub("hospital-a").SubmitContribution(other, timeout=10)) == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    # hospital-b never sent its seed: refused after the share deadline (FAILED_PRECONDITION, naming it), for a
    # stranger or twice the same party, or below the quorum (INVALID_ARGUMENT)
    with pytest.raises(grpc.RpcError) as refused:
        guardian.release("r", ["hospital-a", "hospital-b"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (MISSING_SEEDS_KEY, "hospital-b") in tuple(refused.value.trailing_metadata() or ())
    assert (
        _code(lambda: guardian.release("r", ["hospital-a", "outsider"])) == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert _code(lambda: guardian.release("r", ["hospital-a", "hospital-a"])) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert _code(lambda: guardian.release("r", ["hospital-a"])) == grpc.StatusCode.INVALID_ARGUMENT
    # roles: a teacher may not release, the student may not contribute, a teacher not for another party
    assert _code(
        lambda: guardian.stub("hospital-a").Release(pb.ReleaseRequest(release_id="r"), timeout=10)
    ) == (grpc.StatusCode.PERMISSION_DENIED)
    forged = pb.SubmitContributionRequest(release_id="r", party="hospital-b", seed=b"\0" * 16, length=length)
    assert _code(lambda: guardian.stub("hospital-a").SubmitContribution(forged, timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert _code(lambda: guardian.stub("student").SubmitContribution(forged, timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert guardian.entries() == 0


def test_budget_names_the_noise_and_the_sampler_delta(guardian: ReleaseGuardianServer) -> None:
    budget = guardian.core.budget()
    sampler = guardian.protocol.sampler_delta(epsilon=BUDGET["epsilon"])
    assert 0 < sampler < 1e-15  # tables within 2^-90 of the exact sampler, a few dozen draws
    assert budget["delta_total"] == budget["delta"] + sampler
    assert (budget["noise"], budget["noise_secure"]) == ("SeededNoise", False)
    assert budget["mechanism"]["rho"] == pytest.approx(RHO)
