"""Tune the two reference baselines — central DP-SGD (``central-dpsgd``) and DP-FedAvg (``dp-fedavg``) — on a
validation split, as the federation's recipe was tuned, so that the joining benchmark compares the federation
with baselines of equal standing (docs/mechanisms.md, "Tuning the reference baselines").

The setting is a joining benchmark layout (``--layout``, default ``4x1000``) under ``--evaluate-on
validation``: the last 10,000 Fashion-MNIST training images are the evaluation set, the layout's share of the
first 50,000 is split into its parties by keyed hash and each party keeps its holdout at home, so every
candidate trains on that layout's parties as ``benchmarks/joining.py`` builds them under validation (its share
of the first 50,000 images), and no candidate is scored on the test images. ``4x1000`` is the default because
it is where joining is in question (the README's first row) and because a candidate there runs in seconds: at
``10x6000-iid`` one candidate takes about three minutes on two cores, so a search of the federation's size
(about 100 settings) would take five hours. Each candidate is a full run of the method at the budget (its
noise calibrated to ε by its own accountant), its ``HYPER`` group overridden by the candidate's settings.

**The search** is a staged coordinate search (:data:`FEDAVG_STAGES`, :data:`CENTRAL_STAGES`): every stage
proposes settings around the best so far (each stage's candidates are functions of it), the best by validation
accuracy carries on, and the stages are gone through ``--passes`` times (a second pass starts from the first's
best; a setting already tried is not run again), so each baseline gets about as many settings as the
federation's recipe was chosen from (about 100). At the first ``--epsilons`` value every stage runs; at the
others only the stages marked ``again``, starting from the first ε's choice. Then the ``--finalists`` best
settings of each ε are drawn ``--draws`` more times (fresh CSPRNG noise each; the partition is seed 0's) and
the best mean wins. DP-FedAvg's candidates run in this process (:func:`_flower_app.simulate`: the same client
code and FedAvgM update as the Flower processes); ``--flower`` reruns the ``before`` setting and each ε's
choice on real Flower processes (its virtual environment under that directory). Central DP-SGD's candidates
are the benchmark's own runner.

Choosing settings this way reads the protected training images (the validation split): a release no
reported ε accounts for (Papernot & Steinke 2022); the same holds for the federation's recipe.

    nice -n 5 python benchmarks/tune_baselines.py --cache-dir /work/cache/features --format json
    python benchmarks/tune_baselines.py --smoke --format json       # digits' pixels, seconds: the test

Resumable: each finished candidate is appended to ``tune_baselines.csv`` under ``--out`` (with the code hash
that ran it) and not run again by the same code.

JSON keys: ``setting`` (``layout``, ``evaluate_on``, ``records``, ``evaluation``, ``parties``, ``delta``);
``code``; ``rows[]`` (``method``, ``epsilon``, ``stage``, ``draw``, ``runner``, ``settings``, ``accuracy``,
``epsilon_spent``, ``seconds``); ``methods[]`` (``method``, ``group``, ``epsilon``, ``before``,
``chosen``, ``candidates``, ``stages``, ``flower``); ``seconds``; ``outputs``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import joining
from methods.common import DELTA, HYPER, log
from methods.dpsgd import central_dpsgd, public_basis_for
from methods.fedavg import dp_fedavg_flower
from methods.provenance import code_hash

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = "4x1000"
SMOKE_LAYOUT = "3x480-iid"

Settings = dict[str, Any]
#: A stage: its name, whether it runs again at every further ε, and its candidates around the best so far.
Stage = tuple[str, bool, Callable[[Settings], list[Settings]]]


def _scaled(best: Settings, key: str, factors: tuple[float, ...]) -> list[Settings]:
    """``best[key]`` times each factor (of its type: rounds stay whole)."""
    return [{key: type(best[key])(best[key] * f)} for f in factors]


def _step(best: Settings, factors: tuple[float, ...]) -> list[Settings]:
    """The step scaled by each factor: ``step_noise`` when the step follows the noise (its cap with it),
    else the fixed ``learning_rate``."""
    if best.get("step_noise"):
        return [
            {"step_noise": best["step_noise"] * f, "learning_rate": best["learning_rate"] * f}
            for f in factors
        ]
    return _scaled(best, "learning_rate", factors)


def _momentum(best: Settings, key: str, values: tuple[float, ...]) -> list[Settings]:
    """Other heavy-ball momenta, each with the step scaled by ``(1 − β′)/(1 − β)``: the same long-run step
    (a change of momentum alone would mostly test a change of step)."""
    out = []
    for m in values:
        ratio = (1 - m) / (1 - best[key])
        out += [{key: m, **change} for change in _step(best, (ratio,))]
    return out


def _clip(best: Settings, factors: tuple[float, ...]) -> list[Settings]:
    """The clip scaled, the step's cap inversely (``lr × C`` is what moves the head)."""
    return [{"clip": best["clip"] * f, "learning_rate": best["learning_rate"] / f} for f in factors]


