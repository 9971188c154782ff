"""A teacher party's worker: regenerates queries, votes with all its heads, shares, refuses what it must."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from guardian_harness import GUARDIAN_TEST_FEDERATION, Setup, server_auth, tls_files

from capc_common.federation import FederationConfig, batch_plan, load_shared_backbone, mpc_config
from capc_common.learn.heads import train_heads
from capc_common.mechanisms import HeadsVoter
from capc_common.models import extract_features
from capc_common.mpc import expand_share_seed, sum_shares
from capc_common.wire import RawQuery, query_to_proto, rpc
from capc_common.wire import messages as pb
from capc_services.common.metrics import PartyMetrics
from capc_services.common.runtime import start_grpc_server
from capc_services.local.provision import free_port
from capc_services.student.links import Answer, TeacherRegistry
from capc_services.student.servicer import POLICY as STUDENT_POLICY
from capc_services.student.servicer import StudentServicer
from capc_services.student.servicer import add_to_server as add_student
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.client import TeacherLinks
from capc_services.teacher.worker import TeacherWorker
from capc_services.tls import certificate_info


@pytest.fixture(scope="module")
def heads_and_backbone(tmp_path_factory):
    """Two heads over the shared scattering backbone, trained on a few synthetic images with fixed labels."""
    from capc_common.models import load_backbone
    from capc_common.synth import generate

    backbone = load_backbone("scatter-28x28x1")
    images = generate("dead_leaves", seed=3, start=0, count=64, height=28, width=28, channels=1)
    features = extract_features(backbone, images, bn_batch=32, mode="current")
    labels = np.arange(64) % 10
    heads = train_heads(features, labels, owners=np.arange(64) % 2, heads=2, classes=10)
    return heads, backbone


def _worker(
    tmp_path: Path, pki: Path, config: FederationConfig, heads, *, cap: float = 1e6, raw: bool = False
):
    metrics = PartyMetrics(
        party="hospital-a",
        role="teacher",
        config_hash=config.config_hash(),
        certificate=certificate_info(pki / "hospital-a.crt"),
    )
    return TeacherWorker(
        config=config,
        voter=HeadsVoter(load_shared_backbone(config), heads, classes=config.classes),
        cap=LocalCap(LocalCap.init(tmp_path / "cap.jsonl", config=config), config=config, epsilon_cap=cap),
        metrics=metrics,
        allow_raw_queries=raw,
    )


QUERIES = {
    "generator": "dead_leaves",
    "seed": 7,
    "total": 64,
    "batch_size": 32,
    "bn_batch": 16,
    "height": 28,
    "width": 28,
    "channels": 1,
}


@pytest.fixture
def config(federation_dict, heads_and_backbone) -> FederationConfig:
    _, backbone = heads_and_backbone
    return FederationConfig.from_dict(
        federation_dict(
            teachers=[{"name": "hospital-a", "heads": 2}, {"name": "hospital-b", "heads": 3}],
            mechanism={"threshold": 3, "sigma1": 4.0, "sigma2": 4.0},
            backbone={"name": "scatter-28x28x1", "sha256": backbone.sha256},
            queries={
                "generator": "dead_leaves",
                "seed": 7,
                "total": 64,
                "batch_size": 32,
                "bn_batch": 16,
                "height": 28,
                "width": 28,
                "channels": 1,
            },
        )
    )


def _item(config: FederationConfig, query) -> pb.WorkItem:
    return pb.WorkItem(
        batch_id="b0", attempt=1, query=query_to_proto(query), ring_width=mpc_config(config).width, classes=10
    )


def test_votes_are_the_heads_one_hot_sum_split_between_student_and_guardian(
    tmp_path: Path, pki: Path, config: FederationConfig, heads_and_backbone
) -> None:
    # Prepare
    heads, backbone = heads_and_backbone
    worker = _worker(tmp_path, pki, config, heads)
    plan = batch_plan(config, first_index=16, count=32)
    seeds: list[tuple] = []
    # Execute
    reply = worker.answer(_item(config, plan.spec), submit_seed=lambda *args: seeds.append(args))
    # Assert
    assert reply.WhichOneof("kind") == "share"
    ((batch_id, attempt, seed, shape),) = seeds
    assert (batch_id, attempt, shape) == ("b0", 1, (32, 10))
    from capc_common.wire import ndarray_from_proto

    width = mpc_config(config).width
    student = ndarray_from_proto(reply.share.share)
    votes = sum_shares([student, expand_share_seed(seed, shape=shape, width=width)], width=width)
    features = extract_features(backbone, plan.spec.images(), bn_batch=16, mode="current")
    predictions = heads.predict(features)
    expected = np.stack([np.bincount(predictions[:, i], minlength=10) for i in range(32)])
    np.testing.assert_array_equal(votes, expected)
    assert worker.cap.batches == 1 and worker.stats.answered == 1


def test_raw_queries_are_refused_unless_the_site_allows_them(
    tmp_path: Path, pki: Path, config: FederationConfig, heads_and_backbone
) -> None:
    heads, _ = heads_and_backbone
    raw = RawQuery(images=np.zeros((16, 28, 28, 1), np.uint8), bn_batch=16)
    refused = _worker(tmp_path, pki, config, heads).answer(_item(config, raw), submit_seed=lambda *a: None)
    assert refused.refusal.reason == pb.RefusalReason.Value("REFUSAL_REASON_RAW_QUERIES_NOT_ALLOWED")
    allowed = _worker(tmp_path / "b", pki, config, heads, raw=True)
    assert allowed.answer(_item(config, raw), submit_seed=lambda *a: None).WhichOneof("kind") == "share"


def test_specs_that_contradict_the_federation_and_the_local_cap_are_refused(
    tmp_path: Path, pki: Path, config: FederationConfig, heads_and_backbone
) -> None:
    heads, _ = heads_and_backbone
    worker = _worker(tmp_path, pki, config, heads, cap=1.0)
    other = batch_plan(config, first_index=0, count=16).spec.to_dict() | {"generator": "gaussian"}
    from capc_common.synth import SyntheticSpec

    reply = worker.answer(_item(config, SyntheticSpec.from_dict(other)), submit_seed=lambda *a: None)
    assert reply.refusal.reason == pb.RefusalReason.Value("REFUSAL_REASON_INVALID_QUERY")
    assert "does not match federation.yaml" in reply.refusal.detail
    capped = worker.answer(
        _item(config, batch_plan(config, first_index=0, count=16).spec), submit_seed=lambda *a: None
    )
    assert capped.refusal.reason == pb.RefusalReason.Value("REFUSAL_REASON_LOCAL_BUDGET_EXHAUSTED")
    assert worker.cap.batches == 0


class TeacherOfStudent:
    """A teacher party's links to a real student gRPC server (which dispatches its work), and to a guardian
    address where nothing listens until :meth:`start_guardian`."""

    def __init__(self, tmp_path: Path, pki: Path, config: FederationConfig, heads) -> None:
        self.tmp_path, self.pki, self.config = tmp_path, pki, config
        self.student_port, self.guardian_port = free_port(), free_port()
        self.start_student()
        self.worker = _worker(tmp_path, pki, config, heads)
        self.links = TeacherLinks(
            config=config,
            party="hospital-a",
            tls=tls_files(pki, "hospital-a"),
            student_address=f"127.0.0.1:{self.student_port}",
            guardian_address=f"127.0.0.1:{self.guardian_port}",
            worker=self.worker,
        )
        self.stop = threading.Event()
        threading.Thread(target=self.links.run, args=(self.stop,), daemon=True).start()
        assert self.connected(timeout=30)
        self.guardian: Setup | None = None

    def start_student(self) -> None:
        """(Re)start the student's gRPC server on its port, with a registry of its own."""
        self.registry = TeacherRegistry()
        self.student = start_grpc_server(
            bind=f"127.0.0.1:{self.student_port}",
            tls=tls_files(self.pki, "student"),
            register=[add_student(StudentServicer(config=self.config, registry=self.registry))],
            services=[rpc.STUDENT_SERVICE],
            interceptors=[server_auth(self.pki, "student", self.config, STUDENT_POLICY)],
        )

    def connected(self, *, timeout: float) -> bool:
        """Whether the party's work stream reaches the running student within ``timeout`` seconds."""
        return self.registry.wait_for(1, timeout=timeout, stop=threading.Event())

    def start_guardian(self) -> Setup:
        self.guardian = Setup(self.pki, self.tmp_path, self.config, bind=f"127.0.0.1:{self.guardian_port}")
        return self.guardian

    def ask(self, plan) -> Answer:
        """Send one batch to the party through the student's registry, as the scheduler does."""
        item = pb.WorkItem(
            batch_id=plan.batch_id,
            attempt=1,
            query=plan.query_proto(),
            ring_width=mpc_config(self.config).width,
            classes=self.config.classes,
        )
        collection = self.registry.dispatch(item)
        try:
            return collection.wait(timeout=60)["hospital-a"]
        finally:
            self.registry.finish(collection)

    def close(self) -> None:
        self.stop.set()
        self.links.close()
        self.registry.close_all()
        self.student.stop(0)
        if self.guardian is not None:
            self.guardian.close()


