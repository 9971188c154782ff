"""No hospital ends worse off: a party compares, on a holdout of its own data, its best model alone, the
shared student and the shared student fine-tuned on its data, and keeps the best (DESIGN §8).

Why this exists: a federation's student can be worse for some member than what that member trains alone
(a large, clean party; a skewed one; a federation too small for its noise). Publishing the student does not
oblige anyone to use it. Each party holds a holdout out of everything the federation sees
(:func:`capc_common.data.holdout_part`), and after publication scores three candidates on it, locally:

* **alone** — the best of linear heads on the backbone's per-example features (:data:`ALONE_GRID`) and
  (where images are given) a small CNN trained from scratch (:mod:`capc_common.learn.scratch`);
* **shared** — the published student as it is;
* **personalised** — the student's head fine-tuned on the party's training part, pulled towards the shared
  weights by ``λ/2·‖W − W_shared‖²`` (a large λ is the shared head, a small one the party's own fit started
  from it).

**The choice leans to alone.** The holdout is small, so a candidate replaces alone only when it is better on
the holdout beyond chance: among the holdout examples where the two disagree, the candidate must be right
significantly more often than alone, by a one-sided exact sign test (McNemar's test) at level
:attr:`PersonalRecipe.alpha`. A party never trades a model it can measure for one that merely looked better on
a few examples: with two disagreements, one each way or even both for the candidate, alone stays. The kept
linear models are refitted on the training part and the holdout together with the settings chosen (the
holdout chose; it need not be wasted afterwards); the CNN is kept as trained (early stopping already used part
of its data).

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
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.data.partition import (  # the holdout's size lives beside its split (no torch there)
    HOLDOUT_CEILING,
    HOLDOUT_FRACTION,
    HOLDOUT_MINIMUM,
    holdout_fraction,
)
from capc_common.errors import InputError
from capc_common.learn.scratch import CnnRecipe, ScratchCNN, train_scratch_cnn

__all__ = [
    "ALONE_GRID",
    "CANDIDATES",
    "HOLDOUT_CEILING",
    "HOLDOUT_FRACTION",
    "HOLDOUT_MINIMUM",
    "Alone",
    "LinearModel",
    "LinearSpec",
    "PersonalRecipe",
    "Personalised",
    "fit_linear",
    "holdout_fraction",
    "keep",
    "personalise",
    "predict",
    "sign_test",
]

#: The three candidates a party compares, in the order reports list them.
CANDIDATES = ("alone", "shared", "personalised")


@dataclass(frozen=True)
class LinearSpec:
    """One linear head to try alone: its L2 strength and whether the features are standardised first
    (per-feature mean and standard deviation of the training part; the scaling is folded into the weights,
    so the fitted model reads the same L2-normalised features as every other)."""

    l2: float
    standardise: bool = False

    def describe(self) -> str:
        """``l2 1e-4`` or ``standardised, l2 0.1``."""
        return ("standardised, " if self.standardise else "") + f"l2 {self.l2:g}"


#: The alone heads tried (chosen on the holdout). Measured on Fashion-MNIST's validation split (parties of
#: 30 to 6,000 images, docs/results.md "What each party keeps"): on L2-normalised features a small or no
#: penalty wins from 400 images up; standardised features with a strong penalty win below that.
ALONE_GRID = (
    LinearSpec(0.0),
    LinearSpec(1e-4),
    LinearSpec(0.03, standardise=True),
    LinearSpec(0.1, standardise=True),
    LinearSpec(0.3, standardise=True),
)


@dataclass(frozen=True)
class PersonalRecipe:
    """How the candidates are fitted and chosen.

    Attributes:
        alone_grid: the alone heads tried (:class:`LinearSpec`).
        tune_grid: strengths λ of the pull towards the shared weights tried for the personalised head.
        steps: full-batch Adam steps of every linear fit.
        lr: Adam's learning rate (the benchmarks' local-only head: 100 steps at 0.1 on normalised features).
        alpha: the level of the one-sided sign test a candidate must pass against alone to be kept.
        cnn: the from-scratch CNN's recipe (None: no CNN among the alone candidates).
        cnn_minimum: training images below which the CNN is not tried. Measured on Fashion-MNIST's validation
            split (docs/results.md, "What each hospital keeps"): from scratch on 30 and 100 images it
            reached 17–37 % where the linear head reached 59–77 %; a CNN needs images to learn features
            the backbone already has.
    """

    alone_grid: tuple[LinearSpec, ...] = ALONE_GRID
    tune_grid: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    steps: int = 100
    lr: float = 0.1
    alpha: float = 0.1
    cnn: CnnRecipe | None = field(default_factory=CnnRecipe)
    cnn_minimum: int = 300

    def __post_init__(self) -> None:
        strengths = [spec.l2 for spec in self.alone_grid] + list(self.tune_grid)
        if not self.alone_grid or not self.tune_grid or min(strengths) < 0:
            raise InputError("the alone and fine-tuning grids need at least one strength each, all >= 0")
        if self.steps < 1 or not self.lr > 0 or not 0 < self.alpha < 1:
            raise InputError(
                f"need steps >= 1, lr > 0 and 0 < alpha < 1; got steps={self.steps}, lr={self.lr}, "
                f"alpha={self.alpha}"
            )

    def describe(self) -> dict[str, Any]:
        """The recipe as plain values (for model cards and benchmark settings)."""
        return {
            "alone_grid": [spec.describe() for spec in self.alone_grid],
            "tune_grid": list(self.tune_grid),
            "steps": self.steps,
            "lr": self.lr,
            "alpha": self.alpha,
            "cnn": None if self.cnn is None else self.cnn.describe(),
            "cnn_minimum": self.cnn_minimum,
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
    *,
    classes: int,
    l2: Sequence[float],
    prior: npt.NDArray[np.float64] | None,
    steps: int,
    lr: float,
) -> npt.NDArray[np.float64]:
    """One linear head per strength of ``l2``, all at once on the same rows: head ``h`` minimises the mean
    cross-entropy plus ``l2[h]/2·‖W_h − W_prior‖²`` (weights only, biases free), by full-batch Adam from the
    prior (zero without one). Returns ``(heads, classes, dim + 1)``."""
    import torch

    from capc_common.threads import threads_limited

    heads, (n, dim) = len(l2), x.shape
    start = np.zeros((classes, dim + 1)) if prior is None else np.asarray(prior, dtype=np.float64)
    if start.shape != (classes, dim + 1):
        raise InputError(f"the shared head is {start.shape}; features need ({classes}, {dim + 1})")
    with threads_limited(1):
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        target = torch.from_numpy(np.asarray(y, dtype=np.int64))
        w0 = torch.from_numpy(start[:, :-1].astype(np.float32))
        w = w0.unsqueeze(0).repeat(heads, 1, 1).requires_grad_(True)
        b = torch.from_numpy(start[:, -1].astype(np.float32)).unsqueeze(0).repeat(heads, 1)
        b.requires_grad_(True)
        strength = torch.tensor(list(l2), dtype=torch.float32)
        optimizer = torch.optim.Adam([w, b], lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            logits = (xt @ w.reshape(heads * classes, dim).T).reshape(n, heads, classes) + b
            nll = -torch.log_softmax(logits, dim=2).gather(2, target[:, None, None].expand(n, heads, 1))[
                :, :, 0
            ]
            penalty = 0.5 * (strength * ((w - w0) ** 2).sum(dim=(1, 2))).sum()
            (nll.sum() / n + penalty).backward()
            optimizer.step()
        out = torch.cat([w.detach(), b.detach().unsqueeze(2)], dim=2)
    return out.numpy().astype(np.float64)


def _standardised(
    x: npt.NDArray[np.float32],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``x`` with zero-mean, unit-variance columns, and the mean and scale used."""
    mean = x.mean(axis=0, dtype=np.float64)
    scale = x.std(axis=0, dtype=np.float64) + 1e-6
    return ((x - mean) / scale).astype(np.float32), mean, scale