#: DP-FedAvg's (Poisson rate, rounds, local steps per round): full batch like the federation, and the
#: subsampled regimes a trusted curator's continuous-noise analysis rewards.
FEDAVG_SAMPLING = ((1.0, 100, 1), (1.0, 50, 2), (0.3, 100, 1), (0.1, 100, 2), (0.1, 200, 1), (0.1, 50, 5),
                   (0.03, 200, 2))  # fmt: skip


def _fedavg_sampling(best: Settings) -> list[Settings]:
    """Each (q, rounds, local steps); under a fixed step, each also with the step scaled so that the
    steps taken in all (rounds × local steps) times the step stay as they were."""
    out = []
    for q, rounds, steps in FEDAVG_SAMPLING:
        change = {"sampling_rate": q, "rounds": rounds, "local_steps": steps}
        out.append(change)
        if not best.get("step_noise"):
            ratio = best["rounds"] * best["local_steps"] / (rounds * steps)
            out.append({**change, "learning_rate": best["learning_rate"] * ratio})
    return out


#: DP-FedAvg: the recipe pieces first (the public basis; the DP statistics, for records of norm about 1 or
#: coordinates of unit variance with every gradient clipped; a fixed step or the step that follows the
#: noise), then the step, the clip, the sampling and length (each setting's noise recalibrated to ε), the
#: step again, the server's momentum, the length, the variance floor.
FEDAVG_STAGES: list[Stage] = [
    (
        "recipe pieces",
        False,
        lambda b: [
            {"projection": 1024},
            {"projection": 1024, "statistics": True},
            *(
                {
                    "projection": 1024,
                    "statistics": True,
                    "unit_variance": True,
                    "clip": 0.1,
                    "learning_rate": lr,
                }
                for lr in (30.0, 100.0, 300.0)
            ),
            {
                "projection": 1024,
                "statistics": True,
                "unit_variance": True,
                "clip": 0.1,
                "learning_rate": 250.0,
                "step_noise": 0.004,
            },
        ],
    ),
    ("step", True, lambda b: _step(b, (0.3, 0.5, 2.0, 3.0))),
    ("clip", False, lambda b: _clip(b, (0.3, 3.0))),
    ("sampling and length", True, _fedavg_sampling),
    ("step again", True, lambda b: _step(b, (0.5, 0.7, 1.4, 2.0))),
    ("server momentum", False, lambda b: _momentum(b, "server_momentum", (0.0, 0.5, 0.95))),
    ("length", True, lambda b: _scaled(b, "rounds", (0.5, 1.5, 2.0))),
    ("variance floor", False, lambda b: [{"variance_floor": f} for f in (0.3, 3.0)]),
]

#: Central DP-SGD's (share of the records in a Poisson batch, epochs): full batch like the federation, and
#: the subsampled regimes a trusted curator's continuous-noise analysis rewards (Mironov et al.).
CENTRAL_SAMPLING = ((1.0, 200), (1.0, 50), (0.5, 40), (0.25, 20), (0.25, 40), (0.1, 20), (0.1, 40),
                    (0.05, 10), (0.05, 20))  # fmt: skip