ONE_PARTY_QUORUM = {"min_parties": 1, "vote_deadline_s": 3, "share_deadline_s": 3}


@pytest.fixture
def teacher_of_student(tmp_path: Path, pki: Path, federation_dict, heads_and_backbone) -> Iterator:
    """A one-party federation whose guardian is not started yet (``vote_deadline_s`` 3)."""
    heads, backbone = heads_and_backbone
    config = FederationConfig.from_dict(
        federation_dict(
            teachers=[{"name": "hospital-a", "heads": 2}],
            backbone={"name": "scatter-28x28x1", "sha256": backbone.sha256},
            **{**GUARDIAN_TEST_FEDERATION, "quorum": ONE_PARTY_QUORUM},
        )
    )
    party = TeacherOfStudent(tmp_path, pki, config, heads)
    yield party
    party.close()


def test_a_party_started_before_the_guardian_answers_once_it_listens(teacher_of_student) -> None:
    # `capc local up` starts every party at once and polls each one's /readyz, whose guardian check found
    # nothing listening yet: the party's guardian link backs off between attempts to connect.
    party = teacher_of_student
    probing = time.monotonic() + 3
    while time.monotonic() < probing:
        assert party.links.guardian_problem(timeout=0.25)
    guardian = party.start_guardian()
    plan = batch_plan(party.config, first_index=0, count=32)
    guardian.student.open_batch(plan.batch_id, count=plan.count, digest=plan.digest)
    # The student opens its first batch as soon as the guardian listens: the party answers it (it used to
    # refuse it, GUARDIAN_UNAVAILABLE, its cap charged, and the batch failed its quorum).
    answer = party.ask(plan)
    assert answer.share is not None, answer.refusal
    assert party.worker.cap.batches == 1 and party.worker.stats.refused == 0


