"""The student: selection on answered queries only, pseudo-labels, saving with a model card."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.learn.heads import HeadRecipe
from capc_common.learn.student import STUDENT_CANDIDATES, accuracy, load_student, save_student, train_student


def _problem(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    w = rng.standard_normal((3, 20))
    x = rng.standard_normal((n, 20)).astype(np.float32)
    return x, np.argmax(x @ w.T, axis=1)


def test_selection_uses_a_holdout_of_labelled_queries_and_refits():
    rng = np.random.default_rng(0)
    x, y = _problem(rng, 400)
    candidates = (HeadRecipe(steps=200, lr=1e-2, l2=10.0), *STUDENT_CANDIDATES)
    fit = train_student(x[:100], y[:100], classes=3, unlabelled=x[100:], candidates=candidates, seed=1)
    assert fit.selection["holdout"] == 20
    scores = [c["holdout_agreement"] for c in fit.selection["candidates"]]
    assert len(scores) == len(candidates)
    assert fit.recipe == candidates[int(np.argmax(scores))]
    assert fit.recipe.l2 != 10.0  # a crushing weight decay loses on the hold-out
    assert fit.selection["pseudo"]["rows"] > 0  # confident unanswered queries were tried
    assert fit.pseudo_labelled in (0, *range(1, 301))
    assert accuracy(fit.predict(x[100:]), y[100:]) > 0.85


def test_pseudo_labels_can_be_disabled_and_bad_input_is_refused():
    rng = np.random.default_rng(1)
    x, y = _problem(rng, 200)
    fit = train_student(x, y, classes=3, unlabelled=x, pseudo_confidence=None, holdout=0.0)
    assert fit.pseudo_labelled == 0 and fit.selection["pseudo"] == {}
    with pytest.raises(InputError, match="no answered queries"):
        train_student(x[:0], y[:0], classes=3)
    with pytest.raises(InputError, match="unlabelled features"):
        train_student(x, y, classes=3, unlabelled=np.zeros((5, 3), np.float32))
    with pytest.raises(InputError, match="cannot score"):
        accuracy(np.zeros(3), np.zeros(4))


def test_saved_student_carries_its_model_card(tmp_path):
    rng = np.random.default_rng(2)
    x, y = _problem(rng, 120)
    fit = train_student(x, y, classes=3, holdout=0.0, pseudo_confidence=None)
    card = {"privacy": {"epsilon": 6.0, "delta": 1e-5}, "accuracy": {"value": 0.9}}
    card_path = save_student(tmp_path / "student.safetensors", fit, card=card)
    assert card_path.name == "student.card.json"
    head, loaded = load_student(tmp_path / "student.safetensors")
    assert loaded == card
    np.testing.assert_array_equal(head.predict(x)[0], fit.predict(x))
    with pytest.raises(InputError, match="safetensors"):
        save_student(tmp_path / "student.bin", fit, card=card)
