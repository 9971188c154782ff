"""A party's own best model: the holdout split, the fits, the choice that leans to alone, the CNN.

The data are scikit-learn's real 8×8 digits (pixels as features): small enough for seconds, real enough that
a bad fit or a wrong choice shows.
"""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.data import holdout_part, load_dataset
from capc_common.errors import InputError
from capc_common.learn.personal import (
    LinearModel,
    LinearSpec,
    PersonalRecipe,
    Split,
    fit_alone,
    fit_linear,
    keep,
    personalise,
    predict,
    sign_test,
)
from capc_common.learn.scratch import CnnRecipe, train_scratch_cnn
from capc_common.mechanisms import normalise

FAST = PersonalRecipe(cnn=None)


@pytest.fixture(scope="module")
def digits() -> dict[str, np.ndarray]:
    train, test = load_dataset("digits", split="train"), load_dataset("digits", split="test")
    as_x = lambda d: normalise(d.images.reshape(len(d.labels), -1).astype(np.float32))  # noqa: E731
    return {
        "x": as_x(train),
        "y": train.labels.astype(np.int64),
        "images": train.images,
        "tx": as_x(test),
        "ty": test.labels.astype(np.int64),
    }


def test_holdout_is_a_function_of_each_example_alone(digits):
    images, labels = digits["images"], digits["y"]
    train, held = holdout_part(images, labels, fraction=0.2, seed=7)
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(len(labels)))
    assert 0.15 < len(held) / len(labels) < 0.25
    # Remove one training example and one held-out example: every other example keeps its side.
    for gone in (int(train[3]), int(held[3])):
        keep_rows = np.delete(np.arange(len(labels)), gone)
        t2, h2 = holdout_part(images[keep_rows], labels[keep_rows], fraction=0.2, seed=7)
        assert np.array_equal(keep_rows[h2], np.setdiff1d(held, [gone]))
        assert np.array_equal(keep_rows[t2], np.setdiff1d(train, [gone]))
    # Another seed holds out other examples; fraction 0 holds out none.
    assert not np.array_equal(holdout_part(images, labels, fraction=0.2, seed=8)[1], held)
    assert len(holdout_part(images, labels, fraction=0.0, seed=7)[1]) == 0
    with pytest.raises(InputError, match="fraction"):
        holdout_part(images, labels, fraction=1.0, seed=7)


def test_fit_linear_fits_every_spec_and_a_strong_prior_keeps_the_prior(digits):
    x, y = digits["x"][:300], digits["y"][:300]
    grid = (LinearSpec(0.0), LinearSpec(10.0), LinearSpec(0.1, standardise=True))
    models = fit_linear(x, y, classes=10, grid=grid, recipe=FAST, space="per-example")
    scores = [(m.predict(digits["tx"]) == digits["ty"]).mean() for m in models]
    assert scores[0] > 0.85 and scores[2] > 0.85  # the standardisation is folded into the weights
    assert scores[1] < scores[0] - 0.1  # a crushing penalty loses
    prior = models[0].weights
    shifted = (y[:40] + 1) % 10
    pulled, free = fit_linear(
        x[:40],
        shifted,
        classes=10,
        grid=(LinearSpec(1e4), LinearSpec(0.0)),
        recipe=FAST,
        space="student",
        prior=prior,
    )
    assert np.abs(pulled.weights[:, :-1] - prior[:, :-1]).max() < 0.05  # the pull held it at the prior
    assert (free.predict(x[:40]) == shifted).mean() > 0.9  # without it, the party's labels win
    with pytest.raises(InputError, match="standardised"):
        fit_linear(x, y, classes=10, grid=grid, recipe=FAST, space="student", prior=prior)


def test_keep_leans_to_alone_unless_the_gain_is_clear():
    rng = np.random.default_rng(0)
    alone = rng.random(200) < 0.8
    barely = alone.copy()
    barely[np.flatnonzero(~alone)[:3]] = True  # three examples fixed, two broken: +0.5 point, chance
    barely[np.flatnonzero(alone)[:2]] = False
    clearly = alone | (rng.random(200) < 0.5)  # about +10 points, never worse
    name, tests = keep({"alone": alone, "shared": barely}, alpha=0.1)
    assert name == "alone" and (tests["shared"]["wins"], tests["shared"]["losses"]) == (3, 2)
    assert not tests["shared"]["significant"] and tests["shared"]["p_value"] == pytest.approx(0.5)
    name, tests = keep({"alone": alone, "shared": barely, "personalised": clearly}, alpha=0.1)
    assert name == "personalised" and tests["personalised"]["significant"]
    # Two disagreements, both for the candidate: a quarter of coin flips do that; alone stays.
    two = alone.copy()
    two[np.flatnonzero(~alone)[:2]] = True
    assert keep({"alone": alone, "shared": two}, alpha=0.1)[0] == "alone"
    assert sign_test(2, 0) == 0.25 and sign_test(0, 0) == 1.0 and sign_test(4, 0) == 1 / 16
    assert keep({"alone": alone, "shared": clearly}, alpha=1e-30)[0] == "alone"
    # Two challengers both clearly better: the more accurate is kept; at equal accuracy, the earlier of
    # CANDIDATES (the shared student, which needs no fine-tuning).
    best = clearly | (rng.random(200) < 0.5)
    assert best.mean() > clearly.mean()
    assert keep({"alone": alone, "shared": clearly, "personalised": best}, alpha=0.1)[0] == "personalised"
    assert keep({"alone": alone, "shared": best, "personalised": clearly}, alpha=0.1)[0] == "shared"
    assert keep({"alone": alone, "shared": clearly, "personalised": clearly.copy()}, alpha=0.1)[0] == "shared"
    with pytest.raises(InputError, match="alone"):
        keep({"shared": alone}, alpha=0.1)