def fit_linear(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    classes: int,
    grid: Sequence[LinearSpec],
    recipe: PersonalRecipe,
    space: str,
    prior: npt.NDArray[np.float64] | None = None,
) -> list[LinearModel]:
    """One head per spec of ``grid``, each fitted on all of ``(x, y)`` (those sharing a standardisation in one
    batched fit), as models over ``x``'s own space (a standardisation folded into the weights).

    With a ``prior`` (the shared head) every head starts there and the spec's L2 pulls towards it; a prior
    cannot be combined with standardisation (it lives in the unscaled space).
    """
    xs = np.asarray(x, dtype=np.float32)
    ys = np.asarray(y, dtype=np.int64)
    if xs.ndim != 2 or ys.shape != (len(xs),) or not len(ys):
        raise InputError(f"need features (N, dim) and N labels with N >= 1, got {xs.shape} and {ys.shape}")
    if prior is not None and any(spec.standardise for spec in grid):
        raise InputError("a head pulled towards the shared weights cannot be fitted on standardised features")
    models: list[LinearModel | None] = [None] * len(grid)
    for standardise in (False, True):
        which = [i for i, spec in enumerate(grid) if spec.standardise == standardise]
        if not which:
            continue
        inputs, mean, scale = _standardised(xs) if standardise else (xs, None, None)
        heads = _fit_heads(
            inputs,
            ys,
            classes=classes,
            l2=[grid[i].l2 for i in which],
            prior=prior,
            steps=recipe.steps,
            lr=recipe.lr,
        )
        for i, head in zip(which, heads, strict=True):
            if mean is not None and scale is not None:  # fold the scaling in: W' = W/s, b' = b − W'·m
                w = head[:, :-1] / scale
                head = np.concatenate([w, (head[:, -1] - w @ mean)[:, None]], axis=1)
            models[i] = LinearModel(head, space)
    return [m for m in models if m is not None]


