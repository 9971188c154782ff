"""The federation as real processes on loopback (3 teacher parties × 3 teachers on Fashion-MNIST).

* Differential: with the central run's teachers and seeded noise, the federation releases exactly the labels
  `capc dietpate run` released, batch by batch, and the guardian's ledger charges exactly the accountant's ε.
* The budget ends the stream cleanly, with the refused batch's figures in the student's stopped reason.
* A teacher process killed mid-run: the batch follows the quorum rule and the federation carries on.
* Clients without a certificate, or with another party's certificate, are refused.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from federation_harness import Running, federation_options

from capc_common.data import load_dataset
from capc_common.federation import load_shared_backbone, mechanism_of
from capc_common.learn.student import load_student
from capc_common.models import extract_features
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.interceptors import FederationClientInterceptor
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import site_examples
from capc_services.tls import TlsFiles

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def differential(central, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    # The central run's heads vote; each site's own 600 images are what `teacher personalise` compares on.
    options = federation_options(train_limit=600)
    running = Running(tmp_path_factory.mktemp("fed") / "state", options, central["teachers"])
    running.wait(lambda p: p["state"] == "published")
    yield running
    running.close()


def _store_rows(running: Running) -> list[tuple[int, int, str, str]]:
    db = sqlite3.connect(running.layout.party_dir("student") / "labels.sqlite")
    try:
        return db.execute(
            "SELECT first_index, count, state, parties FROM batches ORDER BY first_index"
        ).fetchall()
    finally:
        db.close()


def test_labels_equal_the_central_run(differential: Running, central) -> None:
    rows = [row for row in _store_rows(differential) if row[2] == "done"]
    assert [first + count for first, count, _, _ in rows] == central["batch_ends"]
    labels = differential.labels()
    assert len(labels) == len(central["labels"]) > 0
    np.testing.assert_array_equal(labels, central["labels"])
    assert (labels >= 0).sum() == central["report"]["answered"]
    # Some queries fail the threshold and some pass, so both parts of the threshold noise (the guardian's
    # and the student's, each seeded from the one noise seed) decided labels that had to agree.
    assert 0 < central["report"]["answered"] < len(labels)


def test_ledger_epsilon_equals_the_accountant(differential: Running, central) -> None:
    budget = differential.budget()
    reference = mechanism_of(differential.config).accountant
    reference.step(queries=budget["queries"], answered=budget["answered"])
    epsilon, _ = reference.get_epsilon(delta=budget["delta"], orders=[budget["order"]])
    assert budget["epsilon_spent"] == pytest.approx(epsilon, rel=1e-9)
    assert budget["epsilon_spent"] == pytest.approx(central["report"]["epsilon_spent"], rel=1e-9)
    assert (budget["queries"], budget["answered"]) == (
        central["report"]["queries"],
        central["report"]["answered"],
    )
    progress = differential.progress()
    published = progress["published"]
    card = json.loads(Path(published["model_card"]).read_text())
    # The budget stopped this stream: the published ε is the filter's limit (the guarantee), everywhere it
    # is published; the realised sum is the odometer beside it.
    assert (
        published["epsilon"] == progress["epsilon"] == card["privacy"]["epsilon"] == budget["epsilon_limit"]
    )
    assert published["epsilon_spent"] == pytest.approx(budget["epsilon_spent"], rel=1e-9)
    assert card["privacy"]["accountant"].startswith("confident-gnmax: ")
    for key in ("epsilon_spent", "epsilon_settled", "epsilon_reserved"):  # CLI, REST, card, /progress agree
        assert progress[key] == pytest.approx(budget[key], rel=1e-9, abs=1e-12)
        assert card["privacy"][key] == pytest.approx(budget[key], rel=1e-9, abs=1e-12)
    # Seeded noise is never silent: the budget, the progress and the published card all say so.
    assert budget["noise"] == "SeededNoise"
    assert "INSECURE" in progress["noise"] and "INSECURE" in card["mechanism"]["student_noise"]


def test_budget_exhaustion_stops_cleanly(differential: Running) -> None:
    progress, budget = differential.progress(), differential.budget()
    assert progress["state"] == "published"
    assert "privacy budget exhausted" in progress["stopped_reason"]
    assert "short by" in progress["stopped_reason"] and "Nothing was charged" in progress["stopped_reason"]
    assert budget["open_batches"] == 0 and budget["reserved_rdp"] == 0
    assert budget["epsilon_spent"] <= budget["epsilon_limit"]
    assert progress["queries"] < differential.config.queries.total


def test_a_hospital_personalises_against_the_published_student(differential: Running, capc, tmp_path) -> None:
    """``capc teacher personalise`` on a selection mechanism's student: it finds the student the local
    federation published, reads it in its own space (current BatchNorm statistics over bn_batch chunks),
    scores alone, shared and personalised on the site's holdout and on ``--evaluate``'s file, and writes the
    kept model with its card."""
    site = differential.layout.site("hospital-1")
    test = load_dataset("fashion-mnist", split="test")
    evaluate = tmp_path / "evaluate.npz"
    np.savez(evaluate, images=test.images[:96], labels=test.labels[:96])
    args = ("teacher", "personalise", "--site", str(site), "--no-cnn", "--evaluate", str(evaluate))
    proc = capc(*args, "--out", str(tmp_path / "personal"), "--format", "json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert set(report["holdout"]) == set(report["evaluate"]) == {"alone", "shared", "personalised"}
    assert report["kept"] in report["holdout"] and report["student"]["kind"] == "selection"
    examples = site_examples(TeacherSettings.load(site))
    assert report["sizes"] == {
        "training_part": len(examples.labels),
        "holdout": len(examples.holdout_labels),
        "evaluate": 96,
    }
    # "shared" is the published student as a user runs it: current statistics over chunks of bn_batch.
    student, _ = load_student(Path(differential.progress()["published"]["model"]))
    backbone = load_shared_backbone(differential.config)
    bn_batch = differential.config.queries.bn_batch
    for images, truth, part in (
        (examples.holdout_images, examples.holdout_labels, "holdout"),
        (test.images[:96], test.labels[:96], "evaluate"),
    ):
        features = extract_features(backbone, images, bn_batch=bn_batch, mode="current")
        expected = (student.predict(features)[0] == truth).mean()
        # float32 torch there, float64 here: a near-tie may fall the other way, one image at most
        assert report[part]["shared"] == pytest.approx(expected, abs=1.01 / len(truth)), part
    card = json.loads((tmp_path / "personal" / "model_card.json").read_text())
    assert (
        card["kept"] == report["kept"] and card["student"]["config_hash"] == differential.config.config_hash()
    )
    assert card["compared"]["evaluate"]["shared"] == report["evaluate"]["shared"]
    space = (
        "per-example features" if report["kept"] == "alone" else "BatchNorm current statistics over chunks"
    )
    assert space in card["reads"] and card["format"] == "linear", card["reads"]


def _tls(running: Running, party: str) -> TlsFiles:
    certs = running.layout.certs
    return TlsFiles(ca=certs / "ca.crt", cert=certs / f"{party}.crt", key=certs / f"{party}.key")


def test_unauthenticated_and_impersonating_clients_are_refused(differential: Running) -> None:
    guardian = differential.endpoints["guardian"]["grpc"]
    student = differential.endpoints["student"]["grpc"]
    # no client certificate: the TLS handshake fails
    bare = grpc.secure_channel(
        guardian,
        grpc.ssl_channel_credentials((differential.layout.certs / "ca.crt").read_bytes()),
        options=[("grpc.ssl_target_name_override", "guardian")],
    )
    with pytest.raises(grpc.RpcError) as info:
        rpc.GuardianServiceStub(bare).BatchStatus(pb.BatchStatusRequest(batch_id="x"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # a teacher's certificate: may not act as the student, nor submit for another party
    teacher = _tls(differential, "hospital-1")
    config = differential.config
    hash_header = (FederationClientInterceptor.dialling(config, tls=teacher, peer="guardian"),)
    stub = rpc.GuardianServiceStub(teacher.channel(guardian, peer="guardian", interceptors=hash_header))
    with pytest.raises(grpc.RpcError) as info:
        stub.OpenBatch(pb.OpenBatchRequest(batch_id="x", count=32, query_digest=b"0" * 32), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    forged = pb.SubmitSharesRequest(
        batch_id="x", attempt=1, party="hospital-2", seed=b"\0" * 16, shape=[32, 10]
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitShares(forged, timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # on the student's work stream, hospital-1 cannot introduce itself as hospital-2
    work = rpc.StudentServiceStub(
        teacher.channel(
            student,
            peer="student",
            interceptors=(FederationClientInterceptor.dialling(config, tls=teacher, peer="student"),),
        )
    )
    hello = pb.TeacherMessage(hello=pb.TeacherHello(party="hospital-2", heads=3))
    with pytest.raises(grpc.RpcError) as info:
        list(work.Work(iter([hello]), timeout=10))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # the admin API wants the bearer token
    assert httpx.get(differential.endpoints["guardian"]["budget"], timeout=10).status_code == 401


def test_killed_teacher_follows_the_quorum_and_the_federation_continues(central, tmp_path_factory) -> None:
    options = federation_options(
        min_parties=2,
        queries=640,
        batch_size=32,
        sigma1=6.0,
        sigma2=6.0,
        epsilon=1000.0,
        insecure_noise_seed=None,
    )
    running = Running(tmp_path_factory.mktemp("kill") / "state", options, central["teachers"])
    everyone, survivors = '["hospital-1", "hospital-2", "hospital-3"]', '["hospital-1", "hospital-2"]'
    try:
        # A party that connects late misses the first batches (the quorum lets them proceed without it), so
        # wait for a batch all three answered before killing one.
        running.wait(lambda p: any(row[2:] == ("done", everyone) for row in _store_rows(running)))
        victim = running.endpoints["pids"]["hospital-3"]
        os.kill(victim, signal.SIGKILL)
        progress = running.wait(lambda p: p["state"] == "published")
        rows = _store_rows(running)
        assert all(state == "done" for _, _, state, _ in rows), rows
        parties = [p for _, _, _, p in rows]
        assert everyone in parties and parties[-1] == survivors
        assert progress["queries"] == 640 and progress["teachers_connected"] == ["hospital-1", "hospital-2"]
        assert running.budget()["open_batches"] == 0
    finally:
        running.close()
