"""Release mechanisms as real processes on loopback (3 teacher parties on Fashion-MNIST, mTLS gRPC): with
seeded noise the federation publishes exactly the head the central runner computes, and the guardian's
ledger charges exactly the mechanism's RDP per release.

The central reference plays every party from the same records the teacher processes load (their site files)
and the same per-example features (:func:`extract_per_example`), so a difference anywhere — a party's
contribution, the sharing, the guardian's noise or its order, the student's arithmetic — shows.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from federation_harness import NOISE_SEED, Running, federation_options
from threadpoolctl import threadpool_limits

from capc_common.aggregation import mechanism_noise, sampling_noise
from capc_common.data import load_dataset
from capc_common.federation import FederationConfig, load_shared_backbone
from capc_common.federation.releases import (
    DPSGDProtocol,
    PrototypesProtocol,
    PublicVotesProtocol,
    ReleaseProtocol,
    protocol_for,
    prototype_head,
)
from capc_common.learn import BackboneFeaturizer
from capc_common.mechanisms.central import (
    PartyData,
    extract_per_example,
    run_prototypes,
    run_public_prototype_votes,
    run_secure_dpsgd,
)
from capc_common.models.cache import FeatureCache
from capc_common.privacy.analysis import epsilon_at_order
from capc_services.local.federation import restart
from capc_services.local.layout import Layout
from capc_services.local.processes import pid_alive
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import party_examples

pytestmark = pytest.mark.slow

RECORDS = 200  # per party
MECHANISMS: dict[str, dict[str, Any]] = {
    "dppl": {"rho": 2.0, "metric": "euclidean"},
    "dppl-public": {"rho": 2.0, "per_class": 3, "pool_size": 300},
    "secagg-dpsgd": {  # the recipe with a small public basis (400 synthetic images) and Poisson sampling
        "rounds": 3,
        "noise_multiplier": 1.5,
        "sampling_rate": 0.25,
        "projection": {"dim": 32, "images": 200},
    },
}


def _parties(layout: Layout, config: FederationConfig) -> list[PartyData]:
    """Every teacher party's records and per-example features, loaded as its own process loads them (one
    torch thread, as the local federation's parties run)."""
    featurizer = BackboneFeaturizer(load_shared_backbone(config))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        parties = []
        for name in config.teacher_names:
            images, labels, _ = party_examples(TeacherSettings.load(layout.site(name)))
            features = extract_per_example(featurizer, images)
            parties.append(PartyData(name=name, features=features, labels=np.asarray(labels, dtype=np.int64)))
        return parties
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=sorted(MECHANISMS))
def released(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    options = federation_options(
        mechanism=request.param, mechanism_params=MECHANISMS[request.param], train_limit=RECORDS
    )
    running = Running(tmp_path_factory.mktemp(request.param) / "state", options, None)
    try:
        running.wait(lambda p: p["state"] == "published", timeout=180)
        yield running
    finally:
        running.close()


def _protocol(config: FederationConfig, layout: Layout) -> ReleaseProtocol:
    """The federation's protocol as a party builds it (one torch thread: a public pool is featurised), with
    the parties' shared cache of public features (secagg-dpsgd reads the basis they computed there once)."""
    backbone = load_shared_backbone(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return protocol_for(
            config,
            dim=backbone.feature_dim,
            backbone=backbone,
            cache=FeatureCache(layout.root / "feature-cache"),
        )
    finally:
        torch.set_num_threads(threads)


def _central_head(running: Running) -> np.ndarray:
    """The central runner's head, with numpy's BLAS on one thread as the parties run it (``torch_threads``
    caps both): the rounding of a threaded product may depend on its thread count."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _central_head_of(running)


def _central_head_of(running: Running) -> np.ndarray:
    config = running.config
    parties = _parties(running.layout, config)
    protocol = _protocol(config, running.layout)
    noise = mechanism_noise(seed=NOISE_SEED)  # the guardian's and the student's streams, as they draw them
    if isinstance(protocol, PrototypesProtocol):
        sums, counts = run_prototypes(parties, mechanism=protocol.prototypes, noise=noise)
        return prototype_head(sums, counts, metric=protocol.metric)
    if isinstance(protocol, PublicVotesProtocol):
        total = run_public_prototype_votes(parties, mechanism=protocol.votes, noise=noise)
        prototypes = protocol.votes.prototypes(total)
        return prototype_head(prototypes, np.ones(len(prototypes)), metric="cosine")
    assert isinstance(protocol, DPSGDProtocol)
    result = run_secure_dpsgd(
        parties,
        trainer=protocol.trainer,
        noise=noise,
        party_sources=lambda name: sampling_noise(name, seed=NOISE_SEED),
    )
    return result.weights


def test_published_head_equals_the_central_runner(released: Running) -> None:
    published = released.progress()["published"]
    head = np.load(Path(published["model"]))
    central = _central_head(released)
    assert head.shape == central.shape == (released.config.classes, head.shape[1])
    np.testing.assert_array_equal(head, central)
    assert np.abs(head).sum() > 0


def test_ledger_charges_each_release_its_rdp(released: Running) -> None:
    config = released.config
    protocol = _protocol(config, released.layout)
    budget = released.budget()
    rdp = protocol.rounds * protocol.release_rdp(config.budget.order)
    assert budget["spent_rdp"] == pytest.approx(rdp, rel=1e-6)
    expected = float(epsilon_at_order(config.budget.order, rdp, delta=config.budget.delta))
    assert budget["epsilon_spent"] == pytest.approx(expected, rel=1e-6)
    # Every planned release was made: the guarantee (the plan's charge, fixed in advance) and the spend agree,
    # on the card, in the progress and in what was published.
    progress = released.progress()
    card = json.loads(Path(progress["published"]["model_card"]).read_text())["privacy"]
    for shown in (progress, progress["published"], card):
        assert shown["epsilon"] == pytest.approx(expected, rel=1e-12), shown
        assert shown["epsilon_spent"] == pytest.approx(expected, rel=1e-6), shown
    assert card["epsilon_limit"] == config.budget.epsilon and card["releases"] == card["releases_planned"]
    assert card["accountant"].startswith(f"{protocol.mechanism.name}: ")
    assert budget["noise"] == "SeededNoise"


def test_a_restarted_student_replays_its_releases_without_paying_again(released: Running) -> None:
    """kill -9 of the published student, then the same command again: it replays its journaled totals (no
    release, no charge) and publishes the same head."""
    model = Path(released.progress()["published"]["model"])
    head, before = np.load(model), released.budget()
    victim = released.endpoints["pids"]["student"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pid_alive(victim) and time.monotonic() < deadline:
        time.sleep(0.1)
    model.unlink()
    restart(released.root, "student")
    deadline = time.monotonic() + 120
    while True:
        try:
            progress = released.progress()
        except httpx.HTTPError:
            progress = {"state": "starting"}
        if progress["state"] == "published" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert progress["state"] == "published" and progress["rounds_done"] == progress["rounds"]
    np.testing.assert_array_equal(np.load(model), head)
    after = released.budget()
    assert (after["entries"], after["spent_rdp"]) == (before["entries"], before["spent_rdp"])


def test_each_hospital_personalises_against_the_published_head(released: Running, tmp_path: Path) -> None:
    """After publication a hospital scores, on its holdout, its model alone, the published head (as the
    student party published it, in its per-example space) and the head fine-tuned on its own data, keeps one
    and writes it with its card; ``--evaluate`` scores the same three on a file it supplies."""
    from capc_common.data import holdout_part
    from capc_common.mechanisms import per_example
    from capc_common.mechanisms.central import predict_head
    from capc_services.teacher.personal import personalise_site
    from capc_services.teacher.train import site_examples

    site = released.layout.site("hospital-1")
    settings = TeacherSettings.load(site)
    evaluate = tmp_path / "evaluate.npz"
    test = load_dataset("fashion-mnist", split="test")
    np.savez(evaluate, test_images=test.images[:64], test_labels=test.labels[:64])
    with threadpool_limits(limits=1, user_api="blas"):
        report = personalise_site(site, evaluate=evaluate, out=tmp_path / "personal", cnn=False)
    assert report["kept"] in ("alone", "shared", "personalised")
    for part in ("holdout", "evaluate"):
        assert set(report[part]) == {"alone", "shared", "personalised"}
        assert all(0 <= value <= 1 for value in report[part].values())
    # The holdout is the site's keyed-hash holdout, out of the 200 records: what the federation never saw.
    examples = site_examples(settings)
    assert report["sizes"] == {
        "training_part": len(examples.labels),
        "holdout": len(examples.holdout_labels),
        "evaluate": 64,
    }
    assert len(examples.holdout_labels) > 20 and settings.holdout.fraction == 0.25  # planned for 200 records
    everything = np.concatenate([examples.images, examples.holdout_images])
    labels = np.concatenate([examples.labels, examples.holdout_labels])
    held = holdout_part(everything, labels, fraction=0.25, seed=settings.data.seed)[1]  # type: ignore[union-attr]
    np.testing.assert_array_equal(held, np.arange(len(examples.labels), len(labels)))
    # "shared" is the published head itself, read in the release student's space.
    head = np.load(Path(released.progress()["published"]["model"]))
    backbone = load_shared_backbone(released.config)
    for images, truth, part in (
        (examples.holdout_images, examples.holdout_labels, "holdout"),
        (test.images[:64], test.labels[:64], "evaluate"),
    ):
        shared = (predict_head(head, per_example(backbone, images)) == truth).mean()
        # normalised in float64 there, in float32 here: a near-tie may fall the other way, one image at most
        assert report[part]["shared"] == pytest.approx(shared, abs=1.01 / len(truth)), part
    card = json.loads(Path(report["model_card"]).read_text())
    model = Path(report["model"]).read_bytes()
    assert card["kept"] == report["kept"] and card["model_sha256"] == hashlib.sha256(model).hexdigest()
    assert (
        card["student"]["kind"] == "release"
        and card["student"]["config_hash"] == released.config.config_hash()
    )
    assert card["sizes"] == report["sizes"] and "nothing of this left the site" in card["privacy"]
    assert card["compared"]["holdout"]["shared"] == report["holdout"]["shared"]
    with np.load(report["model"]) as saved:
        assert saved["weights"].shape == (released.config.classes, head.shape[1])
