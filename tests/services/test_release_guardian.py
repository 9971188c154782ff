"""The release guardian behind real mutual-TLS gRPC on a real ledger file: one charge buys one noisy total.

A release is charged durably before its masked total leaves; a replayed id, a second seed, a wrong length,
an unknown party, a release asked before the seeds arrived and one the budget cannot pay are each refused
with a precise status, and none of them charges anything or reveals anything.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from release_harness import BUDGET, RHO, SEED, ReleaseGuardianServer

from capc_common.aggregation import party_noise
from capc_common.federation.releases import ReleaseProtocol
from capc_common.mechanisms import reveal
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_from_proto


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


def test_release_is_the_noisy_sum_charged_once(guardian: ReleaseGuardianServer) -> None:
    vectors = _vectors(guardian.protocol)
    shares = [guardian.contribute("r1", p, v) for p, v in vectors.items()]
    reply = guardian.release("r1", ["hospital-b", "hospital-a"])
    noise = guardian.protocol.mechanism.guardian_noise(party_noise("guardian", seed=SEED))
    total = reveal(shares, ndarray_from_proto(reply.masked))
    np.testing.assert_array_equal(total, vectors["hospital-a"] + vectors["hospital-b"] + noise)
    rdp = guardian.protocol.release_rdp(BUDGET["order"])
    assert reply.charged_rdp == pytest.approx(rdp)
    summary = guardian.ledger.summary()
    assert summary["spent_rdp"] == pytest.approx(rdp, rel=1e-9)
    assert guardian.ledger.batch("r1").state == "settled"
    # The same id again (the reply was lost on the way): the same bytes, nothing charged twice, no new noise.
    entries = guardian.entries()
    again = guardian.release("r1", ["hospital-a", "hospital-b"])
    assert again.masked == reply.masked and again.charged_rdp == reply.charged_rdp
    assert _code(lambda: guardian.contribute("r1", "hospital-a", vectors["hospital-a"])) == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    assert guardian.entries() == entries
    assert guardian.ledger.summary()["spent_rdp"] == summary["spent_rdp"]


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
    vectors = _vectors(guardian.protocol)
    for release_id in ("first", "second"):
        for party, vector in vectors.items():
            guardian.contribute(release_id, party, vector)
    guardian.release("first", list(vectors))
    entries, spent = guardian.entries(), guardian.ledger.summary()["spent_rdp"]
    with pytest.raises(grpc.RpcError) as info:
        guardian.release("second", list(vectors))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "second" in info.value.details()
    assert (guardian.entries(), guardian.ledger.summary()["spent_rdp"]) == (entries, spent)
    assert guardian.ledger.batch("second") is None


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
    # hospital-b never sent its seed: asked too early (FAILED_PRECONDITION), for a stranger or twice the same
    # party, or below the quorum (INVALID_ARGUMENT)
    assert _code(lambda: guardian.release("r", ["hospital-a", "hospital-b"])) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
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
