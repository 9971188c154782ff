"""The release federation's gRPC methods under malformed, boundary and wrong-role input (Hypothesis).

The guardian's ``SubmitContribution``, ``Release``, ``DepositRelease`` and ``ReleaseRecord`` and the
student's ``NextRelease`` and ``SubmitContributionShare`` run on their real servicers behind the identity
interceptor, over mutual TLS on loopback, the guardian on a real ledger file. Each call must end with a
deliberate status — never INTERNAL or UNKNOWN (an unhandled exception) and never a hang; a refused call
charges nothing and keeps nothing; afterwards the ledger still verifies and both servers still answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fuzz_harness import DIMENSIONS, FUZZ, IDS, PARTIES, UINT64, assert_precise, status
from hypothesis import given
from hypothesis import strategies as st
from release_harness import ReleaseGuardianServer, ReleaseStudentServer

from capc_common.mpc.sharing import SEED_BYTES
from capc_common.wire import messages as pb
from capc_common.wire import rpc

TEACHER_CNS = frozenset({"hospital-a", "hospital-b"})
TEACHERS = st.sampled_from(sorted(TEACHER_CNS))
ALLOWED = {
    "SubmitContribution": TEACHER_CNS,
    "Release": frozenset({"student"}),
    "DepositRelease": frozenset({"student"}),
    "ReleaseRecord": frozenset({"student"}),
    "NextRelease": TEACHER_CNS,
    "SubmitContributionShare": TEACHER_CNS,
}
"""Who may call each release method (the guardian's and the student's RELEASE_POLICY)."""
CLAIMED = st.sampled_from(["", "hospital-a", "hospital-b", "student", "x" * 300])
FUNDED = ("funded-1", "funded-2")
"""Attempts both teachers seeded: the plan's one round is paid once, whichever asks first."""
RELEASE_IDS = st.one_of(st.sampled_from(FUNDED), IDS)
ROUNDS = st.one_of(st.just(0), st.integers(0, 2**32 - 1))


