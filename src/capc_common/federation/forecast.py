"""What a consortium can expect, with an honest interval: a small model fitted to the joining benchmark's
measurements, its error measured by leaving each measured layout out.

``capc federation plan`` must not promise what nobody measured. The joining benchmark
(``benchmarks/joining.py``) measures, on two real datasets and many party layouts, the federation's student
(secure-aggregation DP-SGD), each party's strongest model alone and what each party keeps. From those
measurements this module fits, for the student's accuracy and the median and the best party's accuracy
alone, a ridge regression of the accuracy's logit on public descriptors of the consortium:

* log10 of its records, log10 of its median party's records, log10 of ε, log2 of its classes, and whether
  its parties' class mixes are skewed; plus the product of the log-records and log-ε terms (what DP noise
  depends on).

The gains over the median and the best party are the differences of those forecasts. Logits keep every
forecast an accuracy (a straight line in the descriptors crossed 100 % just outside the measured ranges) and
measured smaller leave-one-layout-out errors on the gains (docs/results.md, "The plan's forecast").

**The interval is measured, not assumed.** Every layout is left out in turn, the model refitted on the
others and asked for the left-out layout's figures: the 90th percentile of those leave-one-layout-out errors
is the interval's half-width (per quantity). Where a consortium lies outside what was measured — more or fewer
records, parties, classes or a larger ε than any measured layout — the answer says ``extrapolating`` with the
reason, and the interval is doubled: a model that fits within its data says little beyond it.

The fit is deterministic and takes milliseconds, so it is made from the shipped table at each call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = ["TARGETS", "Consortium", "Forecast", "Forecaster", "Measured", "measured_points"]

#: The quantities forecast (all accuracies as fractions; gains are differences of accuracies).
TARGETS = ("federation", "alone_median", "alone_best", "gain_median", "gain_best")
#: The accuracies fitted (in logit space); each gain is the difference of two of them.
ACCURACIES = ("federation", "alone_median", "alone_best")
#: Accuracies are clipped into [CLIP, 1 − CLIP] before their logit (a layout read at 100 % has no finite one).
CLIP = 1e-3
#: The mechanism the grid measures in every layout (the others only in a few).
MECHANISM = "secagg-dpsgd"
#: Quantile of the leave-one-layout-out errors used as the interval's half-width.
QUANTILE = 0.9
#: How much wider an interval is outside the measured ranges.
EXTRAPOLATION_WIDENING = 2.0
#: Ridge penalty on the standardised descriptors (small: the descriptors are few and informative).
RIDGE = 0.01


@dataclass(frozen=True)
class Consortium:
    """What a consortium knows about itself before it starts: public, planned figures.

    Attributes:
        examples: each party's number of labelled examples.
        classes: number of classes.
        epsilon: the budget's ε.
        skewed: whether the parties' class mixes differ strongly (as Dirichlet(0.5) shards do).
    """

    examples: tuple[int, ...]
    classes: int
    epsilon: float
    skewed: bool = False

    def __post_init__(self) -> None:
        if not self.examples or min(self.examples) < 1:
            raise InputError("need the number of examples of at least one party (each at least 1)")
        if self.classes < 2 or not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise InputError(f"need classes >= 2 and a finite ε > 0, got {self.classes} and {self.epsilon}")

    @property
    def records(self) -> int:
        """All parties' examples together."""
        return sum(self.examples)

    @property
    def median(self) -> float:
        """The median party's examples."""
        return float(np.median(self.examples))

    def descriptors(self) -> dict[str, float]:
        """The model's inputs, named."""
        return {
            "records": math.log10(self.records),
            "median_party": math.log10(self.median),
            "epsilon": math.log10(self.epsilon),
            "classes": math.log2(self.classes),
            "skewed": float(self.skewed),
        }


@dataclass(frozen=True)
class Measured:
    """One measured (layout, ε): the consortium and what the benchmark found (means over seeds)."""

    layout: str
    dataset: str
    consortium: Consortium
    parties: int
    values: dict[str, float]