#: Central DP-SGD: the federation's recipe is its start (``before``: full batch, the step that follows the
#: noise); then the sampling and length (the step follows each batch's noise), the step, the clip, the
#: momentum, the length, the variance floor, the step again.
CENTRAL_STAGES: list[Stage] = [
    ("sampling and length", True, lambda b: [{"sampling_rate": q, "epochs": e} for q, e in CENTRAL_SAMPLING]),
    ("step", True, lambda b: _step(b, (0.5, 0.75, 1.5, 2.0))),
    ("clip", False, lambda b: _clip(b, (0.3, 3.0))),
    ("momentum", False, lambda b: _momentum(b, "momentum", (0.0, 0.8, 0.95))),
    ("length", True, lambda b: _scaled(b, "epochs", (0.5, 1.5, 2.0))),
    ("variance floor", False, lambda b: [{"variance_floor": f} for f in (0.3, 3.0)]),
    ("step again", True, lambda b: _step(b, (0.7, 1.4))),
]

#: method → (its HYPER group, its stages).
METHODS = {"dp-fedavg": ("fedavg", FEDAVG_STAGES), "central-dpsgd": ("dpsgd", CENTRAL_STAGES)}
#: ``--smoke``: two stages of each, short runs (the suite's check that the script works).
SMOKE_STAGES = {"dp-fedavg": ["recipe pieces"], "central-dpsgd": ["step"]}
SMOKE_HYPER = {"fedavg": {"rounds": 4, "sampling_rate": 1.0}, "dpsgd": {"epochs": 4, "sampling_rate": 1.0}}
FIELDS = (
    "method",
    "epsilon",
    "stage",
    "draw",
    "runner",
    "settings",
    "accuracy",
    "epsilon_spent",
    "seconds",
    "code",
)


def key_of(settings: Settings) -> str:
    """A candidate's settings as the CSV holds them (sorted JSON: one spelling per setting)."""
    return json.dumps({k: settings[k] for k in sorted(settings)})


class Sweep:
    """The candidates run so far (the CSV's rows of this code, reused on a resumed run) and the runs of new
    ones, each appended to the CSV as it finishes."""

    def __init__(self, args: argparse.Namespace, cell: joining.Cell, basis: np.ndarray | None) -> None:
        self.args, self.cell, self.basis = args, cell, basis
        self.csv = args.out / f"{args.name}.csv"
        self.code = code_hash()
        self.rows = [r for r in _read(self.csv) if r["code"] == self.code]
        for r in self.rows:
            r["draw"] = int(r["draw"])
            for key in ("epsilon", "accuracy", "epsilon_spent", "seconds"):
                r[key] = float(r[key])

    def run(self, method: str, epsilon: float, stage: str, settings: Settings, *, draw: int = 0,
            flower: bool = False) -> float:  # fmt: skip
        """The validation accuracy of ``method`` at ``settings`` (from the CSV when this code ran it)."""
        runner, key = runner_of(method, flower), key_of(settings)
        for r in self.rows:
            if (r["method"], r["epsilon"], r["settings"], r["draw"], r["runner"]) == (
                method, epsilon, key, draw, runner,
            ):  # fmt: skip
                return float(r["accuracy"])
        group = METHODS[method][0]
        saved = dict(HYPER[group])
        HYPER[group].update(settings)
        t0 = time.perf_counter()
        c = self.cell
        try:
            if method == "dp-fedavg":
                python = flower_python(self.args.flower) if flower else None
                out = dp_fedavg_flower(
                    c.federation, c.ex, c.ey, epsilon=epsilon, seed=c.seed, basis=self.basis, python=python
                )
            else:
                out = central_dpsgd(c.federation, c.ex, c.ey, epsilon=epsilon, seed=c.seed, basis=self.basis)
        finally:
            HYPER[group].clear()
            HYPER[group].update(saved)
        seconds = round(time.perf_counter() - t0, 1)
        row = {"method": method, "epsilon": epsilon, "stage": stage, "draw": draw, "runner": runner,
               "settings": key, "accuracy": out["accuracy"], "epsilon_spent": out["epsilon"],
               "seconds": seconds, "code": self.code}  # fmt: skip
        log(f"{method} ε {epsilon:g} {stage} #{draw} {runner}: {out['accuracy']:.4f} {key} ({seconds} s; "
            f"{out['noise']})")  # fmt: skip
        self.rows.append(row)
        new = not self.csv.exists()
        with self.csv.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            if new:
                writer.writeheader()
            writer.writerow(row)
        return float(out["accuracy"])

    def draws(self, method: str, epsilon: float, settings: Settings, runner: str) -> list[float]:
        """Every accuracy of ``settings`` at ``epsilon`` by ``runner`` so far."""
        key = key_of(settings)
        return [
            r["accuracy"]
            for r in self.rows
            if (r["method"], r["epsilon"], r["settings"], r["runner"]) == (method, epsilon, key, runner)
        ]

    def summary(self, method: str, epsilon: float, settings: Settings, runner: str) -> dict[str, Any]:
        """``settings`` and the mean and spread of their draws."""
        draws = self.draws(method, epsilon, settings, runner)
        return {
            "settings": settings,
            "accuracy_mean": float(np.mean(draws)),
            "accuracy_std": float(np.std(draws)),
            "draws": len(draws),
        }


