"""Prom-PATE in the local federation as real processes (2 teacher parties on Fashion-MNIST records).

Each party trains its prompted teachers on its own shards at ``capc local up`` (``capc teacher train``),
saves them, and votes with them on the query images; sharing, the guardian's noise, the Confident-GNMax
garbled circuit and the ledger are the engine's. Differential: with the noise seeded
(``insecure_noise_seed``), the federation releases exactly the labels of the central Prom-PATE release
(:func:`~capc_common.mechanisms.answer_within_budget`) of the same teachers' votes with the same seed, and
the ledger charges exactly Confident-GNMax's cost of what was screened and answered. The central side also
retrains one party's teachers from its own data with the library and gets them bit for bit, so the parties
trained what the library trains.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from federation_harness import NOISE_SEED, Running, federation_options

from capc_common.aggregation import mechanism_noise
from capc_common.data import partition
from capc_common.federation import load_shared_backbone, mechanism_of
from capc_common.learn.prompts import PromptedTeachers, train_prompted_teachers
from capc_common.mechanisms import ConfidentGNMax, PromPATE, answer_within_budget
from capc_common.privacy.analysis import epsilon_at_order
from capc_common.synth import generate
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import party_examples

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

PARTIES, HEADS, QUERIES, BATCH = 2, 2, 128, 64
CONFIDENT = {"threshold": 3.0, "sigma1": 1.5, "sigma2": 2.5}
RECIPE = {"width": 2, "map_steps": 20, "steps": 2}


def _party_teachers(running: Running, mechanism: PromPATE) -> list[PromptedTeachers]:
    """Every party's saved teachers; the first party's retrained here from its own data must equal them."""
    config = running.config
    backbone = load_shared_backbone(config)
    saved = [
        PromptedTeachers.load(
            running.layout.party_dir(name) / "heads.safetensors", backbone=backbone, recipe=mechanism.recipe
        )
        for name in config.teacher_names
    ]
    images, labels, _ = party_examples(TeacherSettings.load(running.layout.site(config.teacher_names[0])))
    shards = partition(labels, shards=HEADS, scheme="hash", seed=config.queries.seed, images=images)
    again = train_prompted_teachers(
        backbone,
        images,
        labels,
        shards,
        classes=config.classes,
        bn_batch=config.queries.bn_batch,
        recipe=mechanism.recipe,
    )
    for name in ("prompts", "weights", "biases"):
        assert torch.equal(getattr(again, name), getattr(saved[0], name)), name
    return saved


def test_prom_pate_federation_equals_the_central_release(tmp_path) -> None:
    options = federation_options(
        mechanism="prom-pate",
        parties=PARTIES,
        min_parties=PARTIES,
        teachers_per_party=HEADS,
        bn_batch=16,
        epsilon=1000.0,  # every batch screened: the release is compared query for query
        **CONFIDENT,
        queries=QUERIES,
        batch_size=BATCH,
        train_limit=64,
        mechanism_params=RECIPE,
    )
    running = Running(tmp_path / "state", options, teachers=None)
    try:
        progress = running.wait(lambda p: p["state"] == "published")
        labels = running.labels()
        assert len(labels) == progress["queries"] == QUERIES
        config = running.config
        mechanism = mechanism_of(config)
        assert isinstance(mechanism, PromPATE)
        q = config.queries
        images = generate(
            q.generator,
            seed=q.seed,
            start=0,
            count=QUERIES,
            height=q.height,
            width=q.width,
            channels=q.channels,
        )
        votes = sum(t.histograms(images, batch=BATCH) for t in _party_teachers(running, mechanism))
        central = answer_within_budget(
            votes,
            mechanism=mechanism,
            epsilon=config.budget.epsilon,
            delta=config.budget.delta,
            batch=BATCH,
            noise=mechanism_noise(seed=NOISE_SEED),
        )
        assert central.queries == QUERIES and 0 < central.answered < QUERIES  # screening did something
        np.testing.assert_array_equal(labels, central.labels)

        budget = running.budget()
        assert (budget["queries"], budget["answered"]) == (QUERIES, central.answered)
        plain = ConfidentGNMax(classes=config.classes, teachers=PARTIES * HEADS, **CONFIDENT)
        per_query, per_answer = plain.costs([budget["order"]])
        rdp = QUERIES * float(per_query[0]) + central.answered * float(per_answer[0])
        expected = epsilon_at_order(budget["order"], rdp, delta=budget["delta"])
        assert budget["epsilon_spent"] == pytest.approx(float(expected), rel=1e-9)
        status = running.get(
            running.endpoints["teachers"]["hospital-1"]["admin"] + "/api/v1/status",
            secret=running.teacher_token,
        )
        assert status["voter"] == {
            "voter": "prompted",
            "heads": HEADS,
            "recipe": mechanism.recipe.describe(),
        }
    finally:
        running.close()
