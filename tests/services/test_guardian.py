"""The guardian over real mutual-TLS gRPC: ledger, quorum, commit-before-reveal, idempotent ids, budget."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from guardian_harness import GUARDIAN_TEST_FEDERATION, SEED, Setup
from guardian_harness import digest as _digest
from guardian_harness import votes as _votes
from prometheus_client import generate_latest

from capc_common.aggregation import draw_confident_noise, draw_student_noise, party_noise
from capc_common.errors import BudgetExhaustedError, InputError
from capc_common.federation import FederationConfig, batch_costs, mpc_config
from capc_common.mechanisms import confident_rule
from capc_common.mpc import Channel, EvaluatorSession, channel_pair, sum_shares
from capc_common.privacy import SystemNoise
from capc_common.wire import messages as pb
from capc_services.student.guardian_client import BatchRefused


@pytest.fixture
def setup(pki: Path, tmp_path: Path, federation_dict) -> Iterator[Setup]:
    s = Setup(pki, tmp_path, FederationConfig.from_dict(federation_dict(**GUARDIAN_TEST_FEDERATION)))
    yield s
    s.close()


def test_batches_give_the_plaintext_labels_and_charge_the_ledger(setup: Setup) -> None:
    # Prepare
    config, rng = setup.config, np.random.default_rng(1)
    guardian_noise, student_noise = party_noise("guardian", seed=SEED), party_noise("student", seed=SEED)
    costs = batch_costs(config)
    for index, count in enumerate((32, 16)):
        batch_id = f"b{index}"
        votes = {"hospital-a": _votes(rng, 2, count), "hospital-b": _votes(rng, 3, count)}
        # Execute
        reply = setup.student.open_batch(batch_id, count=count, digest=_digest(batch_id))
        shares = setup.share(batch_id, votes)
        labels, agreed, nbytes = setup.student.compute(batch_id, attempt=1, shares=shares)
        # Assert
        z1, z2 = draw_confident_noise(
            guardian_noise,
            batch=count,
            classes=10,
            sigma1=config.mechanism.sigma1,
            sigma2=config.mechanism.sigma2,
        )
        z1 = z1 + draw_student_noise(student_noise, batch=count, sigma1=config.mechanism.sigma1)
        want = confident_rule(
            votes["hospital-a"] + votes["hospital-b"], threshold=config.mechanism.threshold, z1=z1, z2=z2
        )
        np.testing.assert_array_equal(labels, want)
        assert agreed == ("hospital-a", "hospital-b")
        assert nbytes > 0
        assert reply.reserved_rdp == pytest.approx(costs.worst_case(count))
        record = setup.ledger.batch(batch_id)
        assert record.state == "settled"
        assert record.answered == int((want >= 0).sum())
        assert record.actual_rdp == pytest.approx(costs.actual(count, record.answered), rel=1e-12, abs=1e-12)
    assert setup.student.status("b0").state == pb.BatchState.Value("BATCH_STATE_SETTLED")


def test_missing_seed_below_quorum_releases_the_batch_and_keeps_the_stream(setup: Setup) -> None:
    rng = np.random.default_rng(2)
    setup.student.open_batch("lonely", count=16, digest=_digest("lonely"))
    shares = setup.share("lonely", {"hospital-a": _votes(rng, 2, 16)})
    fake_b = shares["hospital-a"]  # the student believes b answered, but b's seed never reached the guardian
    with pytest.raises(BatchRefused, match=r"quorum not met: 1 of 2 .*hospital-b"):
        setup.student.compute("lonely", attempt=1, shares={**shares, "hospital-b": fake_b})
    assert setup.ledger.batch("lonely").state == "released"
    assert setup.ledger.summary()["spent_rdp"] == 0
    # the same Compute stream carries the next batch
    setup.student.open_batch("next", count=16, digest=_digest("next"))
    votes = {"hospital-a": _votes(rng, 2, 16), "hospital-b": _votes(rng, 3, 16)}
    labels, _, _ = setup.student.compute("next", attempt=1, shares=setup.share("next", votes))
    assert labels.shape == (16,)


def test_open_is_idempotent_and_bound_to_its_query(setup: Setup) -> None:
    first = setup.student.open_batch("b", count=16, digest=_digest("b"))
    again = setup.student.open_batch("b", count=16, digest=_digest("b"))
    assert again.state == first.state == pb.BatchState.Value("BATCH_STATE_OPEN")
    assert setup.ledger.summary()["open_batches"] == 1
    with pytest.raises(InputError, match="already open for another query"):
        setup.student.open_batch("b", count=16, digest=_digest("other"))
    assert setup.student.abort_batch("b", reason="test") == "released"
    reopened = setup.student.open_batch("b", count=16, digest=_digest("b"))
    assert reopened.state == pb.BatchState.Value("BATCH_STATE_RELEASED")
    # A finished id with another query is refused too (it used to answer with the old batch's state).
    for count, digest in ((16, _digest("other")), (32, _digest("b"))):
        with pytest.raises(InputError, match="already used for another query"):
            setup.student.open_batch("b", count=count, digest=digest)


def test_budget_exhaustion_names_requested_remaining_and_difference(setup: Setup, federation_dict) -> None:
    costs = batch_costs(setup.config)
    budget = setup.ledger.budget_rdp
    fits = int(budget // costs.worst_case(16))
    for index in range(fits):
        setup.student.open_batch(f"b{index}", count=16, digest=_digest(f"b{index}"))
    with pytest.raises(BudgetExhaustedError, match=r"needs RDP .* but only .* remains .* short by"):
        setup.student.open_batch("one-too-many", count=16, digest=_digest("x"))
    assert setup.ledger.batch("one-too-many") is None


def test_a_teacher_cannot_submit_for_another_party_or_act_as_student(setup: Setup) -> None:
    setup.student.open_batch("b", count=16, digest=_digest("b"))
    stub = setup.teacher_stub("hospital-a")
    request = pb.SubmitSharesRequest(
        batch_id="b", attempt=1, party="hospital-b", seed=b"\0" * 16, shape=[16, 10]
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitShares(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as info:
        stub.OpenBatch(pb.OpenBatchRequest(batch_id="x", count=16, query_digest=_digest("x")), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    bad = pb.SubmitSharesRequest(batch_id="b", attempt=1, party="hospital-a", seed=b"\0" * 15, shape=[16, 10])
    with pytest.raises(grpc.RpcError, match="16 bytes"):
        stub.SubmitShares(bad, timeout=10)


class _AnnouncingChannel(Channel):
    """The garbler's end of an in-memory pair that signals its first send (the session is under way)."""

    def __init__(self, inner: Channel) -> None:
        super().__init__()
        self._inner = inner
        self.sent = threading.Event()

    def _send(self, data: bytes) -> None:
        self._inner.send(data)
        self.sent.set()

    def _recv(self) -> bytes:
        return bytes(self._inner.recv())

    def close(self) -> None:
        self._inner.close()