def runner_of(method: str, flower: bool = False) -> str:
    """What ran a candidate: real Flower processes, the in-process Flower simulation, or the engine's
    trainer (central DP-SGD)."""
    return "flower" if flower else ("in-process" if method == "dp-fedavg" else "engine")


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def flower_python(cache: Path) -> Path:
    """Flower's interpreter (its virtual environment under ``cache``, built on first use)."""
    from _baselines import flower_python as build

    return build(cache)


class Search:
    """One method's search at one ε: the candidates tried and their first draws' accuracy."""

    def __init__(self, sweep: Sweep, method: str, epsilon: float) -> None:
        self.sweep, self.method, self.epsilon = sweep, method, epsilon
        self.tried: dict[str, Settings] = {}
        self.scores: dict[str, float] = {}
        self.stages: list[str] = []

    def stage(self, name: str, candidates: list[Settings]) -> Settings:
        """Run the candidates not tried yet; the best so far."""
        self.stages.append(name)
        for candidate in candidates:
            key = key_of(candidate)
            if key not in self.tried:
                self.tried[key] = candidate
                self.scores[key] = self.sweep.run(self.method, self.epsilon, name, candidate)
        return self.tried[max(self.scores, key=lambda k: self.scores[k])]

    def final(self, finalists: int, draws: int) -> Settings:
        """The ``finalists`` best drawn ``draws`` more times; the best mean over its draws."""
        runner = runner_of(self.method)
        best = sorted(self.scores, key=lambda k: -self.scores[k])[:finalists]
        for key in best:
            for draw in range(1, draws + 1):
                self.sweep.run(self.method, self.epsilon, "finalists", self.tried[key], draw=draw)
        means = {
            k: float(np.mean(self.sweep.draws(self.method, self.epsilon, self.tried[k], runner)))
            for k in best
        }
        return self.tried[max(means, key=lambda k: means[k])]


