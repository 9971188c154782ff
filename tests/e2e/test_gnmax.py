"""GNMax in the local federation as real processes (3 teacher parties × 3 heads on Fashion-MNIST records).

Differential: the parties get the central run's heads and the noise is seeded (``insecure_noise_seed``); the
federation — each party's heads voting on the query batches, the votes secret-shared, the guardian's noise
and the GNMax garbled circuit — releases exactly the labels of the library's object (:meth:`GNMax.answer
<capc_common.mechanisms.GNMax.answer>`) on the same heads' votes with the same seed, batch by batch (the
noise is drawn per batch in canonical order) until the budget ends the stream, and the ledger charges
exactly GNMax's cost ``α/σ²`` of every query (no screening: every query admitted is answered).
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from federation_harness import NOISE_SEED, Running, federation_options

from capc_common.aggregation import mechanism_noise
from capc_common.federation import load_shared_backbone, mechanism_of
from capc_common.learn.heads import HeadEnsemble
from capc_common.mechanisms import GNMax, HeadsVoter
from capc_common.privacy.analysis import epsilon_at_order
from capc_common.synth import generate

pytestmark = pytest.mark.slow

SIGMA = 2.0
EPSILON = 300.0  # at order 10 and σ 2 a query costs RDP 2.5: the budget ends the 256-query stream early


def _batch_ends(running: Running) -> list[int]:
    """Where each batch the student completed ends, in order (its label store's ``batches`` table)."""
    db = sqlite3.connect(running.layout.party_dir("student") / "labels.sqlite")
    try:
        rows = db.execute("SELECT first_index, count FROM batches WHERE state = 'done' ORDER BY first_index")
        return [first + count for first, count in rows.fetchall()]
    finally:
        db.close()


def test_gnmax_federation_equals_the_central_release(central, tmp_path) -> None:
    options = federation_options(mechanism="gnmax", sigma=SIGMA, epsilon=EPSILON)
    running = Running(tmp_path / "state", options, central["teachers"])
    try:
        progress = running.wait(lambda p: p["state"] == "published")
        config = running.config
        mechanism = mechanism_of(config)
        assert isinstance(mechanism, GNMax) and mechanism.sigma == SIGMA
        q = config.queries
        images = generate(
            q.generator,
            seed=q.seed,
            start=0,
            count=q.total,
            height=q.height,
            width=q.width,
            channels=q.channels,
        )
        labels = running.labels()
        ends = _batch_ends(running)
        assert 0 < ends[-1] == len(labels) == progress["queries"] < q.total  # the budget ended the stream
        assert (labels >= 0).all()  # GNMax answers every query it admits
        voter = HeadsVoter(load_shared_backbone(config), HeadEnsemble.load(central["teachers"]), classes=10)
        noise = mechanism_noise(seed=NOISE_SEED)
        reference, votes = [], []
        for start, stop in itertools.pairwise([0, *ends]):  # the federation's batches, each drawn in order
            batch_votes = voter.vote(images[start:stop], bn_batch=q.bn_batch)
            reference.append(mechanism.answer(batch_votes, noise))
            votes.append(batch_votes)
        np.testing.assert_array_equal(labels, np.concatenate(reference))
        # The noise decided some labels: the release is not the plain plurality of the votes.
        assert (labels != np.concatenate(votes).argmax(axis=1)).any()

        budget = running.budget()
        assert budget["queries"] == budget["answered"] == len(labels)
        _, per_answer = mechanism.costs([budget["order"]])
        assert float(per_answer[0]) == pytest.approx(budget["order"] / SIGMA**2, rel=1e-12)
        expected = epsilon_at_order(
            budget["order"], len(labels) * float(per_answer[0]), delta=budget["delta"]
        )
        assert budget["epsilon_spent"] == pytest.approx(float(expected), rel=1e-9)
        # It stopped because the smallest next batch (one BatchNorm chunk) would not have fitted.
        more = (len(labels) + q.bn_batch) * float(per_answer[0])
        assert float(epsilon_at_order(budget["order"], more, delta=budget["delta"])) > EPSILON
        assert "privacy budget exhausted" in progress["stopped_reason"]
        # The card names GNMax's accounting, and its ε is the guarantee the filter stopped at, with the
        # realised spend beside it.
        card = json.loads(Path(progress["published"]["model_card"]).read_text())["privacy"]
        assert card["accountant"].startswith("gnmax: ") and "screening" not in card["accountant"]
        assert card["epsilon"] == EPSILON > card["epsilon_spent"] == pytest.approx(budget["epsilon_spent"])
    finally:
        running.close()
