"""The student: a head on the shared backbone trained on the answered synthetic queries.

The student only ever sees public synthetic queries and the DP labels released for some of them, so every
choice made here — model selection, pseudo-labels on *unanswered* queries — is post-processing and costs no
privacy. Model selection never touches real data: a seeded hold-out part of the *answered* queries scores each
candidate by agreement with the released labels.

Semi-supervised step (optional): after fitting on the labelled queries, the unanswered queries on which the
student is confident (softmax probability ≥ ``pseudo_confidence``) are added with their predicted label and a
smaller weight, and the head is refitted. Whether that helps is measured on the same hold-out, and the
variant with the better hold-out agreement is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from capc_common.errors import InputError
from capc_common.learn.heads import HeadEnsemble, HeadKind, train_heads

__all__ = ["StudentFit", "accuracy", "load_student", "save_student", "train_student"]


@dataclass(frozen=True)
class StudentFit:
    """A trained student head and how it was chosen.

    Attributes:
        head: a single-head :class:`HeadEnsemble`.
        l2: the selected weight decay.
        pseudo_labelled: number of unanswered queries added with pseudo-labels (0 if that did not help).
        selection: hold-out agreement of every candidate, for the report.
    """

    head: HeadEnsemble
    l2: float
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
    l2: float,
    kind: HeadKind,
    hidden: int,
    max_iter: int,
    seed: int,
) -> HeadEnsemble:
    return train_heads(
        x,
        y,
        owners=np.zeros(len(y), np.int64),
        heads=1,
        classes=classes,
        kind=kind,
        l2=l2,
        hidden=hidden,
        max_iter=max_iter,
        weights=w,
        seed=seed,
    )


def _pseudo(
    head: HeadEnsemble, unlabelled: npt.NDArray[np.float32], *, confidence: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Indices and labels of the unlabelled rows the head predicts with probability ≥ ``confidence``."""
    probs = torch.softmax(head.logits(unlabelled)[0], dim=1)
    top, label = probs.max(dim=1)
    keep = np.flatnonzero(top.numpy() >= confidence)
    return keep, label.numpy()[keep].astype(np.int64)


def train_student(
    features: npt.ArrayLike,
    labels: npt.ArrayLike,
    *,
    classes: int,
    unlabelled: npt.ArrayLike | None = None,
    l2_grid: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1),
    holdout: float = 0.2,
    pseudo_confidence: float | None = 0.9,
    pseudo_weight: float = 0.5,
    kind: HeadKind = "linear",
    hidden: int = 256,
    max_iter: int = 300,
    seed: int = 0,
) -> StudentFit:
    """Fit the student on labelled query features, choosing hyper-parameters on a hold-out of them.

    Args:
        features: float ``(n, dim)`` features of the answered queries.
        labels: ``(n,)`` their released labels (hard labels).
        classes: number of classes.
        unlabelled: float ``(u, dim)`` features of unanswered queries, for pseudo-labels (optional).
        l2_grid: candidate weight decays.
        holdout: fraction of the answered queries held out for selection (0: take the middle of the grid
            and skip pseudo-label selection).
        pseudo_confidence: probability above which an unanswered query gets a pseudo-label; ``None``
            disables pseudo-labels.
        pseudo_weight: weight of a pseudo-labelled row relative to an answered one.
        kind: ``"linear"`` or ``"mlp"`` head.
        hidden: hidden width of an MLP head.
        max_iter: L-BFGS iterations per fit.
        seed: seeds the hold-out split and the MLP initialisation (public randomness).

    Returns:
        The refitted :class:`StudentFit` (trained on all answered queries with the chosen settings).

    Raises:
        InputError: no labelled queries, mismatched shapes, or labels out of range.
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
    if y.min() < 0 or y.max() >= classes:
        raise InputError(f"student labels must lie in [0, {classes}), got [{y.min()}, {y.max()}]")
    u = np.zeros((0, x.shape[1]), np.float32) if unlabelled is None else np.asarray(unlabelled, np.float32)
    if u.ndim != 2 or u.shape[1] != x.shape[1]:
        raise InputError(f"unlabelled features must be (u, {x.shape[1]}), got {u.shape}")
    fit = partial(_fit, classes=classes, kind=kind, hidden=hidden, max_iter=max_iter, seed=seed)

    rng = np.random.default_rng(seed)
    n_hold = round(holdout * len(y))
    selection: dict[str, Any] = {"holdout": n_hold, "l2": {}, "pseudo": {}}
    if n_hold < 1 or n_hold >= len(y):
        l2 = sorted(l2_grid)[len(l2_grid) // 2]
        use_pseudo = pseudo_confidence is not None and len(u) > 0
    else:
        perm = rng.permutation(len(y))
        hold, keep = perm[:n_hold], perm[n_hold:]
        scores = {}
        heads = {}
        for c in l2_grid:
            heads[c] = fit(x[keep], y[keep], None, l2=c)
            scores[c] = accuracy(heads[c].predict(x[hold])[0], y[hold])
        selection["l2"] = {f"{c:g}": s for c, s in scores.items()}
        l2 = max(l2_grid, key=lambda c: (scores[c], c))  # ties → stronger regularisation
        use_pseudo = False
        if pseudo_confidence is not None and len(u) > 0:
            idx, lab = _pseudo(heads[l2], u, confidence=pseudo_confidence)
            if len(idx):
                weights = np.concatenate([np.ones(len(keep)), np.full(len(idx), pseudo_weight)])
                head = fit(
                    np.concatenate([x[keep], u[idx]]),
                    np.concatenate([y[keep], lab]),
                    weights.astype(np.float32),
                    l2=l2,
                )
                with_pseudo = accuracy(head.predict(x[hold])[0], y[hold])
                selection["pseudo"] = {"without": scores[l2], "with": with_pseudo, "rows": len(idx)}
                use_pseudo = with_pseudo > scores[l2]

    head = fit(x, y, None, l2=l2)
    added = 0
    if use_pseudo:
        idx, lab = _pseudo(head, u, confidence=float(pseudo_confidence or 1.0))
        if len(idx):
            weights = np.concatenate([np.ones(len(y)), np.full(len(idx), pseudo_weight)]).astype(np.float32)
            head = fit(np.concatenate([x, u[idx]]), np.concatenate([y, lab]), weights, l2=l2)
            added = len(idx)
    return StudentFit(head=head, l2=float(l2), pseudo_labelled=added, selection=selection)


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
