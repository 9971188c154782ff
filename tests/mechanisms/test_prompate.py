"""Central Prom-PATE on digits: end to end, reproducible with seeded noise, charged as Confident-GNMax."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.aggregation import mechanism_noise
from capc_common.data import load_dataset
from capc_common.learn.prompts import PromptRecipe, train_prompted_teachers
from capc_common.mechanisms import UNANSWERED, ConfidentGNMax
from capc_common.mechanisms.prompate import answer_within_budget, release_and_learn, run_prom_pate
from capc_common.models import default_backbone, extract_features, load_backbone
from capc_common.privacy import ConfidentGNMaxAccountant
from capc_common.privacy.analysis import epsilon_from_rdp
from capc_common.synth import generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEACHERS, SHARD, BN = 12, 64, 32
MECHANISM = {"teachers": TEACHERS, "classes": 10, "threshold": 6.0, "sigma1": 3.0, "sigma2": 3.0}


def _release(teachers, queries, feats, histograms=None):
    """Votes (unless given), ε 10 of Confident-GNMax with seeded noise, the student."""
    settings = {
        "student_features": feats,
        "mechanism": ConfidentGNMax(**MECHANISM),
        "epsilon": 10.0,
        "delta": 1e-5,
        "answer_batch": 64,
        "noise": mechanism_noise(seed="prompate-test"),
    }
    if histograms is not None:
        return release_and_learn(histograms, **settings)
    return run_prom_pate(teachers, queries, vote_batch=2 * BN, **settings)


@pytest.fixture(scope="module")
def run():
    """12 prompted teachers of 64 digits each vote on 256 dead-leaves queries; ε 10 with seeded noise."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    train, test = load_dataset("digits", split="train"), load_dataset("digits", split="test")
    backbone = load_backbone(default_backbone(8, 8, 1))
    shards = [np.arange(i * SHARD, (i + 1) * SHARD) for i in range(TEACHERS)]
    teachers = train_prompted_teachers(
        backbone,
        train.images,
        train.labels.astype(np.int64),
        shards,
        classes=10,
        bn_batch=BN,
        recipe=PromptRecipe(width=1, map_steps=30, steps=2),
    )
    queries = generate("dead_leaves", seed=1, start=0, count=256, height=8, width=8, channels=1)
    feats = extract_features(backbone, queries, bn_batch=BN)
    result = _release(teachers, queries, feats)
    evaluation = extract_features(backbone, test.images, bn_batch=BN)
    torch.set_num_threads(before)
    return teachers, queries, feats, result, (evaluation, test.labels)


def test_prom_pate_runs_end_to_end_on_digits(run):
    result, (evaluation, labels) = run[3], run[4]
    hist, answers = result.histograms, result.answers
    assert hist.shape == (256, 10) and np.all(hist.sum(axis=1) == TEACHERS)
    # A tiny PATE (12 teachers) buys few answers: that is the data-independent accounting, not a defect.
    assert 5 <= answers.answered <= answers.queries < 256
    assert answers.epsilon <= 10.0
    released = answers.labels[answers.labels != UNANSWERED]
    # Released labels mostly follow the teachers' plurality (noise σ2 3 against 12 votes).
    plurality = hist[: answers.queries].argmax(axis=1)[answers.labels != UNANSWERED]
    assert np.mean(released == plurality) >= 0.6
    assert result.student is not None
    predicted = result.student.predict(evaluation)
    assert predicted.shape == labels.shape and predicted.min() >= 0 and predicted.max() < 10


def test_votes_reused_and_seeded_noise_reproduce_the_release(run):
    teachers, queries, feats, result, _ = run
    again = _release(teachers, queries, feats, histograms=result.histograms)
    assert np.array_equal(again.answers.labels, result.answers.labels)


def test_charged_epsilon_is_the_confident_gnmax_accountants(run):
    """No new accounting: the ε spent is Confident-GNMax's for the queries screened and answered."""
    answers = run[3].answers
    accountant = ConfidentGNMaxAccountant(**MECHANISM, noise="discrete")
    accountant.step(queries=answers.queries, answered=answers.answered)
    order = np.array([answers.order])
    rdp = accountant.rdp(order)
    assert answers.rdp == pytest.approx(float(rdp[0]), rel=1e-12)
    assert answers.epsilon == pytest.approx(epsilon_from_rdp(order, rdp, delta=1e-5)[0], rel=1e-12)


def test_the_budget_stops_at_the_worst_case_that_still_fits(run):
    """A smaller ε asks fewer queries; the next query's worst case would not have fitted."""
    hist = run[3].histograms
    mechanism = ConfidentGNMax(**MECHANISM)
    small = answer_within_budget(hist, mechanism=mechanism, epsilon=5.0, delta=1e-5, batch=64)
    assert 0 < small.queries < run[3].answers.queries
    accountant = ConfidentGNMaxAccountant(**MECHANISM, noise="discrete")
    order = np.array([small.order])
    spent = accountant.cost(order, queries=small.queries, answered=small.answered)[0]
    one_more = accountant.cost(order, queries=1, answered=1)[0]
    from capc_common.privacy import RenyiFilter

    budget = RenyiFilter.for_budget(epsilon=5.0, delta=1e-5, order=small.order).budget_rdp
    assert spent <= budget < spent + one_more
