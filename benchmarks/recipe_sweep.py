"""How the DIET-PATE defaults were chosen: a sweep on a VALIDATION split of the training data (never test).

The choice is itself a release of that (protected) training data which no reported ε accounts for (Papernot
& Steinke 2022, "Hyperparameter Tuning with Renyi Differential Privacy"): the published figures of a run hold
for fixed settings, not for the tuning that picked them (docs/dietpate.md §6).

Teachers are trained on Fashion-MNIST's training images minus a validation split held out as ``capc dietpate
run`` holds it out (``dataset.validation``, seed 0); every figure is the student's accuracy on that validation
split. Shards are assigned by content hash and featurised alone (current statistics, chunks of ``bn_batch``),
teachers are the library's heads (:mod:`capc_common.learn._optim`'s Adam, several heads stacked with
per-head weights — the same arithmetic as :func:`capc_common.learn.train_heads`, batched for speed), the
queries are the default stream (dead leaves, seed 1), and each answered/unanswered outcome is simulated
with Confident-GNMax noise (z1 = z1_g + z1_s, each N(0, σ1²); z2 ~ N(0, σ2²), rounded) and charged to the
same rigorous Rényi filter the pipeline uses (:func:`capc_common.dietpate.make_budget`). Simulation noise
comes from numpy (this is research code: nothing here is released).

Stages (``--stages``, in order):

* ``recipes``: teacher recipes (Adam steps / lr / weight decay / label smoothing) at 250 teachers; the
  student on the noiseless plurality of 6,000 queries, and consensus on the queries.
* ``mechanism``: Confident-GNMax grid (T, σ1, σ2 as fractions of the teacher count) × ε ∈ {3, 6} × two
  noise seeds, for 550 teachers (bn_batch 64 and 32), 1,000 teachers (bn_batch 32) and 250 teachers; then
  the accuracy-vs-ε curve of the best point with three further seeds.
* ``baseline``: PATE without public data (MLPs on per-chunk standardised pixels) through the same grid.
* ``balance``: does the student gain from correcting the answered labels' class skew (the teachers'
  confident answers on dead leaves are far from uniform)? 550 teachers, the default mechanism (0.6, 0.7,
  0.16)·k, ε ∈ {3, 6}, three noise seeds: the plain student, the same student with its bias shifted by
  −log(answered class frequency) (logit adjustment to a uniform prior), and students trained with
  per-example weights 1/count and 1/√count of their label.

It was run on a lent NVIDIA H200 (two calls of about two minutes each); on 2 CPU cores it takes hours.

    python benchmarks/recipe_sweep.py --device cuda --out benchmarks/results/recipe_sweep
    python benchmarks/recipe_sweep.py --format json      # one JSON object: the best point per setting
    python benchmarks/recipe_sweep.py --smoke --stages recipes,mechanism,baseline,balance --format json

Outputs: ``sweep.jsonl`` (one line per measurement) under ``--out``. ``--smoke`` runs every stage's code at
toy size (:data:`SMOKE`: a few teachers on 1,200 training images, one grid point, a large ε):
the suite's check that the script still works, not a measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from capc_common.data import load_dataset, partition
from capc_common.dietpate import make_budget
from capc_common.dietpate.config import BudgetSection, MechanismSection
from capc_common.learn import PixelFeaturizer, _optim
from capc_common.models import default_backbone, extract_features, load_backbone
from capc_common.synth import generate

CLASSES = 10
STUDENT = {"steps": 200, "lr": 1e-2, "l2": 1e-4}
TEACHER = {"steps": 50, "lr": 1e-3}


@dataclass(frozen=True)
class Plan:
    """The sizes of a sweep: teacher counts, grids, budgets and seeds of every stage.

    Attributes:
        train_limit: training images used (None: all of them but the validation split).
        recipe_teachers: teachers of the ``recipes`` stage; ``recipe_grid`` its teacher recipes.
        recipe_queries: queries the noiseless student of the ``recipes`` stage learns from.
        mechanism_counts: ``(teachers, bn_batch)`` of the ``mechanism`` stage.
        grid: ``(T, σ1, σ2)`` as fractions of the teacher count.
        grid_epsilons / grid_seeds: the grid's budgets and noise seeds.
        curve_epsilons / curve_seeds: the chosen point's accuracy-vs-ε curve.
        other_teachers: teachers of the ``baseline`` and ``balance`` stages.
        balance_seeds: noise seeds of the ``balance`` stage (at each of ``grid_epsilons``).
    """

    train_limit: int | None
    recipe_teachers: int
    recipe_grid: list[dict[str, float]]
    recipe_queries: int
    mechanism_counts: list[tuple[int, int]]
    grid: list[tuple[float, float, float]]
    grid_epsilons: list[float]
    grid_seeds: tuple[int, ...]
    curve_epsilons: list[float]
    curve_seeds: tuple[int, ...]
    other_teachers: int
    balance_seeds: tuple[int, ...]


#: The sweep that chose the defaults (docs/dietpate.md).
FULL = Plan(
    train_limit=None,
    recipe_teachers=250,
    recipe_grid=[
        dict(steps=n, lr=lr, l2=l2, ls=ls)
        for n, lr in [(25, 1e-3), (50, 1e-3), (100, 1e-3), (200, 1e-3), (25, 1e-2), (50, 1e-2), (150, 1e-2)]
        for l2 in (0.0, 1e-2)
        for ls in (0.0, 0.2)
    ],
    recipe_queries=6000,
    mechanism_counts=[(550, 64), (1000, 32), (550, 32), (250, 64)],
    grid=list(itertools.product([0.45, 0.6, 0.75], [0.5, 0.7, 0.9], [0.12, 0.16, 0.2])),
    grid_epsilons=[3, 6],
    grid_seeds=(0, 1),
    curve_epsilons=[1, 2, 3, 4, 6, 10],
    curve_seeds=(2, 3, 4),
    other_teachers=550,
    balance_seeds=(0, 1, 2),
)
#: ``--smoke``: every stage's code at toy size, in seconds on a CPU.
SMOKE = Plan(
    train_limit=1200,
    recipe_teachers=4,
    recipe_grid=[dict(steps=5, lr=1e-2, l2=0.0, ls=0.0)],
    recipe_queries=256,
    mechanism_counts=[(8, 32)],
    grid=[(0.6, 0.7, 0.16)],
    grid_epsilons=[200],
    grid_seeds=(0,),
    curve_epsilons=[100, 200],
    curve_seeds=(1,),
    other_teachers=8,
    balance_seeds=(0,),
)


class Sweep:
    """Shared data, features and helpers of one sweep."""

    def __init__(self, args: argparse.Namespace, plan: Plan) -> None:
        self.args = args
        self.plan = plan
        self.start = time.monotonic()
        self.dev = torch.device(args.device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        args.out.mkdir(parents=True, exist_ok=True)
        self.log = (args.out / "sweep.jsonl").open("a", encoding="utf-8")
        data = load_dataset("fashion-mnist", split="train")
        order = np.random.default_rng([0, 0x5EED]).permutation(len(data.labels))  # as dietpate's split
        val, train = np.sort(order[: args.validation]), np.sort(order[args.validation :])[: plan.train_limit]
        self.train_images, self.train_labels = data.images[train], data.labels[train].astype(np.int64)
        self.val_images = data.images[val]
        self.val_labels = torch.from_numpy(data.labels[val].astype(np.int64)).to(self.dev)
        self.backbone = load_backbone(default_backbone(28, 28, 1)).to(self.dev)
        self.queries = generate(
            "dead_leaves", seed=1, start=0, count=args.queries, height=28, width=28, channels=1
        )
        self.val = self.features(self.val_images, 64)
        self.query_features: dict[int, torch.Tensor] = {}

    def emit(self, **row: Any) -> dict[str, Any]:
        row["t"] = round(time.monotonic() - self.start, 1)
        line = json.dumps(row)
        self.log.write(line + "\n")
        self.log.flush()
        if self.args.format == "text":
            print(line, flush=True)
        return row

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def features(self, images: np.ndarray, bn: int) -> torch.Tensor:
        return torch.from_numpy(extract_features(self.backbone, images, bn_batch=bn, mode="current")).to(
            self.dev
        )

    def query(self, bn: int) -> torch.Tensor:
        if bn not in self.query_features:
            self.query_features[bn] = self.features(self.queries, bn)
        return self.query_features[bn]

    def stack(self, count: int, featurise: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Every teacher's shard features ``(count, m, d)``, labels and per-row weights (zero on padding)."""
        shards = partition(self.train_labels, shards=count, scheme="hash", seed=1, images=self.train_images)
        m = max(len(s) for s in shards)
        rows = [featurise(self.train_images[s]) for s in shards]
        x = torch.zeros(count, m, rows[0].shape[1], device=self.dev)
        y = torch.zeros(count, m, dtype=torch.int64, device=self.dev)
        w = torch.zeros(count, m, device=self.dev)
        for t, (s, f) in enumerate(zip(shards, rows, strict=True)):
            x[t, : len(s)], w[t, : len(s)] = f, 1.0 / len(s)
            y[t, : len(s)] = torch.from_numpy(self.train_labels[s])
        return x, y, w, min(len(s) for s in shards)

    def fit(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        w: torch.Tensor,
        *,
        kind: str = "linear",
        hidden: int = 256,
        steps: int,
        lr: float,
        l2: float = 0.0,
        ls: float = 0.0,
    ) -> tuple[str, dict[str, torch.Tensor]]:
        heads, _, dim = x.shape
        if kind == "linear":
            params = {
                "w_out": torch.zeros(heads, CLASSES, dim, device=self.dev),
                "b_out": torch.zeros(heads, CLASSES, device=self.dev),
            }
        else:
            gen = torch.Generator().manual_seed(0)
            w_in = torch.randn(1, hidden, dim, generator=gen) * math.sqrt(2 / dim)
            w_out = torch.randn(1, CLASSES, hidden, generator=gen) * math.sqrt(1 / hidden)
            params = {
                "w_in": w_in.expand(heads, -1, -1).clone().to(self.dev),
                "b_in": torch.zeros(heads, hidden, device=self.dev),
                "w_out": w_out.expand(heads, -1, -1).clone().to(self.dev),
                "b_out": torch.zeros(heads, CLASSES, device=self.dev),
            }
        target = _optim.targets(y, CLASSES, smoothing=ls, dtype=x.dtype)
        _optim.adam(kind, params, x, target, w, l2=l2, steps=steps, lr=lr)
        return kind, params

    def predict(self, model: tuple[str, dict[str, torch.Tensor]], f: torch.Tensor) -> torch.Tensor:
        kind, params = model
        out = []
        for s in range(0, f.shape[0], 8192):
            x = f[s : s + 8192].unsqueeze(0).expand(params["w_out"].shape[0], -1, -1)
            out.append(_optim.forward(kind, params, x).argmax(2))
        return torch.cat(out, 1)

    def votes(self, pred: torch.Tensor) -> torch.Tensor:
        v = torch.zeros(pred.shape[1], CLASSES, dtype=torch.int64, device=self.dev)
        return v.scatter_add_(1, pred.T, torch.ones_like(pred.T))

    def student(self, f: torch.Tensor, y: torch.Tensor, **recipe: Any) -> tuple[str, dict[str, torch.Tensor]]:
        """The student on ``(f, y)`` with ``recipe`` (default :data:`STUDENT`)."""
        n = f.shape[0]
        weights = torch.full((1, n), 1.0 / n, device=self.dev)
        return self.fit(f.unsqueeze(0), y.view(1, n), weights, **(recipe or STUDENT))

    def accuracy(self, model: tuple[str, dict[str, torch.Tensor]], val: torch.Tensor | None = None) -> float:
        return float(
            (self.predict(model, self.val if val is None else val)[0] == self.val_labels).float().mean()
        )

    def release(
        self, hist: torch.Tensor, count: int, *, mech: tuple[float, float, float], eps: float, seed: int
    ) -> tuple[np.ndarray, int, float] | None:
        """Simulated Confident-GNMax labels of the stream until the rigorous budget stops it."""
        t, s1, s2 = (r * count for r in mech)
        mechanism = MechanismSection(name="confident-gnmax", threshold=t, sigma1=s1, sigma2=s2)
        try:
            budget = make_budget(
                mechanism,
                BudgetSection(epsilon=eps, delta=1e-5, expected_answer_rate=0.5),
                teachers=count,
                classes=CLASSES,
                smallest_batch=64,
            )
        except Exception:  # the budget cannot pay for one batch
            return None
        rng = np.random.default_rng(seed)
        h = hist.cpu().numpy()
        labels = np.full(len(h), -1)
        first = 0
        while first < len(h):
            c = min(256, len(h) - first)
            while not budget.fits(c) and c > 64:
                c = max(64, (c // 2) // 64 * 64)
            if not budget.fits(c):
                break
            batch = h[first : first + c]
            z1 = np.rint(rng.normal(0, s1, c)) + np.rint(rng.normal(0, s1, c))
            passed = batch.max(1) + z1 >= t
            labels[first : first + c] = np.where(
                passed, (batch + np.rint(rng.normal(0, s2, batch.shape))).argmax(1), -1
            )
            budget.filter.charge(budget.actual(c, int(passed.sum())), what="sweep")
            first += c
        return labels[:first], first, budget.epsilon

    def dp(
        self,
        tag: str,
        hist: torch.Tensor,
        f: torch.Tensor,
        count: int,
        *,
        grid: list[tuple[float, float, float]],
        epsilons: list[float],
        seeds: tuple[int, ...],
        student: dict[str, Any] | None = None,
        val: torch.Tensor | None = None,
        **extra: Any,
    ) -> list[dict[str, Any]]:
        rows = []
        for mech, eps in itertools.product(grid, epsilons):
            accs, answered, agree = [], [], []
            for seed in seeds:
                if self.left() < 30:
                    return rows
                out = self.release(hist, count, mech=mech, eps=eps, seed=seed)
                if out is None or (labels := out[0])[labels >= 0].size < 10:
                    break
                idx = torch.from_numpy(np.flatnonzero(labels >= 0)).to(self.dev)
                lab = torch.from_numpy(labels[labels >= 0]).to(self.dev)
                agree.append(float((lab == hist.argmax(1)[idx]).float().mean()))
                accs.append(self.accuracy(self.student(f[idx], lab, **(student or STUDENT)), val))
                answered.append(len(idx))
            if accs:
                rows.append(
                    self.emit(
                        stage="dp",
                        tag=tag,
                        teachers=count,
                        T=mech[0],
                        s1=mech[1],
                        s2=mech[2],
                        eps=eps,
                        answered=float(np.mean(answered)),
                        agreement=float(np.mean(agree)),
                        student=float(np.mean(accs)),
                        student_sd=float(np.std(accs)),
                        n=len(accs),
                        **extra,
                    )
                )
        return rows


def recipes(s: Sweep) -> None:
    count = s.plan.recipe_teachers
    x, y, w, _ = s.stack(count, lambda im: s.features(im, 64))
    f = s.query(64)[: s.plan.recipe_queries]
    for g in s.plan.recipe_grid:
        model = s.fit(x, y, w, **g)
        pv = s.predict(model, s.val)
        hist = s.votes(s.predict(model, f))
        s.emit(
            stage="teachers",
            teachers=count,
            **g,
            mean_teacher=float((pv == s.val_labels).float().mean()),
            ensemble=float((s.votes(pv).argmax(1) == s.val_labels).float().mean()),
            student_noiseless=s.accuracy(s.student(f, hist.argmax(1))),
            consensus_mean=float((hist.max(1).values.float() / count).mean()),
        )


def mechanism(s: Sweep) -> list[dict[str, Any]]:
    best = []
    plan = s.plan
    for count, bn in plan.mechanism_counts:
        if s.left() < 60:
            break
        x, y, w, smallest = s.stack(count, lambda im, bn=bn: s.features(im, bn))
        model = s.fit(x, y, w, **TEACHER)
        del x, y, w
        f = s.query(bn)
        hist = s.votes(s.predict(model, f))
        pv = s.predict(model, s.val)
        s.emit(
            stage="teachers",
            teachers=count,
            bn=bn,
            smallest=smallest,
            **TEACHER,
            mean_teacher=float((pv == s.val_labels).float().mean()),
            ensemble=float((s.votes(pv).argmax(1) == s.val_labels).float().mean()),
        )
        rows = s.dp(
            "main", hist, f, count, grid=plan.grid, epsilons=plan.grid_epsilons, seeds=plan.grid_seeds, bn=bn
        )
        for eps in plan.grid_epsilons:
            top = max((r for r in rows if r["eps"] == eps), key=lambda r: r["student"], default=None)
            if top is None:
                continue
            mech = (top["T"], top["s1"], top["s2"])
            curve = s.dp(
                "curve",
                hist,
                f,
                count,
                grid=[mech],
                epsilons=plan.curve_epsilons,
                seeds=plan.curve_seeds,
                bn=bn,
                chosen_at=eps,
            )
            best.append(
                {
                    "teachers": count,
                    "bn_batch": bn,
                    "chosen_at": eps,
                    "T": mech[0],
                    "sigma1": mech[1],
                    "sigma2": mech[2],
                    "curve": {r["eps"]: r["student"] for r in curve},
                }
            )
    return best


def baseline(s: Sweep) -> None:
    pixels = PixelFeaturizer((28, 28, 1))

    def featurise(images: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(pixels.extract(images, bn_batch=64, mode="current")).to(s.dev)

    count = s.plan.other_teachers
    x, y, w, _ = s.stack(count, featurise)
    teachers = {"kind": "mlp", "hidden": 256, "steps": 500, "lr": 1e-3, "l2": 1e-3}
    model = s.fit(x, y, w, **teachers)
    f = featurise(s.queries)
    hist = s.votes(s.predict(model, f))
    s.dp(
        "baseline",
        hist,
        f,
        count,
        grid=s.plan.grid[::2],
        epsilons=s.plan.grid_epsilons,
        seeds=(0,),
        val=featurise(s.val_images),
        student={"kind": "mlp", "hidden": 128, "steps": 200, "lr": 1e-3, "l2": 1e-4},
    )


def balance(s: Sweep) -> None:
    teachers = s.plan.other_teachers
    x, y, w, _ = s.stack(teachers, lambda im: s.features(im, 64))
    model = s.fit(x, y, w, **TEACHER)
    del x, y, w
    f = s.query(64)
    hist = s.votes(s.predict(model, f))
    for eps, seed in itertools.product(s.plan.grid_epsilons, s.plan.balance_seeds):
        out = s.release(hist, teachers, mech=(0.6, 0.7, 0.16), eps=eps, seed=seed)
        if out is None:
            continue
        labels = out[0]
        idx = torch.from_numpy(np.flatnonzero(labels >= 0)).to(s.dev)
        lab = torch.from_numpy(labels[labels >= 0]).to(s.dev)
        count = torch.bincount(lab, minlength=CLASSES).float()
        row: dict[str, Any] = {"answered": len(idx), "class_counts": count.int().tolist()}
        for name, per_class in (
            ("plain", torch.ones_like(count)),
            ("inverse", 1 / count),
            ("sqrt", count**-0.5),
        ):
            weights = per_class.clamp(max=1.0)[lab]  # an absent class weighs nothing: it has no rows
            model_w = s.fit(
                f[idx].unsqueeze(0), lab.view(1, -1), (weights / weights.sum()).view(1, -1), **STUDENT
            )
            row[name] = s.accuracy(model_w)
            if name == "plain":
                kind, params = model_w
                adjusted = {
                    **params,
                    "b_out": params["b_out"] - torch.log((count + 1) / (count.sum() + CLASSES)),
                }
                row["logit_adjusted"] = s.accuracy((kind, adjusted))
        s.emit(stage="balance", teachers=teachers, eps=eps, seed=seed, **row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--stages", default="recipes,mechanism,baseline")
    parser.add_argument("--validation", type=int, default=5000, help="training images held out for scoring")
    parser.add_argument("--queries", type=int, default=40000, help="dead-leaves queries in the stream")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="stop starting new measurements after")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/recipe_sweep"))
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--smoke", action="store_true", help="every stage at toy size (the suite's check)")
    args = parser.parse_args(argv)
    sweep = Sweep(args, SMOKE if args.smoke else FULL)
    summary: dict[str, Any] = {"device": str(sweep.dev), "validation": args.validation, "smoke": args.smoke}
    stages = args.stages.split(",")
    if "recipes" in stages:
        recipes(sweep)
    if "mechanism" in stages:
        summary["best"] = mechanism(sweep)
    if "baseline" in stages:
        baseline(sweep)
    if "balance" in stages:
        balance(sweep)
    summary["log"] = str(args.out / "sweep.jsonl")
    summary["seconds"] = round(time.monotonic() - sweep.start, 1)
    print(json.dumps(summary) if args.format == "json" else json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