def test_a_batch_is_agreed_and_computed_at_most_once(setup: Setup) -> None:
    # Two computations of one batch would reveal two labellings with fresh noise, yet the ledger's settle is
    # idempotent for the same answered count: one charge for two releases. The guardian must refuse the
    # second ComputeStart for a batch already agreed, and a second compute of a batch already started.
    guardian, config = setup.guardian, setup.config
    rng, count, parties = np.random.default_rng(7), 16, ("hospital-a", "hospital-b")
    setup.student.open_batch("once", count=count, digest=_digest("once"))
    shares = setup.share("once", {"hospital-a": _votes(rng, 2, count), "hospital-b": _votes(rng, 3, count)})
    agreed = guardian.agree(batch_id="once", attempt=1, parties=parties, actor="student")
    with pytest.raises(InputError, match="already being computed"):
        guardian.agree(batch_id="once", attempt=1, parties=parties, actor="student")
    assert setup.ledger.batch("once").state == "reserved"  # the refusal released nothing

    garbler_end, evaluator_end = channel_pair(timeout=10)
    first = _AnnouncingChannel(garbler_end)
    outcome: dict[str, object] = {}

    def compute(name: str, channel: Channel) -> None:
        try:
            outcome[name] = guardian.compute(
                batch_id="once",
                attempt=1,
                agreement=agreed,
                session=guardian.session(channel),
                actor="student",
            )
        except Exception as exc:  # recorded for the assertions below
            outcome[name] = exc

    one = threading.Thread(target=compute, args=("first", first))
    one.start()
    assert first.sent.wait(30)  # the first computation is under way
    second_garbler, _second_evaluator = channel_pair(timeout=5)
    two = threading.Thread(target=compute, args=("second", second_garbler))
    two.start()
    two.join(timeout=20)
    evaluator = EvaluatorSession(evaluator_end, mpc_config(config))
    labels = evaluator.run_batch(
        "once",
        share_sum=sum_shares([shares[p] for p in agreed.parties], width=evaluator.config.width),
        z1_student=draw_student_noise(SystemNoise(), batch=count, sigma1=config.mechanism.sigma1),
    )
    one.join(timeout=30)
    two.join(timeout=30)
    assert isinstance(outcome["second"], InputError), outcome["second"]
    assert "already" in str(outcome["second"])
    assert outcome["first"] == int((labels >= 0).sum())
    assert [e.kind for e in setup.ledger.entries(batch_id="once")] == ["reserve", "compute", "settle"]


def test_each_settle_logs_and_exports_the_ledger_head(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    """Pinned elsewhere (a log collector, Prometheus), the head lets `capc budget verify --expect-head`
    detect entries later cut from the ledger's end."""
    rng = np.random.default_rng(5)
    setup.student.open_batch("pin", count=16, digest=_digest("pin"))
    shares = setup.share("pin", {"hospital-a": _votes(rng, 2, 16), "hospital-b": _votes(rng, 3, 16)})
    with caplog.at_level(logging.INFO, logger="capc_services.guardian.core"):
        setup.student.compute("pin", attempt=1, shares=shares)
        deadline = time.monotonic() + 10  # the guardian logs once its side of the 2PC has returned
        while not (settled := [r for r in caplog.records if r.getMessage() == "batch settled"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    summary = setup.ledger.summary()
    assert [(r.ledger_entry, r.ledger_head) for r in settled] == [(summary["entries"], summary["head"])]
    exposition = generate_latest(setup.guardian.metrics.registry).decode()
    assert f'capc_ledger_head_info{{head="{summary["head"]}"}} 1.0' in exposition
    assert f"capc_ledger_entries {float(summary['entries'])}" in exposition
    for key in ("epsilon_settled", "epsilon_reserved", "epsilon_spent"):
        assert f"capc_{key} {summary[key]!r}" in exposition