def measured_points(table: Mapping[str, Any]) -> list[Measured]:
    """Every (layout, ε) of the joining table where the federation and the parties alone were measured.

    A layout's consortium is described by its measured party sizes (their mean over seeds: the median
    party is taken as the mean's party — the layouts' parties are of similar size within a layout, and
    skewed layouts vary around it), counted as the federation sees them: each party's training part, less
    the holdout it keeps at home (the layout's ``holdout_fraction``; what federation.yaml's
    ``teachers[].examples`` declares) — and its nominal classes and skew.
    """
    out = []
    for lay in table.get("layouts", []):
        alone = lay.get("alone")
        if not alone or lay["parties"] < 2:
            continue
        whole = max(1, round(lay["party_sizes"]["mean"]))
        count = max(2, round(lay["records"] / whole))
        size = max(1, round(whole * (1 - float(lay.get("holdout_fraction", 0.0)))))
        for m in lay["mechanisms"]:
            if m["name"] != MECHANISM:
                continue
            consortium = Consortium(
                examples=(size,) * count,
                classes=int(lay["classes"]),
                epsilon=float(m["epsilon"]),
                skewed=lay["skew"] != "uniform",
            )
            fed = float(m["accuracy_mean"])
            values = {
                "federation": fed,
                "alone_median": float(alone["median"]),
                "alone_best": float(alone["max"]),
                "gain_median": fed - float(alone["median"]),
                "gain_best": fed - float(alone["max"]),
            }
            out.append(Measured(lay["name"], lay["dataset"], consortium, lay["parties"], values))
    return out


def _design(descriptors: Sequence[Mapping[str, float]]) -> npt.NDArray[np.float64]:
    """The regression's columns: the five descriptors and records × ε."""
    rows = [
        [
            d["records"],
            d["median_party"],
            d["epsilon"],
            d["classes"],
            d["skewed"],
            d["records"] * d["epsilon"],
        ]
        for d in descriptors
    ]
    return np.asarray(rows, dtype=np.float64)


