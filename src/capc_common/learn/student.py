"""The student: a head on the shared backbone trained on the answered synthetic queries.

The student only ever sees public synthetic queries and the DP labels released for some of them, so every
choice made here — model selection, pseudo-labels on *unanswered* queries — is post-processing and costs no
privacy. Model selection never touches real data: a seeded hold-out part of the *answered* queries scores each
candidate by agreement with the released labels.

Each candidate :class:`~capc_common.learn.heads.HeadRecipe` (:data:`STUDENT_CANDIDATES` by default) is
fitted on the rest of the answered queries and the one agreeing best with the held-out released labels is
refitted on all of them. Semi-supervised step (optional): the unanswered queries on which the student is
confident (softmax probability ≥ ``pseudo_confidence``) are added with their predicted label and a smaller
weight, and the head is refitted; whether that helps is measured on the same hold-out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from capc_common.errors import InputError
from capc_common.learn.heads import HeadEnsemble, HeadRecipe, train_heads

__all__ = ["STUDENT_CANDIDATES", "StudentFit", "accuracy", "load_student", "save_student", "train_student"]


#: The student's candidate recipes, chosen on a validation split of Fashion-MNIST's training data
#: (docs/dietpate.md): full-batch Adam on the answered queries — the paper's lr 1e-3 for 100 steps, and a
#: faster, weight-decayed variant; within a point of each other there, so the hold-out of answered queries
#: picks one per run. (Label smoothing and MLP heads were measured too and lost.)
STUDENT_CANDIDATES: tuple[HeadRecipe, ...] = (
    HeadRecipe(steps=100, lr=1e-3),
    HeadRecipe(steps=200, lr=1e-2, l2=1e-3),
)


@dataclass(frozen=True)
class StudentFit:
    """A trained student head and how it was chosen.

    Attributes:
        head: a single-head :class:`HeadEnsemble`.
        recipe: the selected recipe.
        pseudo_labelled: number of unanswered queries added with pseudo-labels (0 if that did not help).
        selection: hold-out agreement of every candidate, for the report.
    """

    head: HeadEnsemble
    recipe: HeadRecipe
    pseudo_labelled: int
    selection: dict[str, Any] = field(default_factory=dict)

    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Labels ``(N,)`` of features ``(N, dim)``."""
        return self.head.predict(features)[0]


