"""Guardian, student and two teacher parties in one process over real mutual-TLS gRPC: the pipelined
scheduler, labels equal to the plaintext rule, budget exhaustion with a shrunk tail, quorum, and resuming
after a restart without asking anything twice."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from guardian_harness import server_auth

from capc_common.aggregation import (
    draw_confident_noise,
    draw_student_noise,
    party_noise,
    vote_histogram,
)
from capc_common.federation import FederationConfig, batch_plan, load_shared_backbone
from capc_common.learn.heads import train_heads
from capc_common.mechanisms import HeadsVoter, confident_rule
from capc_common.models import extract_features
from capc_common.privacy import BudgetLedger
from capc_common.wire import rpc
from capc_services.common.metrics import PartyMetrics
from capc_services.common.runtime import start_grpc_server
from capc_services.guardian.core import Guardian
from capc_services.guardian.servicer import POLICY as GUARDIAN_POLICY
from capc_services.guardian.servicer import GuardianServicer
from capc_services.guardian.servicer import add_to_server as add_guardian
from capc_services.student.accounting import privacy_of
from capc_services.student.guardian_client import GuardianClient
from capc_services.student.links import TeacherRegistry
from capc_services.student.scheduler import Scheduler
from capc_services.student.servicer import POLICY as STUDENT_POLICY
from capc_services.student.servicer import StudentServicer
from capc_services.student.servicer import add_to_server as add_student
from capc_services.student.store import LabelStore
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.client import TeacherLinks
from capc_services.teacher.worker import TeacherWorker
from capc_services.tls import TlsFiles, certificate_info

NOISE = "student-flow"
HEADS = {"hospital-a": 2, "hospital-b": 3}


def _files(pki: Path, party: str) -> TlsFiles:
    return TlsFiles(ca=pki / "ca.crt", cert=pki / f"{party}.crt", key=pki / f"{party}.key")


def _metrics(pki: Path, party: str, config: FederationConfig) -> PartyMetrics:
    return PartyMetrics(
        party=party,
        role=party,
        config_hash=config.config_hash(),
        certificate=certificate_info(pki / f"{party}.crt"),
    )


@pytest.fixture(scope="module")
def trained_heads():
    from capc_common.models import load_backbone
    from capc_common.synth import generate

    backbone = load_backbone("scatter-28x28x1")
    images = generate("dead_leaves", seed=3, start=0, count=160, height=28, width=28, channels=1)
    features = extract_features(backbone, images, bn_batch=16, mode="current")
    labels = (images.reshape(160, -1).mean(axis=1) > images.mean()).astype(np.int64) * 3 + np.arange(160) % 2
    heads = train_heads(features, labels, owners=np.arange(160) % 5, heads=5, classes=10)
    split = {
        "hospital-a": type(heads)(heads.kind, {k: v[:2] for k, v in heads.params.items()}, 10),
        "hospital-b": type(heads)(heads.kind, {k: v[2:] for k, v in heads.params.items()}, 10),
    }
    return split, backbone.sha256


class Federation:
    """The three roles wired together in-process."""

    def __init__(
        self, tmp: Path, pki: Path, config: FederationConfig, heads: dict, *, caps: dict | None = None
    ):
        self.config, self.tmp, self.pki = config, tmp, pki
        tmp.mkdir(parents=True)
        self.ledger = BudgetLedger.open_or_create(
            tmp / "ledger.sqlite",
            epsilon_limit=config.budget.epsilon,
            delta=config.budget.delta,
            order=config.budget.order,
            config=config.model_dump(mode="json"),
        )
        guardian = Guardian(
            config=config,
            ledger=self.ledger,
            noise=party_noise("guardian", seed=NOISE),
            metrics=_metrics(pki, "guardian", config),
        )
        self.guardian_server = start_grpc_server(
            bind="127.0.0.1:0",
            tls=_files(pki, "guardian"),
            register=[add_guardian(GuardianServicer(guardian))],
            services=[rpc.GUARDIAN_SERVICE],
            interceptors=[server_auth(pki, "guardian", config, GUARDIAN_POLICY)],
        )
        self.registry = TeacherRegistry()
        self.student_server = start_grpc_server(
            bind="127.0.0.1:0",
            tls=_files(pki, "student"),
            register=[add_student(StudentServicer(config=config, registry=self.registry))],
            services=[rpc.STUDENT_SERVICE],
            interceptors=[server_auth(pki, "student", config, STUDENT_POLICY)],
        )
        self.guardian_address = f"127.0.0.1:{self.guardian_server.port}"
        # One student noise stream per federation, like the guardian's: a restarted scheduler continues it.
        self.student_noise = party_noise("student", seed=NOISE)
        self.stop = threading.Event()
        self.teachers: list[TeacherLinks] = []
        backbone = load_shared_backbone(config)
        for party, ensemble in heads.items():
            worker = TeacherWorker(
                config=config,
                voter=HeadsVoter(backbone, ensemble, classes=config.classes),
                cap=LocalCap(
                    LocalCap.init(tmp / f"{party}.cap", config=config),
                    config=config,
                    epsilon_cap=(caps or {}).get(party, 1e6),
                ),
                metrics=_metrics(pki, party, config),
            )
            links = TeacherLinks(
                config=config,
                party=party,
                tls=_files(pki, party),
                student_address=f"127.0.0.1:{self.student_server.port}",
                guardian_address=self.guardian_address,
                worker=worker,
            )
            threading.Thread(target=links.run, args=(self.stop,), daemon=True).start()
            self.teachers.append(links)

    def scheduler(self, store: LabelStore, *, depth: int = 1) -> Scheduler:
        client = GuardianClient(
            config=self.config,
            tls=_files(self.pki, "student"),
            address=self.guardian_address,
            noise=self.student_noise,
        )
        return Scheduler(
            config=self.config,
            store=store,
            registry=self.registry,
            guardian=client,
            metrics=_metrics(self.pki, "student", self.config),
            depth=depth,
            connect_timeout=30,
        )

    def close(self) -> None:
        self.stop.set()
        for links in self.teachers:
            links.close()
        self.registry.close_all()
        self.student_server.stop(0)
        self.guardian_server.stop(0)
        self.ledger.close()


def _config(federation_dict, sha: str, **overrides) -> FederationConfig:
    base = {
        "teachers": [{"name": p, "heads": h} for p, h in HEADS.items()],
        "mechanism": {"threshold": 2, "sigma1": 3.0, "sigma2": 3.0},
        "budget": {"epsilon": 400.0, "delta": 1e-5, "order": 10},
        "backbone": {"name": "scatter-28x28x1", "sha256": sha},
        "queries": {
            "generator": "dead_leaves",
            "seed": 11,
            "total": 128,
            "batch_size": 32,
            "bn_batch": 16,
            "height": 28,
            "width": 28,
            "channels": 1,
        },
        "quorum": {"min_parties": 2, "vote_deadline_s": 20, "share_deadline_s": 5},
    }
    return FederationConfig.from_dict(federation_dict(**{**base, **overrides}))


@pytest.fixture
def make(tmp_path: Path, pki: Path, trained_heads) -> Iterator:
    made: list[Federation] = []

    def _make(config: FederationConfig, **kwargs) -> Federation:
        federation = Federation(tmp_path / f"f{len(made)}", pki, config, trained_heads[0], **kwargs)
        made.append(federation)
        return federation

    yield _make
    for federation in made:
        federation.close()


def _reference(config: FederationConfig, heads: dict, store: LabelStore) -> dict[int, int]:
    """The plaintext labels of every done batch, with the guardian's and the student's seeded noise replayed
    in order."""
    backbone = load_shared_backbone(config)
    noise, student, expected = party_noise("guardian", seed=NOISE), party_noise("student", seed=NOISE), {}
    for record in sorted(store.batches(), key=lambda r: r.first_index):
        if record.state != "done":
            continue
        spec = batch_plan(config, first_index=record.first_index, count=record.count).spec
        features = extract_features(backbone, spec.images(), bn_batch=spec.bn_batch, mode="current")
        votes = sum(vote_histogram(heads[p].predict(features), classes=10) for p in record.parties)
        z1, z2 = draw_confident_noise(
            noise,
            batch=record.count,
            classes=10,
            sigma1=config.mechanism.sigma1,
            sigma2=config.mechanism.sigma2,
        )
        z1 = z1 + draw_student_noise(student, batch=record.count, sigma1=config.mechanism.sigma1)
        labels = confident_rule(votes, threshold=config.mechanism.threshold, z1=z1, z2=z2)
        expected.update({spec.first_index + i: int(v) for i, v in enumerate(labels)})
    return expected


def test_pipelined_run_labels_like_the_plaintext_rule_and_the_ledger_agrees(
    make, federation_dict, trained_heads, tmp_path: Path
) -> None:
    # Prepare
    heads, sha = trained_heads
    config = _config(federation_dict, sha)
    federation = make(config)
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    # Execute
    progress = federation.scheduler(store).run()
    # Assert
    assert progress.stopped_reason == "all planned queries asked"
    assert store.counts()["batches_done"] == 4
    indices, labels = store.all_labels()
    assert dict(zip(indices.tolist(), labels.tolist(), strict=True)) == _reference(config, heads, store)
    summary = federation.ledger.summary()
    assert (summary["queries"], summary["answered"]) == (128, store.counts()["answered"])
    privacy = privacy_of(config, store)
    for key in ("epsilon_spent", "epsilon_settled", "epsilon_reserved"):
        assert privacy[key] == pytest.approx(summary[key], rel=1e-9, abs=1e-12)
    # The published ε is the guarantee (the filter's limit), not the realised sum beside it.
    assert privacy["epsilon"] == config.budget.epsilon > privacy["epsilon_spent"] > 0
    assert privacy["delta_total"] == privacy["delta"] + privacy["delta_sampler"] > privacy["delta"]


def test_budget_exhaustion_shrinks_the_tail_then_stops_cleanly(
    make, federation_dict, trained_heads, tmp_path: Path
) -> None:
    from capc_common.federation import batch_costs
    from capc_common.privacy.analysis import rdp_budget_at_order

    _, sha = trained_heads
    probe = _config(federation_dict, sha)
    costs = batch_costs(probe)
    # a budget of 2.6 full batches' worst case: two full batches, then only halves fit
    epsilon = costs.epsilon(2.6 * costs.worst_case(32)) + 0.92  # + the conversion's offset at order 10
    config = _config(federation_dict, sha, budget={"epsilon": epsilon, "delta": 1e-5, "order": 10})
    federation = make(config)
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    progress = federation.scheduler(store).run()
    assert "privacy budget exhausted" in progress.stopped_reason
    assert "short by" in progress.stopped_reason
    done = [r.count for r in store.batches(state="done")]
    assert done[:2] == [32, 32] and 16 in done[2:], done
    summary = federation.ledger.summary()
    assert summary["open_batches"] == 0 and summary["reserved_rdp"] == 0
    budget = rdp_budget_at_order(epsilon=epsilon, delta=1e-5, order=10)
    assert summary["spent_rdp"] <= budget
    assert budget - summary["spent_rdp"] < costs.worst_case(16)
    # Filter-stopped: the card's ε is the filter's limit, whatever the answers made the stream cost.
    privacy = privacy_of(config, store)
    assert privacy["epsilon"] == epsilon > privacy["epsilon_spent"]
    assert privacy["epsilon_spent"] == pytest.approx(summary["epsilon_spent"], rel=1e-9)


def test_a_refusing_party_below_quorum_aborts_the_batch_at_no_cost(
    make, federation_dict, trained_heads, tmp_path: Path
) -> None:
    _, sha = trained_heads
    config = _config(federation_dict, sha)
    federation = make(config, caps={"hospital-b": 1.0})  # b's own cap refuses every batch
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    progress = federation.scheduler(store).run()
    assert progress.stopped_reason == "all planned queries asked"
    aborted = store.batches(state="aborted")
    assert len(aborted) == 4
    assert "quorum not met: 1 of 2" in aborted[0].detail and "local_budget_exhausted" in aborted[0].detail
    assert federation.ledger.summary()["spent_rdp"] == 0
    assert federation.ledger.summary()["released_batches"] == 4


def test_quorum_of_one_proceeds_without_the_refusing_party(
    make, federation_dict, trained_heads, tmp_path
) -> None:
    heads, sha = trained_heads
    config = _config(
        federation_dict, sha, quorum={"min_parties": 1, "vote_deadline_s": 20, "share_deadline_s": 5}
    )
    federation = make(config, caps={"hospital-b": 1.0})
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    federation.scheduler(store).run()
    done = store.batches(state="done")
    assert len(done) == 4 and {r.parties for r in done} == {("hospital-a",)}
    indices, labels = store.all_labels()
    assert dict(zip(indices.tolist(), labels.tolist(), strict=True)) == _reference(config, heads, store)


def test_restart_resumes_the_open_batch_and_asks_nothing_twice(
    make, federation_dict, trained_heads, tmp_path: Path
) -> None:
    _, sha = trained_heads
    config = _config(federation_dict, sha)
    federation = make(config)
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    # a student that crashed right after opening its first batch on the guardian
    plan = batch_plan(config, first_index=0, count=32)
    store.begin(plan.batch_id, first_index=0, count=32)
    client = GuardianClient(
        config=config,
        tls=_files(federation.pki, "student"),
        address=federation.guardian_address,
        noise=federation.student_noise,
    )
    client.open_batch(plan.batch_id, count=32, digest=plan.digest)
    client.close()
    store.close()
    # restart
    again = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    federation.scheduler(again).run()
    assert again.get(plan.batch_id).attempt == 2
    assert [r.state for r in again.batches()] == ["done"] * 4
    reserves = [e.batch_id for e in federation.ledger.entries() if e.kind == "reserve"]
    assert sorted(reserves) == sorted(set(reserves)) and len(reserves) == 4
    assert len(again.all_labels()[0]) == 128


def test_labels_paid_for_survive_a_link_that_drops_after_the_guardians_commit(
    make, federation_dict, trained_heads, tmp_path: Path, monkeypatch
) -> None:
    # The guardian settles a batch (commit before reveal) and then the link drops before the student has its
    # labels. They were paid for, so they must not be lost: the student stashed its select bits before the
    # guardian could commit, asks for the same reveal again, and decodes the very same labels.
    from capc_common.errors import ProtocolError
    from capc_common.mpc import EvaluatorSession

    _, sha = trained_heads
    queries = {**_config(federation_dict, sha).queries.model_dump(), "total": 64}
    config = _config(federation_dict, sha, queries=queries)
    federation = make(config)
    decode = EvaluatorSession._decode
    dropped: list[np.ndarray] = []

    def decode_then_drop(self, outputs):
        labels = decode(self, outputs)  # the garbler only sends decoding bits after its ledger commit
        if not dropped:
            dropped.append(labels)
            raise ProtocolError("link dropped after the guardian's commit")
        return labels

    monkeypatch.setattr(EvaluatorSession, "_decode", decode_then_drop)
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    scheduler = federation.scheduler(store)
    scheduler.run()
    assert dropped and not store.batches(state="lost")
    assert scheduler.progress.recovered_batches == 1
    first = store.batches(state="done")[0]
    indices, labels = store.all_labels()
    np.testing.assert_array_equal(
        labels[(indices >= first.first_index) & (indices < first.first_index + 32)], dropped[0]
    )
    assert federation.ledger.batch(first.batch_id).answered == first.answered == int((dropped[0] >= 0).sum())
    summary = federation.ledger.summary()
    assert privacy_of(config, store)["rdp"] == pytest.approx(summary["spent_rdp"], rel=1e-12)