def _best(
    models: Sequence[LinearModel], holdout: npt.NDArray[np.float32], labels: npt.NDArray[np.int64]
) -> tuple[int, list[float]]:
    """Index of the most accurate model on the holdout (ties → the first) and every model's accuracy."""
    scores = [float((m.predict(holdout) == labels).mean()) for m in models]
    return int(np.argmax(scores)), scores


def sign_test(wins: int, losses: int) -> float:
    """One-sided p-value of ``wins`` against ``losses`` among the disagreements, if either side were as likely
    to be right: ``P(Binomial(wins + losses, 1/2) ≥ wins)`` (McNemar's exact test)."""
    n = wins + losses
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n if n else 1.0


def keep(correct: Mapping[str, npt.NDArray[np.bool_]], *, alpha: float) -> tuple[str, dict[str, Any]]:
    """Which candidate to keep from each one's per-example correctness on the holdout.

    ``alone`` stays unless another candidate, where it and alone disagree, is right significantly more often
    (:func:`sign_test` below ``alpha``); among those that are, the most accurate wins (ties → the earlier of
    :data:`CANDIDATES`).

    Returns:
        The kept name and, per challenger, ``{"gain", "wins", "losses", "p_value", "significant"}``.
    """
    if "alone" not in correct:
        raise InputError("the comparison needs the party's model alone")
    alone = np.asarray(correct["alone"], dtype=bool)
    tests: dict[str, Any] = {}
    winners = []
    for name in CANDIDATES[1:]:
        if name not in correct:
            continue
        other = np.asarray(correct[name], dtype=bool)
        wins, losses = int((other & ~alone).sum()), int((alone & ~other).sum())
        p = sign_test(wins, losses)
        significant = wins > losses and p < alpha
        gain = (wins - losses) / len(alone) if len(alone) else 0.0
        tests[name] = {"gain": gain, "wins": wins, "losses": losses, "p_value": p, "significant": significant}
        if significant:
            winners.append((float(other.mean()), -CANDIDATES.index(name), name))
    return (max(winners)[2] if winners else "alone"), tests


Inputs = Mapping[str, Any]


def predict(model: LinearModel | ScratchCNN, inputs: Inputs) -> npt.NDArray[np.int64]:
    """``model``'s labels on ``inputs`` (``{"per-example": features, "student": features, "images": uint8}``:
    each model reads the one it was trained on)."""
    if isinstance(model, ScratchCNN):
        return model.predict(inputs["images"])
    return model.predict(inputs[model.space])