def accuracy(predicted: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Fraction of equal entries; the two arrays must have the same shape."""
    p, y = np.asarray(predicted), np.asarray(labels)
    if p.shape != y.shape or p.size == 0:
        raise InputError(f"cannot score predictions {p.shape} against labels {y.shape}")
    return float(np.mean(p == y))


def _fit(
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    w: npt.NDArray[np.float32] | None,
    *,
    classes: int,
    recipe: HeadRecipe,
    seed: int,
) -> HeadEnsemble:
    owners = np.zeros(len(y), np.int64)
    return train_heads(x, y, owners=owners, heads=1, classes=classes, recipe=recipe, weights=w, seed=seed)


def _pseudo(
    head: HeadEnsemble, unlabelled: npt.NDArray[np.float32], *, confidence: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Indices and labels of the unlabelled rows the head predicts with probability ≥ ``confidence``."""
    probs = torch.softmax(head.logits(unlabelled)[0], dim=1)
    top, label = probs.max(dim=1)
    keep = np.flatnonzero(top.numpy() >= confidence)
    return keep, label.numpy()[keep].astype(np.int64)


def _with_pseudo(
    head: HeadEnsemble,
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    u: npt.NDArray[np.float32],
    *,
    confidence: float,
    weight: float,
    fit: Callable[..., HeadEnsemble],
) -> tuple[HeadEnsemble, int]:
    """Refit with the confident unanswered rows added at ``weight`` (returns the head and how many)."""
    idx, lab = _pseudo(head, u, confidence=confidence)
    if not len(idx):
        return head, 0
    weights = np.concatenate([np.ones(len(y)), np.full(len(idx), weight)]).astype(np.float32)
    return fit(np.concatenate([x, u[idx]]), np.concatenate([y, lab]), weights), len(idx)


def train_student(
    features: npt.ArrayLike,
    labels: npt.ArrayLike,
    *,
    classes: int,
    unlabelled: npt.ArrayLike | None = None,
    candidates: Sequence[HeadRecipe] = STUDENT_CANDIDATES,
    holdout: float = 0.2,
    pseudo_confidence: float | None = 0.9,
    pseudo_weight: float = 0.5,
    seed: int = 0,
) -> StudentFit:
    """Fit the student on labelled query features, choosing among ``candidates`` on a hold-out of them.

    Args:
        features: float ``(n, dim)`` features of the answered queries.
        labels: ``(n,)`` their released labels (hard labels).
        classes: number of classes.
        unlabelled: float ``(u, dim)`` features of unanswered queries, for pseudo-labels (optional).
        candidates: recipes to choose from (the first wins ties).
        holdout: fraction of the answered queries held out for selection (0: take the first candidate and
            skip pseudo-label selection).
        pseudo_confidence: probability above which an unanswered query gets a pseudo-label; ``None``
            disables pseudo-labels.
        pseudo_weight: weight of a pseudo-labelled row relative to an answered one.
        seed: seeds the hold-out split and the MLP initialisation (public randomness).

    Returns:
        The refitted :class:`StudentFit` (trained on all answered queries with the chosen settings).

    Raises:
        InputError: no labelled queries, no candidates, mismatched shapes, or labels out of range.
    """
    x = np.asarray(features, dtype=np.float32)
    y = np.asarray(labels, dtype=np.int64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise InputError(f"student features must be (n, dim) with labels (n,), got {x.shape} and {y.shape}")
    if len(y) == 0:
        raise InputError(
            "no answered queries to train the student on: raise the budget, lower the threshold T, or ask "
            "more queries"
        )
    if not candidates:
        raise InputError("train_student needs at least one candidate recipe")
    if y.min() < 0 or y.max() >= classes:
        raise InputError(f"student labels must lie in [0, {classes}), got [{y.min()}, {y.max()}]")
    u = np.zeros((0, x.shape[1]), np.float32) if unlabelled is None else np.asarray(unlabelled, np.float32)
    if u.ndim != 2 or u.shape[1] != x.shape[1]:
        raise InputError(f"unlabelled features must be (u, {x.shape[1]}), got {u.shape}")
    fit_with = {r: partial(_fit, classes=classes, recipe=r, seed=seed) for r in candidates}
    want_pseudo = pseudo_confidence is not None and len(u) > 0
    pseudo = partial(_with_pseudo, confidence=pseudo_confidence or 1.0, weight=pseudo_weight)

    n_hold = round(holdout * len(y))
    selection: dict[str, Any] = {"holdout": n_hold, "candidates": [], "pseudo": {}}
    recipe, use_pseudo = candidates[0], want_pseudo
    if 1 <= n_hold < len(y):
        perm = np.random.default_rng(seed).permutation(len(y))
        hold, keep = perm[:n_hold], perm[n_hold:]
        scores = []
        heads = {}
        for r in candidates:
            heads[r] = fit_with[r](x[keep], y[keep], None)
            scores.append(accuracy(heads[r].predict(x[hold])[0], y[hold]))
            selection["candidates"].append({**r.describe(), "holdout_agreement": scores[-1]})
        recipe = candidates[int(np.argmax(scores))]  # first best: the list is ordered by preference
        use_pseudo = False
        if want_pseudo:
            head, rows = pseudo(heads[recipe], x[keep], y[keep], u, fit=fit_with[recipe])
            if rows:
                with_pseudo = accuracy(head.predict(x[hold])[0], y[hold])
                selection["pseudo"] = {"without": max(scores), "with": with_pseudo, "rows": rows}
                use_pseudo = with_pseudo > max(scores)

    head = fit_with[recipe](x, y, None)
    added = 0
    if use_pseudo:
        head, added = pseudo(head, x, y, u, fit=fit_with[recipe])
    return StudentFit(head=head, recipe=recipe, pseudo_labelled=added, selection=selection)


def save_student(path: str | Path, fit: StudentFit, *, card: dict[str, Any]) -> Path:
    """Save the student head (safetensors) with its model card embedded and next to it as JSON.

    Args:
        path: target ``.safetensors`` file; the card goes to the same name with ``.card.json``.
        fit: the trained student.
        card: the model card (privacy guarantee, data, backbone hash, accuracy, ...); JSON-serialisable.

    Returns:
        The path of the card file.
    """
    target = Path(path)
    if target.suffix != ".safetensors":
        raise InputError(f"the student is saved as a .safetensors file, got {target}")
    try:
        card_text = json.dumps(card, sort_keys=True, indent=2)
    except TypeError as exc:
        raise InputError(f"model card is not JSON-serialisable: {exc}") from exc
    head = HeadEnsemble(fit.head.kind, fit.head.params, fit.head.classes, {"model_card": card_text})
    target.parent.mkdir(parents=True, exist_ok=True)
    head.save(target)
    card_path = target.with_suffix(".card.json")
    tmp = card_path.with_name(card_path.name + ".tmp")
    tmp.write_text(card_text + "\n", encoding="utf-8")
    tmp.replace(card_path)
    return card_path


def load_student(path: str | Path) -> tuple[HeadEnsemble, dict[str, Any]]:
    """Load a student saved by :func:`save_student`: its head and its model card."""
    head = HeadEnsemble.load(path)
    if head.heads != 1 or "model_card" not in head.metadata:
        raise InputError(f"{path} is not a saved student (expected one head with a model card)")
    card: dict[str, Any] = json.loads(head.metadata["model_card"])
    return head, card
