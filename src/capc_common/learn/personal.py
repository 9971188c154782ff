"""No hospital ends worse off: a party compares, on a holdout of its own data, its best model alone, the
shared student and the shared student fine-tuned on its data, and keeps the best (DESIGN §8).

Why this exists: a federation's student can be worse for some member than what that member trains alone
(a large, clean party; a skewed one; a federation too small for its noise). Publishing the student does not
oblige anyone to use it. Each party holds a holdout out of everything the federation sees
(:func:`capc_common.data.holdout_part`), and after publication scores three candidates on it, locally:

* **alone** — the best of a linear head on the backbone's per-example features, its L2 strength chosen by
  k-fold cross-validation on the training part, and (where images are given) a small CNN trained from scratch
  (:mod:`capc_common.learn.scratch`);
* **shared** — the published student as it is;
* **personalised** — the student's head fine-tuned on the party's training part, pulled towards the shared
  weights by ``λ/2·‖W − W_shared‖²`` with λ chosen by cross-validation too (a large λ is the shared head, a
  small one the party's own fit started from it).

**The choice leans to alone.** The holdout is small, so a candidate replaces alone only when its holdout
advantage over alone exceeds :attr:`PersonalRecipe.margin` standard errors of the paired difference (the
per-example disagreements between the two: a McNemar-style test). A party never trades a model it can measure
for one that merely looked better on a few examples. The kept linear model is refitted on the training part
and the holdout together with the chosen λ (the holdout chose; it need not be wasted afterwards); the CNN is
kept as trained (early stopping already used part of its data).

Nothing here leaves the site, and the scores should not either: a holdout accuracy is a function of private
examples with no noise added, and publishing the comparison of many parties would reveal how each party's data
relates to the shared model (docs/privacy.md). The services print them only to the site's operator.

All models here are linear heads ``(classes, dim + 1)``, bias last, over the space the caller prepared: the
L2-normalised per-example features for the alone head (what the release mechanisms' students use too), the
shared student's own space for the shared and personalised heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.learn.scratch import CnnRecipe, ScratchCNN, train_scratch_cnn

__all__ = [
    "CANDIDATES",
    "LinearModel",
    "Personalised",
    "PersonalRecipe",
    "fit_linear",
    "keep",
    "personalise",
]

#: The three candidates a party compares, in the order reports list them.
CANDIDATES = ("alone", "shared", "personalised")


@dataclass(frozen=True)
class PersonalRecipe:
    """How the candidates are fitted and chosen.

    Attributes:
        l2_grid: L2 strengths tried for the alone head (cross-validated on the training part).
        tune_grid: strengths λ of the pull towards the shared weights tried for the personalised head.
        folds: cross-validation folds (on the training part only; the holdout is never used to fit).
        steps: full-batch Adam steps of every linear fit.
        lr: Adam's learning rate (the benchmarks' local-only head: 100 steps at 0.1 on normalised features).
        margin: standard errors of the paired holdout difference a candidate must beat alone by to be kept.
        cnn: the from-scratch CNN's recipe (None: no CNN among the alone candidates).
    """

    l2_grid: tuple[float, ...] = (0.0, 1e-4, 1e-3, 1e-2)
    tune_grid: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    folds: int = 3
    steps: int = 100
    lr: float = 0.1
    margin: float = 1.0
    cnn: CnnRecipe | None = field(default_factory=CnnRecipe)

    def __post_init__(self) -> None:
        if not self.l2_grid or not self.tune_grid or min(*self.l2_grid, *self.tune_grid) < 0:
            raise InputError("the L2 and fine-tuning grids need at least one strength each, all >= 0")
        if self.folds < 2 or self.steps < 1 or not self.lr > 0 or self.margin < 0:
            raise InputError(
                f"need folds >= 2, steps >= 1, lr > 0 and margin >= 0; got folds={self.folds}, "
                f"steps={self.steps}, lr={self.lr}, margin={self.margin}"
            )

    def describe(self) -> dict[str, Any]:
        """The recipe as plain values (for model cards and benchmark settings)."""
        return {
            "l2_grid": list(self.l2_grid),
            "tune_grid": list(self.tune_grid),
            "folds": self.folds,
            "steps": self.steps,
            "lr": self.lr,
            "margin": self.margin,
            "cnn": None if self.cnn is None else self.cnn.describe(),
        }


@dataclass(frozen=True)
class LinearModel:
    """A linear head ``(classes, dim + 1)``, bias last, over one feature space.

    Attributes:
        weights: the head.
        space: which features it reads (``per-example``: L2-normalised per-example features;
            ``student``: the shared student's own features).
    """

    weights: npt.NDArray[np.float64]
    space: str

    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Labels ``(N,)`` of features ``(N, dim)`` in :attr:`space` (ties → lowest class)."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.weights.shape[1] - 1:
            raise InputError(
                f"features must be (N, {self.weights.shape[1] - 1}) for this head, got {x.shape}"
            )
        return np.argmax(x @ self.weights[:, :-1].T + self.weights[:, -1], axis=1).astype(np.int64)


def _fit_heads(
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    groups: Sequence[npt.NDArray[np.int64]],
    *,
    classes: int,
    l2: Sequence[float],
    prior: npt.NDArray[np.float64] | None,
    steps: int,
    lr: float,
) -> npt.NDArray[np.float64]:
    """One linear head per group of rows, all at once: head ``h`` minimises the mean cross-entropy over
    ``x[groups[h]]`` plus ``l2[h]/2·‖W_h − W_prior‖²`` (weights only, biases free), by full-batch Adam from
    the prior (zero without one). Returns ``(heads, classes, dim + 1)``."""
    import torch

    from capc_common.threads import threads_limited

    heads, (n, dim) = len(groups), x.shape
    mask = np.zeros((n, heads), dtype=np.float32)
    for h, rows in enumerate(groups):
        if len(rows):
            mask[rows, h] = 1.0 / len(rows)
    start = np.zeros((classes, dim + 1)) if prior is None else np.asarray(prior, dtype=np.float64)
    if start.shape != (classes, dim + 1):
        raise InputError(f"the shared head is {start.shape}; features need ({classes}, {dim + 1})")
    with threads_limited(1):
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        target = torch.from_numpy(np.asarray(y, dtype=np.int64))
        m = torch.from_numpy(mask)
        w0 = torch.from_numpy(start[:, :-1].astype(np.float32))
        w = w0.unsqueeze(0).repeat(heads, 1, 1).requires_grad_(True)
        b = torch.from_numpy(start[:, -1].astype(np.float32)).unsqueeze(0).repeat(heads, 1)
        b.requires_grad_(True)
        strength = torch.tensor(list(l2), dtype=torch.float32)
        optimizer = torch.optim.Adam([w, b], lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            logits = (xt @ w.reshape(heads * classes, dim).T).reshape(n, heads, classes) + b
            nll = -torch.log_softmax(logits, dim=2).gather(
                2, target[:, None, None].expand(n, heads, 1)
            )[:, :, 0]
            penalty = 0.5 * (strength * ((w - w0) ** 2).sum(dim=(1, 2))).sum()
            ((nll * m).sum() + penalty).backward()
            optimizer.step()
        out = torch.cat([w.detach(), b.detach().unsqueeze(2)], dim=2)
    return out.numpy().astype(np.float64)


def _folds(n: int, folds: int, seed: int) -> list[npt.NDArray[np.int64]]:
    """``folds`` disjoint index sets covering ``range(n)`` (a seeded permutation: a local split, not secret)."""
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(order[k::folds]).astype(np.int64) for k in range(folds)]


def fit_linear(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    classes: int,
    grid: Sequence[float],
    recipe: PersonalRecipe,
    space: str,
    prior: npt.NDArray[np.float64] | None = None,
    seed: int = 0,
) -> tuple[LinearModel, dict[str, Any]]:
    """The linear head whose strength from ``grid`` cross-validates best on ``(x, y)``, refitted on all of it.

    Every (strength, fold) pair is one head of one batched fit; the strength with the best mean held-out
    accuracy wins (ties: the larger strength, the simpler model). With fewer examples than folds the first
    strength is used without cross-validation.

    Returns:
        The model and ``{"strength", "cv_accuracy": {strength: accuracy}}``.
    """
    xs = np.asarray(x, dtype=np.float32)
    ys = np.asarray(y, dtype=np.int64)
    if xs.ndim != 2 or ys.shape != (len(xs),) or not len(ys):
        raise InputError(f"need features (N, dim) and N labels with N >= 1, got {xs.shape} and {ys.shape}")
    scores: dict[float, float] = {}
    chosen = float(grid[0])
    if len(ys) >= recipe.folds and len(grid) > 1:
        parts = _folds(len(ys), recipe.folds, seed)
        everything = np.arange(len(ys))
        groups = [np.setdiff1d(everything, part) for _ in grid for part in parts]
        strengths = [float(s) for s in grid for _ in parts]
        heads = _fit_heads(
            xs, ys, groups, classes=classes, l2=strengths, prior=prior, steps=recipe.steps, lr=recipe.lr
        )
        for i, s in enumerate(grid):
            correct = 0
            for k, part in enumerate(parts):
                model = LinearModel(heads[i * len(parts) + k], space)
                correct += int((model.predict(xs[part]) == ys[part]).sum())
            scores[float(s)] = correct / len(ys)
        best = max(scores.values())
        chosen = max(s for s, v in scores.items() if v == best)
    final = _fit_heads(
        xs,
        ys,
        [np.arange(len(ys))],
        classes=classes,
        l2=[chosen],
        prior=prior,
        steps=recipe.steps,
        lr=recipe.lr,
    )[0]
    return LinearModel(final, space), {"strength": chosen, "cv_accuracy": scores}


def keep(
    correct: Mapping[str, npt.NDArray[np.bool_]], *, margin: float
) -> tuple[str, dict[str, Any]]:
    """Which candidate to keep from each one's per-example correctness on the holdout.

    ``alone`` stays unless another candidate's accuracy exceeds it by more than ``margin`` standard errors of
    the paired difference ``mean(c − a)`` (estimated from the disagreements); among those that do, the most
    accurate wins (ties → the earlier of :data:`CANDIDATES`).

    Returns:
        The kept name and, per challenger, ``{"gain", "standard_error", "significant"}``.
    """
    if "alone" not in correct:
        raise InputError("the comparison needs the party's model alone")
    alone = np.asarray(correct["alone"], dtype=np.float64)
    n = len(alone)
    tests: dict[str, Any] = {}
    winners = []
    for name in CANDIDATES[1:]:
        if name not in correct:
            continue
        diff = np.asarray(correct[name], dtype=np.float64) - alone
        gain = float(diff.mean()) if n else 0.0
        se = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
        significant = n > 1 and gain > 0 and gain > margin * se
        tests[name] = {"gain": gain, "standard_error": se, "significant": bool(significant)}
        if significant:
            winners.append((float(np.mean(correct[name])), -CANDIDATES.index(name), name))
    return (max(winners)[2] if winners else "alone"), tests


@dataclass(frozen=True)
class Personalised:
    """What a party found on its holdout, and the models behind it.

    Attributes:
        holdout: accuracy of each candidate on the holdout (``alone``, ``shared``, ``personalised``, and the
            alone candidates ``alone-linear`` / ``alone-cnn``).
        kept: the candidate kept (one of :data:`CANDIDATES`).
        alone: the alone model (a :class:`LinearModel` over per-example features, or a :class:`ScratchCNN`).
        shared: the shared student (over its own space), or None.
        personalised: the fine-tuned student, or None.
        detail: strengths chosen, cross-validation scores, the keep test, sizes.
    """

    holdout: dict[str, float]
    kept: str
    alone: LinearModel | ScratchCNN
    shared: LinearModel | None
    personalised: LinearModel | None
    detail: dict[str, Any]

    def model(self, name: str) -> LinearModel | ScratchCNN:
        """The model of candidate ``name`` (``kept`` for the kept one)."""
        name = self.kept if name == "kept" else name
        found = {"alone": self.alone, "shared": self.shared, "personalised": self.personalised}.get(name)
        if found is None:
            raise InputError(f"no {name!r} model: candidates are {', '.join(CANDIDATES)}")
        return found


Inputs = Mapping[str, Any]


def predict(model: LinearModel | ScratchCNN, inputs: Inputs) -> npt.NDArray[np.int64]:
    """``model``'s labels on ``inputs`` (``{"per-example": features, "student": features, "images": uint8}``:
    each model reads the one it was trained on)."""
    if isinstance(model, ScratchCNN):
        return model.predict(inputs["images"])
    return model.predict(inputs[model.space])


def personalise(
    train: Inputs,
    train_labels: npt.ArrayLike,
    holdout: Inputs,
    holdout_labels: npt.ArrayLike,
    *,
    classes: int,
    shared: npt.NDArray[np.float64] | None,
    recipe: PersonalRecipe | None = None,
    seed: int = 0,
    log: Callable[[str], None] = lambda _: None,
) -> Personalised:
    """Fit the candidates on ``train``, score them on ``holdout``, keep one (:func:`keep`), refit the kept
    linear model on both.

    Args:
        train: the training part's inputs: ``per-example`` features (L2-normalised), ``student`` features in
            the shared student's space (needed with ``shared``), ``images`` (uint8, for the CNN; optional).
        train_labels: their labels.
        holdout: the same inputs for the holdout.
        holdout_labels: their labels.
        classes: number of classes.
        shared: the shared student's head ``(classes, dim + 1)`` over ``student`` features, or None (no
            student yet: alone only).
        recipe: how to fit and choose.
        seed: the local splits' and the CNN's seed.
        log: progress messages.

    Raises:
        InputError: an empty training part or holdout, or inputs of mismatched lengths.
    """
    recipe = recipe or PersonalRecipe()
    ty = np.asarray(train_labels, dtype=np.int64)
    hy = np.asarray(holdout_labels, dtype=np.int64)
    if not len(ty) or not len(hy):
        raise InputError(
            f"personalising needs examples in both the training part ({len(ty)}) and the holdout ({len(hy)}); "
            "raise holdout.fraction in the site file if the holdout is empty"
        )
    for name, part, count in (("training part", train, len(ty)), ("holdout", holdout, len(hy))):
        for key, value in part.items():
            if len(value) != count:
                raise InputError(f"the {name}'s {key} inputs have {len(value)} rows for {count} labels")
    detail: dict[str, Any] = {"train_examples": len(ty), "holdout_examples": len(hy)}
    linear, info = fit_linear(
        train["per-example"], ty, classes=classes, grid=recipe.l2_grid, recipe=recipe, space="per-example",
        seed=seed,
    )
    detail["alone_linear"] = info
    correct: dict[str, npt.NDArray[np.bool_]] = {"alone-linear": predict(linear, holdout) == hy}
    alone: LinearModel | ScratchCNN = linear
    log(f"alone, linear head (L2 {info['strength']:g}): {correct['alone-linear'].mean():.4f} on the holdout")
    if recipe.cnn is not None and "images" in train and len(ty) >= 2:
        cnn = train_scratch_cnn(train["images"], ty, classes=classes, recipe=recipe.cnn, seed=seed)
        correct["alone-cnn"] = predict(cnn, holdout) == hy
        detail["alone_cnn"] = {"epochs": cnn.epochs, "best_epoch": cnn.best_epoch}
        log(f"alone, CNN from scratch: {correct['alone-cnn'].mean():.4f} on the holdout")
        if correct["alone-cnn"].mean() > correct["alone-linear"].mean():
            alone = cnn
    correct["alone"] = correct["alone-cnn" if alone is not linear else "alone-linear"]
    shared_model = personal = None
    if shared is not None:
        shared_model = LinearModel(np.asarray(shared, dtype=np.float64), "student")
        correct["shared"] = predict(shared_model, holdout) == hy
        personal, tuned = fit_linear(
            train["student"], ty, classes=classes, grid=recipe.tune_grid, recipe=recipe, space="student",
            prior=shared_model.weights, seed=seed,
        )
        detail["personalised"] = tuned
        correct["personalised"] = predict(personal, holdout) == hy
        log(
            f"shared {correct['shared'].mean():.4f}, personalised (λ {tuned['strength']:g}) "
            f"{correct['personalised'].mean():.4f} on the holdout"
        )
    kept, tests = keep({k: correct[k] for k in CANDIDATES if k in correct}, margin=recipe.margin)
    detail["keep_test"] = tests
    # Refit the kept linear model on everything the party has (the holdout has chosen).
    both_y = np.concatenate([ty, hy])
    if kept == "alone" and isinstance(alone, LinearModel):
        strength = detail["alone_linear"]["strength"]
        alone = _refit(train, holdout, both_y, "per-example", strength, None, classes, recipe)
    elif kept == "personalised" and shared_model is not None:
        strength = detail["personalised"]["strength"]
        personal = _refit(train, holdout, both_y, "student", strength, shared_model.weights, classes, recipe)
    holdout_scores = {k: float(v.mean()) for k, v in correct.items()}
    return Personalised(holdout_scores, kept, alone, shared_model, personal, detail)


def _refit(
    train: Inputs,
    holdout: Inputs,
    labels: npt.NDArray[np.int64],
    space: str,
    strength: float,
    prior: npt.NDArray[np.float64] | None,
    classes: int,
    recipe: PersonalRecipe,
) -> LinearModel:
    x = np.concatenate([np.asarray(train[space]), np.asarray(holdout[space])])
    weights = _fit_heads(
        x.astype(np.float32),
        labels,
        [np.arange(len(labels))],
        classes=classes,
        l2=[strength],
        prior=prior,
        steps=recipe.steps,
        lr=recipe.lr,
    )[0]
    return LinearModel(weights, space)