def test_a_guardian_that_never_comes_costs_the_party_nothing(teacher_of_student) -> None:
    party = teacher_of_student
    started = time.monotonic()
    answer = party.ask(batch_plan(party.config, first_index=0, count=32))
    # Refused after waiting the vote deadline for the guardian, before charging or computing anything.
    assert answer.share is None and answer.refusal.startswith("guardian_unavailable: ")
    assert "did not accept a TLS connection within 3 s" in answer.refusal
    assert "nothing was charged" in answer.refusal
    assert party.worker.cap.batches == 0 and party.worker.cap.epsilon == 0
    assert 2.5 < time.monotonic() - started < 30


def test_a_student_restarted_twice_gets_its_teacher_back_at_once(teacher_of_student) -> None:
    party = teacher_of_student
    # A first outage long enough for the party's reconnection backoff to grow to its cap.
    party.student.stop(0)
    time.sleep(4)
    party.start_student()
    assert party.connected(timeout=30)
    # Restarted again soon after, the student has its teacher back within ~1 s (its backoff started afresh
    # with the welcomed session: it used to stay at 5 s until a session had lasted 30 s).
    party.student.stop(0)
    time.sleep(0.8)
    party.start_student()
    back = time.monotonic()
    assert party.connected(timeout=30)
    assert time.monotonic() - back < 2.5


def test_a_guardian_under_another_config_makes_the_party_not_ready_and_says_why(teacher_of_student) -> None:
    """Mid-way through a membership change the guardian already runs the new federation.yaml: the party's
    readiness probe says so (both hashes) instead of raising — its /readyz answered 500 with a traceback."""
    party = teacher_of_student
    changed = party.config.model_copy(update={"name": "after-the-change"})
    party.guardian = Setup(party.pki, party.tmp_path, changed, bind=f"127.0.0.1:{party.guardian_port}")
    problem = party.links.guardian_problem(timeout=10)
    assert problem.startswith("answers, but this party refuses it (guardian runs federation config ")
    assert changed.config_hash()[:16] in problem and party.config.config_hash()[:16] in problem