def tune(sweep: Sweep, method: str, epsilon: float, *, start: Settings, first: bool) -> dict[str, Any]:
    """``method``'s search at ``epsilon``: from ``HYPER``'s setting (``before``) and ``start`` (the first
    ε's choice), every stage at the first ε, the ``again`` stages at the others, then the finalists' draws;
    with ``--flower`` the before and chosen settings on real Flower processes."""
    args = sweep.args
    group, stages = METHODS[method]
    before = dict(HYPER[group])
    search = Search(sweep, method, epsilon)
    best = search.stage("before", [before, start])
    for turn in range(args.passes):
        for name, again, propose in stages:
            if (first or again) and (not args.smoke or name in SMOKE_STAGES[method]):
                label = name if not turn else f"{name} (pass {turn + 1})"
                best = search.stage(label, [{**best, **change} for change in propose(best)])
    chosen = search.final(args.finalists, args.draws)
    runner = runner_of(method)
    entry: dict[str, Any] = {
        "method": method,
        "group": group,
        "epsilon": epsilon,
        "candidates": len(search.tried),
        "runs": len(
            [r for r in sweep.rows if (r["method"], r["epsilon"], r["runner"]) == (method, epsilon, runner)]
        ),
        "stages": search.stages,
        "before": sweep.summary(method, epsilon, before, runner),
        "chosen": sweep.summary(method, epsilon, chosen, runner),
    }
    if args.flower and method == "dp-fedavg":
        for setting in (before, chosen):
            sweep.run(method, epsilon, "flower", setting, flower=True)
        entry["flower"] = {
            "before": sweep.draws(method, epsilon, before, "flower"),
            "chosen": sweep.draws(method, epsilon, chosen, "flower"),
        }
    return entry


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", choices=tuple(METHODS), default=list(METHODS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[3.0, 1.0])
    parser.add_argument(
        "--layout", default=LAYOUT, choices=tuple(joining.LAYOUTS), help="the joining layout tuned on"
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=2,
        help="times through the stages (each from the best so far; a setting already tried is not rerun)",
    )
    parser.add_argument("--finalists", type=int, default=3, help="settings of each ε drawn again")
    parser.add_argument("--draws", type=int, default=2, help="further noise draws of each finalist")
    parser.add_argument(
        "--flower",
        type=Path,
        help="rerun the before and chosen settings on real Flower processes (its venv's cache dir)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="digits' pixels, two stages each, short runs: seconds"
    )
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "runs" / "cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="tune_baselines", help="output file stem")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    if min(args.epsilons) <= 0:
        parser.error(f"every ε must be positive, got {min(args.epsilons)}")
    started = time.perf_counter()
    layout = SMOKE_LAYOUT if args.smoke else args.layout
    if args.smoke:
        for group, values in SMOKE_HYPER.items():
            HYPER[group].update(values)
        args.finalists, args.draws, args.passes = 1, 1, 1
    jargs = joining.parse(
        [
            *(["--smoke"] if args.smoke else []),
            "--evaluate-on",
            "validation",
            "--layouts",
            layout,
            "--cache-dir",
            str(args.cache_dir),
        ]
    )
    cell = joining.make_cell(jargs, layout, 0, [])
    dataset = jargs.all_layouts[layout].dataset
    basis = public_basis_for(argparse.Namespace(dataset=dataset, cache_dir=args.cache_dir), "dpsgd")["basis"]
    records = sum(len(p.labels) for p in cell.federation)
    log(f"{layout}: {len(cell.parties)} parties, {records} records, {len(cell.ey)} evaluation images")
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(args, cell, basis)
    starts = {m: dict(HYPER[METHODS[m][0]]) for m in args.methods}
    methods = []
    for i, epsilon in enumerate(args.epsilons):  # every method at the first ε, then the others
        for method in args.methods:
            methods.append(tune(sweep, method, epsilon, start=starts[method], first=not i))
            if not i:
                starts[method] = methods[-1]["chosen"]["settings"]
    result = {
        "setting": {
            "layout": layout,
            "evaluate_on": "validation",
            "records": records,
            "evaluation": len(cell.ey),
            "parties": len(cell.parties),
            "delta": DELTA,
        },
        "code": sweep.code,
        "rows": sweep.rows,
        "methods": methods,
        "seconds": round(time.perf_counter() - started, 1),
        "outputs": [str(sweep.csv)],
    }
    if args.format == "json":
        print(json.dumps(result, default=float))
    else:
        for m in methods:
            b, c = m["before"], m["chosen"]
            print(
                f"{m['method']} ε {m['epsilon']:g}: {m['candidates']} candidates ({m['runs']} runs); before "
                f"{b['accuracy_mean']:.4f}, chosen {c['accuracy_mean']:.4f} ± {c['accuracy_std']:.4f} "
                f"({c['draws']} draws) {key_of(c['settings'])}"
            )
    return result


if __name__ == "__main__":
    main()