@dataclass(frozen=True)
class Split:
    """A party's examples, divided into the training part and the holdout (:func:`holdout_part`).

    Attributes:
        train: the training part's inputs: ``per-example`` features (L2-normalised), ``student`` features in
            the shared student's space (needed to personalise), ``images`` (uint8, for the CNN; optional).
        train_labels: their labels.
        holdout: the same inputs for the holdout.
        holdout_labels: their labels.
    """

    train: Inputs
    train_labels: npt.NDArray[np.int64]
    holdout: Inputs
    holdout_labels: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        ty, hy = self.train_labels, self.holdout_labels
        if not len(ty) or not len(hy):
            raise InputError(
                f"personalising needs examples in both the training part ({len(ty)}) and the holdout "
                f"({len(hy)}); raise the site file's holdout fraction if the holdout is empty"
            )
        for name, part, count in (("training part", self.train, len(ty)), ("holdout", self.holdout, len(hy))):
            for key, value in part.items():
                if len(value) != count:
                    raise InputError(f"the {name}'s {key} inputs have {len(value)} rows for {count} labels")

    def both(self, key: str) -> npt.NDArray[Any]:
        """Input ``key`` of the training part and the holdout together."""
        return np.concatenate([np.asarray(self.train[key]), np.asarray(self.holdout[key])])

    @property
    def labels(self) -> npt.NDArray[np.int64]:
        """The labels of the training part and the holdout together."""
        return np.concatenate([self.train_labels, self.holdout_labels])


@dataclass(frozen=True)
class Alone:
    """A party's best model alone and how it was chosen.

    Attributes:
        model: a :class:`LinearModel` over per-example features (refitted on the whole party) or the
            :class:`ScratchCNN` (as trained on the training part).
        correct: per holdout example, whether the choice's training-part fit was right.
        holdout: holdout accuracy of ``alone-linear`` (the best head), ``alone-cnn`` (if tried) and ``alone``.
        detail: the head chosen, every head's holdout accuracy, the CNN's epochs.
    """

    model: LinearModel | ScratchCNN
    correct: npt.NDArray[np.bool_]
    holdout: dict[str, float]
    detail: dict[str, Any]


def fit_alone(
    split: Split,
    *,
    classes: int,
    recipe: PersonalRecipe | None = None,
    seed: int = 0,
    log: Callable[[str], None] = lambda _: None,
) -> Alone:
    """The party's best model alone: every head of :attr:`PersonalRecipe.alone_grid` and (with images and a
    CNN recipe) the CNN from scratch fitted on the training part, the most accurate on the holdout kept; a
    head is refitted on the whole party with its setting."""
    recipe = recipe or PersonalRecipe()
    hy = split.holdout_labels
    heads = fit_linear(
        split.train["per-example"],
        split.train_labels,
        classes=classes,
        grid=recipe.alone_grid,
        recipe=recipe,
        space="per-example",
    )
    pick, scores = _best(heads, split.holdout["per-example"], hy)
    spec = recipe.alone_grid[pick]
    names = [s.describe() for s in recipe.alone_grid]
    detail: dict[str, Any] = {"head": spec.describe(), "heads": dict(zip(names, scores, strict=True))}
    correct = {"alone-linear": heads[pick].predict(split.holdout["per-example"]) == hy}
    log(f"alone, linear head ({spec.describe()}): {scores[pick]:.4f} on the holdout")
    cnn = None
    if recipe.cnn is not None and "images" in split.train and len(split.train_labels) >= recipe.cnn_minimum:
        cnn = train_scratch_cnn(
            split.train["images"], split.train_labels, classes=classes, recipe=recipe.cnn, seed=seed
        )
        correct["alone-cnn"] = cnn.predict(split.holdout["images"]) == hy
        detail["cnn"] = {"epochs": cnn.epochs, "best_epoch": cnn.best_epoch}
        log(f"alone, CNN from scratch: {correct['alone-cnn'].mean():.4f} on the holdout")
    model: LinearModel | ScratchCNN
    if cnn is not None and correct["alone-cnn"].mean() > correct["alone-linear"].mean():
        model, correct["alone"] = cnn, correct["alone-cnn"]
    else:
        correct["alone"] = correct["alone-linear"]
        model = fit_linear(
            split.both("per-example"),
            split.labels,
            classes=classes,
            grid=[spec],
            recipe=recipe,
            space="per-example",
        )[0]
    detail["kind"] = "cnn" if isinstance(model, ScratchCNN) else "linear"
    return Alone(model, correct["alone"], {k: float(v.mean()) for k, v in correct.items()}, detail)