def test_personalise_keeps_a_good_shared_model_and_refuses_a_bad_one(digits):
    x, y = digits["x"], digits["y"]
    # the federation's student: fitted on other parties' data, never on this party's holdout
    (good,) = fit_linear(x[300:], y[300:], classes=10, grid=(LinearSpec(1e-4),), recipe=FAST, space="student")
    train, held = np.arange(45), np.arange(60, 260)  # a small party: alone is weak
    inputs = lambda rows: {"per-example": x[rows], "student": x[rows]}  # noqa: E731
    split = Split(inputs(train), y[train], inputs(held), y[held])
    alone = fit_alone(split, classes=10, recipe=FAST)
    found = personalise(split, classes=10, shared=good.weights, alone=alone, recipe=FAST)
    assert found.kept in ("shared", "personalised")
    assert found.holdout["shared"] > found.holdout["alone"] == alone.holdout["alone"]
    test = {"student": digits["tx"], "per-example": digits["tx"]}
    kept_acc = (predict(found.model("kept"), test) == digits["ty"]).mean()
    alone_acc = (predict(found.model("alone"), test) == digits["ty"]).mean()
    assert kept_acc > alone_acc
    # A shared model that predicts one class (a failed federation) is never kept.
    useless = np.zeros_like(good.weights)
    useless[0, -1] = 1.0
    found = personalise(split, classes=10, shared=useless, alone=alone, recipe=FAST)
    assert found.kept != "shared" and found.holdout["shared"] < 0.2
    with pytest.raises(InputError, match="holdout"):
        Split(inputs(train), y[train], inputs(held[:0]), y[held[:0]])
    with pytest.raises(InputError, match="rows"):
        Split(inputs(train), y[train[1:]], inputs(held), y[held])


def test_the_cnn_from_scratch_learns_and_is_deterministic(digits):
    images, labels = digits["images"][:400], digits["y"][:400]
    recipe = CnnRecipe(width=8, hidden=32, max_epochs=12, max_steps=200)
    cnn = train_scratch_cnn(images, labels, classes=10, recipe=recipe, seed=3)
    test = load_dataset("digits", split="test")
    assert (cnn.predict(test.images) == test.labels).mean() > 0.6  # chance: 0.1
    again = train_scratch_cnn(images, labels, classes=10, recipe=recipe, seed=3)
    assert np.array_equal(again.predict(test.images), cnn.predict(test.images))
    assert 1 <= cnn.best_epoch <= cnn.epochs <= 12
    with pytest.raises(InputError, match="labels"):
        train_scratch_cnn(images, labels + 10, classes=10, recipe=recipe)


def test_linear_model_refuses_features_of_another_width():
    model = LinearModel(np.zeros((3, 5)), "per-example")
    with pytest.raises(InputError, match=r"\(N, 4\)"):
        model.predict(np.zeros((2, 3)))


def test_alone_tries_the_cnn_from_its_minimum_and_keeps_it_only_if_better(digits):
    x, y, images = digits["x"], digits["y"], digits["images"]
    train, held = np.arange(400), np.arange(400, 600)
    split = Split(
        {"per-example": x[train], "images": images[train]}, y[train],
        {"per-example": x[held], "images": images[held]}, y[held],
    )  # fmt: skip
    tiny = CnnRecipe(width=8, hidden=32, max_epochs=4, max_steps=40)
    tried = fit_alone(split, classes=10, recipe=PersonalRecipe(cnn=tiny, cnn_minimum=400))
    assert {"alone-linear", "alone-cnn", "alone"} == set(tried.holdout) and "cnn" in tried.detail
    best = max(tried.holdout["alone-linear"], tried.holdout["alone-cnn"])
    assert tried.holdout["alone"] == best
    assert tried.detail["kind"] == (
        "cnn" if tried.holdout["alone-cnn"] > tried.holdout["alone-linear"] else "linear"
    )
    skipped = fit_alone(split, classes=10, recipe=PersonalRecipe(cnn=tiny, cnn_minimum=401))
    assert "alone-cnn" not in skipped.holdout and skipped.detail["kind"] == "linear"