@dataclass(frozen=True)
class _Ridge:
    """A ridge regression on standardised columns (the intercept unpenalised)."""

    mean: npt.NDArray[np.float64]
    scale: npt.NDArray[np.float64]
    coef: npt.NDArray[np.float64]
    intercept: float

    @classmethod
    def fit(cls, x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], penalty: float) -> _Ridge:
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale < 1e-9] = 1.0  # a constant column (left-out layouts can leave one): no effect
        z = (x - mean) / scale
        centre = float(y.mean())
        coef = np.linalg.solve(z.T @ z + penalty * len(y) * np.eye(z.shape[1]), z.T @ (y - centre))
        return cls(mean, scale, coef, centre)

    def predict(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.asarray(((x - self.mean) / self.scale) @ self.coef + self.intercept)


def _logit(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    c = np.clip(a, CLIP, 1 - CLIP)
    return np.asarray(np.log(c / (1 - c)))


def _fit(points: Sequence[Measured], penalty: float) -> dict[str, _Ridge]:
    """One ridge per accuracy of :data:`ACCURACIES`, on their logits."""
    x = _design([p.consortium.descriptors() for p in points])
    return {
        name: _Ridge.fit(x, _logit(np.asarray([p.values[name] for p in points])), penalty)
        for name in ACCURACIES
    }


def _forecast(models: Mapping[str, _Ridge], x: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[np.float64]]:
    """Every :data:`TARGETS` at the rows of ``x``: the accuracies from their logits, the gains their
    differences."""
    acc = {name: 1 / (1 + np.exp(-models[name].predict(x))) for name in ACCURACIES}
    return {
        **acc,
        "gain_median": acc["federation"] - acc["alone_median"],
        "gain_best": acc["federation"] - acc["alone_best"],
    }


@dataclass(frozen=True)
class Forecast:
    """One quantity's forecast: the estimate and its interval (accuracy fractions)."""

    estimate: float
    low: float
    high: float

    def as_dict(self) -> dict[str, Any]:
        """``{"estimate", "interval": [low, high]}``."""
        return {"estimate": self.estimate, "interval": [self.low, self.high]}


@dataclass
class Forecaster:
    """The fitted model of every :data:`TARGETS`, its leave-one-layout-out errors and the measured ranges.

    Build with :meth:`from_table`.
    """

    points: list[Measured]
    models: dict[str, _Ridge]  # by accuracy (ACCURACIES), on logits
    half_width: dict[str, float]
    errors: dict[str, dict[str, float]]
    ranges: dict[str, tuple[float, float]]
    penalty: float = RIDGE
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], *, penalty: float = RIDGE) -> Forecaster:
        """Fit every quantity on the table's measurements and measure the fit's leave-one-layout-out error.

        Raises:
            InputError: fewer than three measured layouts (nothing to leave out and still fit).
        """
        points = measured_points(table)
        layouts = sorted({p.layout for p in points})
        if len(layouts) < 3:
            raise InputError(
                f"the joining table holds {len(layouts)} measured layouts; a forecast needs at least 3 "
                "(run benchmarks/joining.py --export)"
            )
        models = _fit(points, penalty)
        half, errors = {}, {}
        residuals = leave_one_out(points, penalty=penalty)
        for target in TARGETS:
            half[target] = float(np.quantile(np.abs(residuals[target]), QUANTILE))
            errors[target] = {
                "mean_absolute": float(np.mean(np.abs(residuals[target]))),
                "quantile_90": half[target],
                "largest": float(np.max(np.abs(residuals[target]))),
            }
        ranges = {
            "records": (min(p.consortium.records for p in points), max(p.consortium.records for p in points)),
            "median_party": (
                min(p.consortium.median for p in points),
                max(p.consortium.median for p in points),
            ),
            "parties": (min(p.parties for p in points), max(p.parties for p in points)),
            "epsilon": (min(p.consortium.epsilon for p in points), max(p.consortium.epsilon for p in points)),
            "classes": (min(p.consortium.classes for p in points), max(p.consortium.classes for p in points)),
        }
        return cls(points, models, half, errors, ranges, penalty)

    def outside(self, consortium: Consortium) -> list[str]:
        """Why ``consortium`` lies outside the measured ranges (empty when inside)."""
        values = {
            "records": consortium.records,
            "median_party": consortium.median,
            "parties": len(consortium.examples),
            "epsilon": consortium.epsilon,
            "classes": consortium.classes,
        }
        words = {
            "records": "records in all",
            "median_party": "records in the median party",
            "parties": "parties",
            "epsilon": "ε",
            "classes": "classes",
        }
        out = []
        for key, value in values.items():
            low, high = self.ranges[key]
            if value < low:
                out.append(f"{value:g} {words[key]} is below the smallest measured ({low:g})")
            elif value > high:
                out.append(f"{value:g} {words[key]} is above the largest measured ({high:g})")
        return out

    def predict(self, consortium: Consortium) -> tuple[dict[str, Forecast], list[str]]:
        """Every quantity's forecast for ``consortium`` and, if it lies outside the measured ranges, why
        (the intervals are then :data:`EXTRAPOLATION_WIDENING` times wider)."""
        reasons = self.outside(consortium)
        widen = EXTRAPOLATION_WIDENING if reasons else 1.0
        found = _forecast(self.models, _design([consortium.descriptors()]))
        out = {}
        for target in TARGETS:
            estimate = float(found[target][0])
            half = widen * self.half_width[target]
            low, high = estimate - half, estimate + half
            if not target.startswith("gain"):
                low, high = max(0.0, low), min(1.0, high)
            out[target] = Forecast(estimate, low, high)
        return out, reasons


def leave_one_out(
    points: Sequence[Measured], *, penalty: float = RIDGE
) -> dict[str, npt.NDArray[np.float64]]:
    """Each point's error for every :data:`TARGETS` when its whole layout (every ε) is left out of the fit:
    prediction − measured."""
    x = _design([p.consortium.descriptors() for p in points])
    measured = {target: np.asarray([p.values[target] for p in points]) for target in TARGETS}
    out = {target: np.empty(len(points)) for target in TARGETS}
    for layout in sorted({p.layout for p in points}):
        held = np.asarray([p.layout == layout for p in points])
        found = _forecast(_fit([p for p, h in zip(points, held, strict=True) if not h], penalty), x[held])
        for target in TARGETS:
            out[target][held] = found[target] - measured[target][held]
    return out


def leave_one_dataset_out(
    points: Sequence[Measured], *, train: str, penalty: float = RIDGE
) -> dict[str, npt.NDArray[np.float64]]:
    """Errors for every :data:`TARGETS` on every other dataset's points of a fit on dataset ``train``'s
    points alone: how far the model carries to data it never saw."""
    mine = [p for p in points if p.dataset == train]
    other = [p for p in points if p.dataset != train]
    if len(mine) < 3 or not other:
        raise InputError(f"need at least 3 points of {train} and one of another dataset")
    found = _forecast(_fit(mine, penalty), _design([p.consortium.descriptors() for p in other]))
    return {target: found[target] - np.asarray([p.values[target] for p in other]) for target in TARGETS}