@dataclass(frozen=True)
class Personalised:
    """What a party found on its holdout, and the models behind it.

    Attributes:
        holdout: accuracy of each candidate on the holdout (``alone``, ``shared``, ``personalised``, and the
            alone candidates ``alone-linear`` / ``alone-cnn``).
        kept: the candidate kept (one of :data:`CANDIDATES`).
        alone: the party's best model alone.
        shared: the shared student (over its own space).
        personalised: the fine-tuned student, refitted on the whole party.
        detail: the settings chosen, every setting's holdout accuracy, the keep test, sizes.
    """

    holdout: dict[str, float]
    kept: str
    alone: LinearModel | ScratchCNN
    shared: LinearModel
    personalised: LinearModel
    detail: dict[str, Any]

    def model(self, name: str) -> LinearModel | ScratchCNN:
        """The model of candidate ``name`` (``kept`` for the kept one)."""
        name = self.kept if name == "kept" else name
        models = {"alone": self.alone, "shared": self.shared, "personalised": self.personalised}
        if name not in models:
            raise InputError(f"no {name!r} model: candidates are {', '.join(CANDIDATES)} and kept")
        return models[name]


def personalise(
    split: Split,
    *,
    classes: int,
    shared: npt.NDArray[np.float64],
    alone: Alone | None = None,
    recipe: PersonalRecipe | None = None,
    seed: int = 0,
    log: Callable[[str], None] = lambda _: None,
) -> Personalised:
    """Compare the party's best model alone (``alone``, else :func:`fit_alone`), the shared student and the
    student fine-tuned on the training part on the holdout, and keep one (:func:`keep`).

    Every candidate's own setting (the alone head, the CNN against the head, the personalised head's λ) is
    chosen on the holdout, so each holdout score is a maximum over that candidate's settings: alone has the
    most settings, so this can only flatter alone and the choice stays conservative. The personalised head is
    refitted on the whole party with the λ chosen.

    Args:
        split: the party's training part and holdout.
        classes: number of classes.
        shared: the shared student's head ``(classes, dim + 1)`` over the split's ``student`` features.
        alone: the party's model alone, if already fitted (it does not depend on the student).
        recipe: how to fit and choose.
        seed: the CNN's seed.
        log: progress messages.
    """
    recipe = recipe or PersonalRecipe()
    alone = alone or fit_alone(split, classes=classes, recipe=recipe, seed=seed, log=log)
    hy = split.holdout_labels
    shared_model = LinearModel(np.asarray(shared, dtype=np.float64), "student")
    correct = {"alone": alone.correct, "shared": shared_model.predict(split.holdout["student"]) == hy}
    tune = [LinearSpec(strength) for strength in recipe.tune_grid]
    fit = partial(fit_linear, classes=classes, recipe=recipe, space="student", prior=shared_model.weights)
    tuned = fit(split.train["student"], split.train_labels, grid=tune)
    pick, scores = _best(tuned, split.holdout["student"], hy)
    correct["personalised"] = tuned[pick].predict(split.holdout["student"]) == hy
    personal = fit(split.both("student"), split.labels, grid=[tune[pick]])[0]
    log(
        f"shared {correct['shared'].mean():.4f}, personalised (λ {recipe.tune_grid[pick]:g}) "
        f"{correct['personalised'].mean():.4f} on the holdout"
    )
    kept, tests = keep(correct, alpha=recipe.alpha)
    detail = {
        "train_examples": len(split.train_labels),
        "holdout_examples": len(hy),
        "alone": alone.detail,
        "personalised": {
            "strength": recipe.tune_grid[pick],
            "holdout": dict(zip(recipe.tune_grid, scores, strict=True)),
        },
        "keep_test": tests,
    }
    holdout = {**alone.holdout, **{k: float(v.mean()) for k, v in correct.items()}}
    return Personalised(holdout, kept, alone.model, shared_model, personal, detail)
