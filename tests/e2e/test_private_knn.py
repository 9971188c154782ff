"""Private-kNN in the local federation as real processes (3 teacher parties on Fashion-MNIST records).

Differential: with the noise and every party's Poisson samples seeded (``insecure_noise_seed``), the
federation — each teacher featurising its own records and sampling them per query, the votes secret-shared,
the guardian's noise and the GNMax garbled circuit — releases exactly the labels of the central runner
(:func:`~capc_common.mechanisms.central.run_private_knn`) playing the same parties with the same seed, and the
ledger charges exactly the Poisson-subsampled cost of every query (no screening).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from federation_harness import NOISE_SEED, Running, federation_options

from capc_common.aggregation import mechanism_noise, sampling_noise
from capc_common.federation import load_shared_backbone, mechanism_of
from capc_common.mechanisms import PrivateKNN, per_example
from capc_common.mechanisms.central import PartyData, run_private_knn
from capc_common.privacy.analysis import epsilon_at_order
from capc_common.synth import generate
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import party_examples

pytestmark = pytest.mark.slow


def _central_labels(running: Running) -> np.ndarray:
    """The central runner on the parties' own records (read from their site files, as they read them)."""
    config = running.config
    backbone = load_shared_backbone(config)
    parties = []
    for name in config.teacher_names:
        images, labels, _ = party_examples(TeacherSettings.load(running.layout.site(name)))
        parties.append(PartyData(name, per_example(backbone, images), labels.astype(np.int64)))
    q = config.queries
    images = generate(
        q.generator, seed=q.seed, start=0, count=q.total, height=q.height, width=q.width, channels=q.channels
    )
    mechanism = mechanism_of(config)
    assert isinstance(mechanism, PrivateKNN)
    return run_private_knn(
        parties,
        per_example(backbone, images),
        mechanism=mechanism,
        batch_size=q.batch_size,
        noise=mechanism_noise(seed=NOISE_SEED),
        party_sources=lambda party: sampling_noise(party, seed=NOISE_SEED),
    )


def test_private_knn_federation_equals_the_central_run(tmp_path) -> None:
    options = federation_options(
        mechanism="private-knn",
        neighbours=4,
        sampling_rate=0.5,
        sigma=3.0,
        queries=128,
        batch_size=64,
        train_limit=120,
    )
    running = Running(tmp_path / "state", options, teachers=None)
    try:
        progress = running.wait(lambda p: p["state"] == "published")
        labels = running.labels()
        assert len(labels) == progress["queries"] == 128 and (labels >= 0).all()  # every query answered
        np.testing.assert_array_equal(labels, _central_labels(running))
        budget = running.budget()
        assert budget["answered"] == budget["queries"] == 128
        _, per_answer = mechanism_of(running.config).costs([budget["order"]])
        expected = epsilon_at_order(budget["order"], 128 * float(per_answer[0]), delta=budget["delta"])
        assert budget["epsilon_spent"] == pytest.approx(float(expected), rel=1e-9)
        card = json.loads(Path(progress["published"]["model_card"]).read_text())["privacy"]
        assert card["accountant"].startswith("private-knn: ") and "Poisson-subsampled" in card["accountant"]
        status = running.get(
            running.endpoints["teachers"]["hospital-1"]["admin"] + "/api/v1/status",
            secret=running.teacher_token,
        )
        assert status["voter"] == {
            "voter": "private-knn",
            "heads": 4,
            "neighbours": 4,
            "sampling_rate": 0.5,
            # About train_limit: each site keeps a fixed share of the hash range (data.fraction).
            "records": len(party_examples(TeacherSettings.load(running.layout.site("hospital-1")))[1]),
        }
    finally:
        running.close()