@pytest.fixture(scope="module")
def release(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    guardian = ReleaseGuardianServer(pki, tmp_path_factory.mktemp("release-fuzz"))
    length = guardian.protocol.length
    for release_id in FUNDED:
        for party in guardian.config.teacher_names:
            guardian.contribute(release_id, party, np.zeros(length, dtype=np.int64))
    student = ReleaseStudentServer(pki, guardian.config, length=length)
    yield {"guardian": guardian, "student": student, "length": length}
    student.close()
    guardian.close()


def _ledger(guardian: ReleaseGuardianServer) -> tuple[int, float]:
    summary = guardian.ledger.summary()
    return int(summary["entries"]), float(summary["spent_rdp"])


def _guardian_call(
    release: dict[str, Any], caller: str, call: Any, *, release_call: bool = False
) -> grpc.StatusCode:
    """Run one call against the guardian: a precise status, nothing charged unless it is a release that
    succeeded, the ledger verifies and the guardian still answers."""
    guardian: ReleaseGuardianServer = release["guardian"]
    before = _ledger(guardian)
    code = status(call)
    assert_precise(code, caller)
    if code != grpc.StatusCode.OK or not release_call:
        assert _ledger(guardian) == before, f"{caller}: refused or not a release ({code}) yet charged"
    report = guardian.ledger.verify()
    assert report.ok, report.problems
    alive = pb.SubmitContributionRequest(release_id="", party="", seed=b"", length=0)
    assert status(lambda: guardian.stub("hospital-a").SubmitContribution(alive, timeout=10)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    return code


@FUZZ
@given(
    caller=TEACHERS,
    release_id=RELEASE_IDS,
    party=CLAIMED,
    seed=st.one_of(st.binary(max_size=40), st.binary(min_size=SEED_BYTES, max_size=SEED_BYTES)),
    length=st.one_of(UINT64, st.none()),
    round=ROUNDS,
)
def test_submit_contribution(
    release: dict[str, Any],
    caller: str,
    release_id: str,
    party: str,
    seed: bytes,
    length: int | None,
    round: int,
) -> None:
    length = release["length"] if length is None else length  # the right length, too
    request = pb.SubmitContributionRequest(
        release_id=release_id, party=party, seed=seed, length=length, round=round
    )
    stub = release["guardian"].stub(caller)
    _guardian_call(release, caller, lambda: stub.SubmitContribution(request, timeout=10))


def _ask_release(
    release: dict[str, Any], release_id: str, parties: list[str], round: int = 0
) -> grpc.StatusCode:
    """The student asks for a round; a newly paid one is on the ledger (reserve, begin, settle) before it
    answered, one paid before is answered from its receipt, charging nothing."""
    guardian: ReleaseGuardianServer = release["guardian"]
    request = pb.ReleaseRequest(release_id=release_id, parties=parties, round=round)
    before = _ledger(guardian)[0]
    stub = guardian.stub("student")
    replies: list[pb.ReleaseReply] = []
    code = _guardian_call(
        release, "student", lambda: replies.append(stub.Release(request, timeout=10)), release_call=True
    )
    if code == grpc.StatusCode.OK:
        assert round == 0
        assert _ledger(guardian)[0] == before + (0 if replies[0].replayed else 3)
        assert replies[0].replayed or sorted(parties) == ["hospital-a", "hospital-b"]
    return code


@FUZZ
@given(release_id=RELEASE_IDS, parties=PARTIES, round=ROUNDS)
def test_release(release: dict[str, Any], release_id: str, parties: list[str], round: int) -> None:
    _ask_release(release, release_id, parties, round)


@FUZZ
@given(data=st.data(), round=ROUNDS, release_id=RELEASE_IDS)
def test_deposit_release(release: dict[str, Any], data: st.DataObject, round: int, release_id: str) -> None:
    """A deposit adds no ledger entry, whatever it holds; only the charged attempt's well-formed total of the
    plan's round is kept, once."""
    total = data.draw(_arrays(release["length"]))
    request = pb.DepositReleaseRequest(round=round, release_id=release_id, total=total)
    stub = release["guardian"].stub("student")
    code = _guardian_call(release, "student", lambda: stub.DepositRelease(request, timeout=10))
    if code == grpc.StatusCode.OK:
        assert round == 0


@FUZZ
@given(round=ROUNDS)
def test_release_record(release: dict[str, Any], round: int) -> None:
    stub = release["guardian"].stub("student")
    request = pb.ReleaseRecordRequest(round=round)
    code = _guardian_call(release, "student", lambda: stub.ReleaseRecord(request, timeout=10))
    assert (code == grpc.StatusCode.OK) == (round == 0), code


def test_the_plan_pays_one_release(release: dict[str, Any]) -> None:
    """Whatever the fuzzing paid before, asking the plan's one round under both funded attempts ends with
    exactly one release on the ledger, the other answered from its receipt, and a second round refused."""
    codes = [_ask_release(release, r, ["hospital-a", "hospital-b"]) for r in FUNDED]
    assert codes == [grpc.StatusCode.OK, grpc.StatusCode.OK], codes
    assert _ledger(release["guardian"])[0] == 3
    assert _ask_release(release, FUNDED[0], ["hospital-a", "hospital-b"], 1) == grpc.StatusCode.OUT_OF_RANGE


def _student_call(
    release: dict[str, Any], caller: str, call: Any, *, share_call: bool = False
) -> grpc.StatusCode:
    """Run one call against the student: a precise status; a refused share is not kept (the open release is
    still offered to every teacher) and the student still answers."""
    student: ReleaseStudentServer = release["student"]
    code = status(call)
    assert_precise(code, caller)
    if code == grpc.StatusCode.OK and share_call:  # kept: a fresh release for the next call
        student.rounds.open(f"open-{secrets.token_hex(4)}", round=0, state=np.zeros(1))
    for teacher in ("hospital-a", "hospital-b"):
        offered = student.stub(teacher).NextRelease(pb.NextReleaseRequest(party=teacher), timeout=10)
        assert offered.release_id.startswith("open") and not offered.pending, offered
    return code


def _arrays(length: int) -> st.SearchStrategy[pb.NdArray]:
    # The right dtype and shape, every coordinate in the ring [0, 2^62) but perhaps one at or past its edges.
    fitting = st.builds(
        lambda at, value: pb.NdArray(
            dtype="int64",
            shape=[length],
            data=np.where(np.arange(length) == at, value, 2**62 - 1).astype(np.int64).tobytes(),
        ),
        st.integers(0, length),  # ``length``: no coordinate replaced
        st.sampled_from([0, -1, 2**62, 2**63 - 1, -(2**63)]),
    )
    odd = st.builds(
        lambda dtype, shape, data: pb.NdArray(dtype=dtype, shape=shape, data=data),
        st.sampled_from(["int64", "int64", "uint64", "int8", "object", "", "<i8", "nonsense"]),
        st.lists(DIMENSIONS, min_size=1, max_size=3),
        st.sampled_from([b"", b"", b"\0" * 8, b"\0" * 8 * length, b"\xff" * 7]),
    )
    empty = st.builds(  # no bytes for a shape whose size is 0 or overflows 64 bits
        lambda shape: pb.NdArray(dtype="int64", shape=shape, data=b""),
        st.lists(st.sampled_from([0, 2**32, 2**40, 2**62, 2**63 - 1]), min_size=2, max_size=3),
    )
    deep = st.just(
        pb.NdArray(dtype="int64", shape=[1] * 65, data=b"\0" * 8)
    )  # more dimensions than numpy holds
    return st.one_of(fitting, odd, empty, deep, st.just(pb.NdArray()))


@FUZZ
@given(data=st.data(), caller=TEACHERS, party=CLAIMED, release_id=st.one_of(st.just("open"), IDS))
def test_submit_contribution_share(
    release: dict[str, Any], data: st.DataObject, caller: str, party: str, release_id: str
) -> None:
    student: ReleaseStudentServer = release["student"]
    if release_id == "open":  # aim at the release open now
        release_id = student.rounds.next_for("hospital-b", timeout=0).release_id
    share = data.draw(_arrays(release["length"]))
    request = pb.ContributionShare(release_id=release_id, party=party, share=share)
    stub = student.stub(caller)
    code = _student_call(
        release, caller, lambda: stub.SubmitContributionShare(request, timeout=10), share_call=True
    )
    if code == grpc.StatusCode.OK:
        assert party in ("", caller)


@FUZZ
@given(caller=TEACHERS, party=CLAIMED)
def test_next_release(release: dict[str, Any], caller: str, party: str) -> None:
    stub = release["student"].stub(caller)
    code = _student_call(
        release, caller, lambda: stub.NextRelease(pb.NextReleaseRequest(party=party), timeout=10)
    )
    assert (code == grpc.StatusCode.OK) == (party in ("", caller)), code


@FUZZ
@given(
    method=st.sampled_from(list(ALLOWED)),
    caller=st.sampled_from(["hospital-a", "hospital-b", "student", "guardian", "outsider"]),
    party=CLAIMED,
)
def test_callers_of_another_role(release: dict[str, Any], method: str, caller: str, party: str) -> None:
    """Every release method refuses a certificate of the wrong role before it reads the request."""
    if caller in ALLOWED[method]:
        caller = "outsider"  # a certificate of this CA whose CN is no party of the federation
    server = "student" if method in ("NextRelease", "SubmitContributionShare") else "guardian"
    service = rpc.GUARDIAN_SERVICE if server == "guardian" else rpc.STUDENT_SERVICE
    # The interceptor decides on the method's name and the certificate alone: the body is a fitting one.
    request = {
        "SubmitContribution": pb.SubmitContributionRequest(
            release_id=FUNDED[0], party=party, seed=b"\0" * SEED_BYTES, length=release["length"]
        ),
        "Release": pb.ReleaseRequest(release_id=FUNDED[0], parties=["hospital-a", "hospital-b"]),
        "DepositRelease": pb.DepositReleaseRequest(round=0, release_id=FUNDED[0]),
        "ReleaseRecord": pb.ReleaseRecordRequest(round=0),
        "NextRelease": pb.NextReleaseRequest(party=party),
        "SubmitContributionShare": pb.ContributionShare(release_id="open", party=party),
    }[method]
    call = release[server].channels.get(caller).unary_unary(f"/{service}/{method}")
    check = _guardian_call if server == "guardian" else _student_call
    code = check(release, caller, lambda: call(request.SerializeToString(), timeout=10))
    assert code == grpc.StatusCode.PERMISSION_DENIED, (method, caller, code)


@FUZZ
@given(
    method=st.sampled_from(
        [
            ("guardian", rpc.GUARDIAN_SERVICE, "SubmitContribution", "hospital-a"),
            ("guardian", rpc.GUARDIAN_SERVICE, "Release", "student"),
            ("guardian", rpc.GUARDIAN_SERVICE, "DepositRelease", "student"),
            ("guardian", rpc.GUARDIAN_SERVICE, "ReleaseRecord", "student"),
            ("student", rpc.STUDENT_SERVICE, "NextRelease", "hospital-a"),
            ("student", rpc.STUDENT_SERVICE, "SubmitContributionShare", "hospital-a"),
        ]
    ),
    raw=st.binary(min_size=1, max_size=200),
)
def test_undecodable_requests(release: dict[str, Any], method: tuple[str, str, str, str], raw: bytes) -> None:
    server, service, name, caller = method
    call = release[server].channels.get(caller).unary_unary(f"/{service}/{name}")  # bytes in, bytes out
    check = _guardian_call if server == "guardian" else _student_call
    check(release, caller, lambda: call(raw, timeout=10))
