"""Worth joining? Each party alone against the federation, in the party layouts a consortium really has.

All layouts are cut from Fashion-MNIST's 60,000 training images; accuracy is on the 10,000 test images,
read once per reported figure:

* ``10x6000-iid`` — every training image, 10 parties, classes uniform;
* ``10x6000-skewed`` — every training image, 10 parties, Dirichlet(α = 0.5) class skew (party sizes vary
  too: 6,000 is the mean);
* ``50x400-skewed`` — 20,000 images, 50 parties, Dirichlet(α = 0.5);
* ``200x100`` — 20,000 images, 200 parties, classes uniform.

**One neighbouring relation.** Every split is a keyed hash of each record's own content
(:func:`capc_common.data.site_part` keeps a layout's 20,000 images, :func:`~capc_common.data.site_parts`
deals them to parties, the skew a public function of a record's label and hash: one Dirichlet draw per class
from the public seed), and a party's records are dealt to its teachers by keyed hash too, so every row's ε
is for adding or removing one record (``methods/data.py``). A party the split leaves empty does not join.

For each layout and seed: every party's **local-only** accuracy (its own non-private logistic head, the head
trainer of ``methods/heads.py``; min, mean, max over parties), the **pooled** non-private ceiling (the same
trainer on all the layout's records), and at each ε (δ = 1e-5, rigorous accounting) the mechanisms:

* ``secagg-dpsgd``, ``central-dpsgd``, ``dp-fedavg``, ``dppl``, ``private-knn`` — run by name through the
  registry of ``benchmarks/mechanisms.py`` (``methods/``: its ``HYPER`` and recipes, unchanged here);
  ``dp-fedavg`` starts one Flower client process per party, so layouts of more than
  :data:`FLOWER_MAX_CLIENTS` parties skip it (200 processes of ~70 MB each do not fit this machine);
* ``diet-capc`` — what the federation computes: the central DIET-PATE pipeline (``--config``, the shipped
  ``configs/fashion-mnist-diet-pate.yaml``) with each party's records dealt by keyed hash to the teachers
  the planner gives it (:func:`capc_common.federation.sizing.propose` for the parties' sizes at the largest
  ε: heads per party, Confident-GNMax T/σ1/σ2, query batch and total); a party too small for one teacher
  cannot be a teacher party and is left out (said in the row);
* ``pate-scratch`` — PATE without public data, the baseline of ``benchmarks/utility.py``: the same teachers
  and mechanism, but pixel MLPs (the config's ``baseline:``) instead of the shared backbone.

The two pipelines run once per (layout, seed) at the largest ε and give every smaller ε from its own
replayed Rényi filter (as ``utility.py``), so one run fills several rows and its time is on each.
``gain_over_best_party`` is a mechanism's mean accuracy minus the mean (over seeds) of the best party's
local-only accuracy: what the best-placed member gains by joining.

Resumable: each finished cell is appended to ``joining.csv`` and skipped on the next start; the setting
(layouts, split, hyper-parameters, the pipeline config) is recorded in ``joining.setting.json`` and a CSV of
another setting is refused, as ``mechanisms.py`` does. Features are cached once per image set in
``--cache-dir`` (per-example features of the training and test images; the pipelines' shard, query and vote
features). Every cell's time is printed; docs/results.md ("Worth joining") says how long the grid takes.

    python benchmarks/joining.py --format json                        # the grid (resumable)
    python benchmarks/joining.py --layouts 200x100 --methods local-only pooled secagg-dpsgd --epsilons 3
    python benchmarks/joining.py --smoke --epsilons 20 --format json  # digits, seconds: the suite's test

``--export`` also writes the federation mechanisms' table ``capc federation plan`` recommends from
(``src/capc_common/federation/joining_table.json``).

JSON keys: ``setting``; ``layouts[]``: ``name``, ``parties``, ``examples_per_party`` (nominal),
``records``, ``party_sizes.{min,mean,max}``, ``skew``, ``local_only.{min,mean,max}``, ``pooled``,
``mechanisms[].{name,epsilon,accuracy_mean,accuracy_std,gain_over_best_party,seeds,epsilon_spent,
seconds_mean}``; ``skipped[]``; ``rows``; ``ran``; ``seconds``; ``outputs``.
Outputs (``--out``, default benchmarks/results): ``joining.csv``, ``joining.md``, ``joining.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from mechanisms import BY_NAME, setting_differences
from methods.common import DELTA, HYPER, log
from methods.data import NEIGHBOURING, SPLIT, load_features
from methods.heads import per_party_accuracy

from capc_common.errors import InputError
from capc_common.mechanisms.central import PartyData, predict_head
from capc_common.privacy import SystemNoise

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Layout:
    """A consortium: ``parties`` parties sharing ``share`` of the training images (kept by keyed hash),
    classes uniform (``alpha`` None) or Dirichlet(``alpha``)-skewed."""

    parties: int
    share: float
    alpha: float | None


LAYOUTS = {
    "10x6000-iid": Layout(10, 1.0, None),
    "10x6000-skewed": Layout(10, 1.0, 0.5),
    "50x400-skewed": Layout(50, 1 / 3, 0.5),
    "200x100": Layout(200, 1 / 3, None),
}
#: ``--smoke``: scikit-learn's digits (1,438 training images), seconds; Private-kNN asks fewer neighbours
#: (a Poisson sample of a small party holds fewer than 200 records) and fewer queries.
SMOKE_LAYOUTS = {"3x480-iid": Layout(3, 1.0, None), "6x80-skewed": Layout(6, 1 / 3, 0.5)}
SMOKE_HYPER = {"knn": {"neighbours": 20, "queries": 128}}
#: Not private: one value per (layout, seed), shown beside every ε.
BASELINES = ("local-only", "pooled")
#: The mechanisms run through ``benchmarks/mechanisms.py``'s registry, by name.
REGISTERED = ("dppl", "secagg-dpsgd", "dp-fedavg", "central-dpsgd", "private-knn")
#: The two pipelines (one run per layout and seed gives every ε).
PIPELINES = {"diet-capc": "diet-pate", "pate-scratch": "pate-scratch"}
#: Cheapest first, so a seed's table fills early.
METHODS = (*BASELINES, *REGISTERED, *PIPELINES)
#: ε 3 first: the figure's.
EPSILONS = (3.0, 1.0, 6.0)
#: The HYPER groups (and the pipeline config, ``dietpate``) each method's rows depend on.
USES = {
    **{name: BY_NAME[name].uses for name in REGISTERED},
    "local-only": ("local",),
    "pooled": ("secagg",),
    "diet-capc": ("dietpate",),
    "pate-scratch": ("dietpate",),
}
#: The mechanisms this engine's federation runs (benchmark name → ``mechanism.name`` in federation.yaml):
#: what ``--export`` writes for ``capc federation plan`` to recommend from (the others are references).
FEDERATION = {
    "secagg-dpsgd": "secagg-dpsgd",
    "diet-capc": "confident-gnmax",
    "dppl": "dppl",
    "private-knn": "private-knn",
}
#: Where ``--export`` writes by default: next to :mod:`capc_common.federation.recommend`.
EXPORT = ROOT / "src" / "capc_common" / "federation" / "joining_table.json"
#: dp-fedavg runs one Flower client process per party (~70 MB each, measured): more do not fit the machine.
FLOWER_MAX_CLIENTS = 64
#: The layouts' image subsets are keyed apart from the party split (a site key of its own: seed + this).
SUBSET_KEY = 1 << 32
FIELDS = (
    "layout",
    "method",
    "epsilon_target",
    "seed",
    "epsilon",
    "accuracy",
    "accuracy_min",
    "accuracy_max",
    "parties",
    "records",
    "smallest",
    "largest",
    "released",
    "noise",
    "seconds",
)


# ------------------------------------------------------------------------------------------ the layouts
def layout_parties(layout: Layout, images: np.ndarray, labels: np.ndarray, *, seed: int) -> list[np.ndarray]:
    """Each party's records (indices into the training images, ascending), empty parties left out: the
    layout's share kept by one keyed hash, dealt to parties by another."""
    from capc_common.data import site_part, site_parts

    kept = (
        np.arange(len(labels))
        if layout.share == 1
        else site_part(images, labels, part=0, parts=1, seed=SUBSET_KEY + seed, fraction=layout.share)
    )
    parts = site_parts(images[kept], labels[kept], parts=layout.parties, seed=seed, alpha=layout.alpha)
    return [kept[p] for p in parts if len(p)]


def nominal_size(layout: Layout, total: int) -> int:
    """Examples per party the layout is named by."""
    return round(total * layout.share / layout.parties)


# ------------------------------------------------------------------------------------------ the methods
@dataclass
class Cell:
    """What every method of one (layout, seed) sees."""

    args: argparse.Namespace
    layout: str
    seed: int
    records: list[np.ndarray]
    parties: list[PartyData]
    ex: np.ndarray
    ey: np.ndarray
    needs: dict[str, dict[str, Any]]

    def describe(self) -> dict[str, Any]:
        sizes = [len(r) for r in self.records]
        return {
            "parties": len(sizes),
            "records": sum(sizes),
            "smallest": min(sizes),
            "largest": max(sizes),
        }


def pooled_ceiling(cell: Cell) -> np.ndarray:
    """One head on every record, not private: the federation's own recipe with the noise switched off (the
    releases' exact sums), so the gap to it is what privacy costs. (The local recipe, Adam for 100 steps,
    stops short of it on 60,000 records: 89.8 % against 91.0 %.)"""
    from methods.dpsgd import recipe_trainer

    basis = cell.needs["pooled"]["basis"] if HYPER["secagg"]["projection"] else None
    trainer, _ = recipe_trainer(cell.parties[0].features.shape[1], basis, epsilon=1.0, noiseless=True)
    prepared = [trainer.prepare(p.features) for p in cell.parties]
    sampler = SystemNoise()  # q = 1: every record, nothing drawn
    for _ in range(trainer.rounds):
        state = trainer.state()
        trainer.absorb(
            sum(
                trainer.contribute(state, x, p.labels, sampler)
                for p, x in zip(cell.parties, prepared, strict=True)
            )
        )
    predicted = predict_head(trainer.head(), cell.ex)
    return np.asarray([float(np.mean(predicted == cell.ey))])


def baseline(cell: Cell, method: str) -> dict[float, dict[str, Any]]:
    """local-only (each party alone: min, mean, max) or pooled (one head on every record), not private."""
    pooled = method == "pooled"
    acc = pooled_ceiling(cell) if pooled else per_party_accuracy(cell.parties, cell.ex, cell.ey)
    return {
        math.inf: {
            "epsilon": math.inf,
            "accuracy": float(acc.mean()),
            "accuracy_min": float(acc.min()),
            "accuracy_max": float(acc.max()),
            "released": 0,
            "noise": "none (not private)",
        }
    }


def registered(cell: Cell, method: str, epsilon: float) -> dict[float, dict[str, Any]]:
    """One ε of a method of ``mechanisms.py``'s registry, as that benchmark runs it."""
    m = BY_NAME[method]
    out = m.run(cell.parties, cell.ex, cell.ey, epsilon=epsilon, seed=cell.seed, **cell.needs[method])
    return {epsilon: {k: out[k] for k in ("accuracy", "epsilon", "released", "noise")}}


def teacher_shards(cell: Cell, heads: list[int], images: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    """Each party's records dealt to its ``heads[i]`` teachers by keyed content hash (the teacher service's
    split), as indices into the training images."""
    from capc_common.data import partition

    shards = []
    for records, count in zip(cell.records, heads, strict=True):
        if count:
            local = partition(
                labels[records], shards=count, scheme="hash", seed=cell.seed, images=images[records]
            )
            shards += [records[s] for s in local]
    return shards


def pipeline(cell: Cell, method: str, epsilons: list[float]) -> dict[float, dict[str, Any]]:
    """DIET-CaPC or PATE without public data: one run at the largest ε, every ε of ``epsilons`` from its
    curve; teachers per party and the mechanism from the planner, for the parties that can hold one."""
    from capc_common.data import load_dataset
    from capc_common.dietpate import FeatureCache, load_config, prepare
    from capc_common.dietpate.config import RunConfig
    from capc_common.dietpate.stages import execute
    from capc_common.federation.sizing import heads_for, propose

    args = cell.args
    base = load_config(args.config)
    bn = base.backbone.bn_batch
    sizes = [len(r) for r in cell.records]
    heads = [heads_for(n, bn_batch=bn) for n in sizes]
    plan = propose(
        [n for n, h in zip(sizes, heads, strict=True) if h],
        classes=10,
        epsilon=max(epsilons),
        delta=base.budget.delta,
        bn_batch=bn,
    )
    train = load_dataset(args.dataset, split="train")
    data = base.model_dump()
    data.update(
        method=PIPELINES[method],
        seed=cell.seed,
        output=str(args.runs_dir / f"{cell.layout}-{method}-s{cell.seed}"),
        plots=False,
    )
    data["dataset"].update(name=args.dataset, train_limit=None, test_limit=None, validation=0)
    data["teachers"].update(count=plan["teachers"], partition="hash")
    data["mechanism"].update({k: plan["mechanism"][k] for k in ("threshold", "sigma1", "sigma2")})
    data["queries"].update(batch_size=plan["queries"]["batch_size"], max_queries=plan["queries"]["total"])
    data["budget"]["epsilon"] = max(epsilons)
    data["student"]["curve_epsilons"] = sorted(epsilons)
    prep = prepare(RunConfig.model_validate(data))
    shards = teacher_shards(cell, heads, train.images, train.labels)
    prep = replace(prep, shards=shards)  # the federation's teachers, not the config's one-level split
    left_out = sum(1 for h in heads if not h)
    log(
        f"    {method}: {len(shards)} teachers over {len(heads) - left_out} parties "
        f"({min(h for h in heads if h)}–{max(heads)} each; {left_out} parties too small for one), "
        f"T={plan['mechanism']['threshold']:g} σ1={plan['mechanism']['sigma1']:g} "
        f"σ2={plan['mechanism']['sigma2']:g}, batches of {plan['queries']['batch_size']}"
    )
    report = execute(prep, cache=FeatureCache(args.cache_dir), progress=False, log=lambda s: log(f"    {s}"))
    points = {float(c["epsilon_target"]): c for c in report["curve"]}
    rows = {}
    for eps in epsilons:
        point = points.get(float(eps))
        rows[eps] = {
            "epsilon": point["epsilon_spent"] if point else "",
            "accuracy": point["student_accuracy"] if point else "",
            "released": point["answered"] if point else 0,
            "noise": f"{len(shards)} teachers (mean accuracy {report['mean_teacher_accuracy']:.3f}), "
            f"{point['answered'] if point else 0}/{point['queries'] if point else 0} answered"
            + (f", {left_out} parties too small for a teacher" if left_out else "")
            + ("" if point else ": the budget cannot pay for one batch"),
        }
    return rows


# ------------------------------------------------------------------------------------------ the grid
def setting_of(args: argparse.Namespace, total: int, test: int) -> dict[str, Any]:
    """Everything besides (layout, method, ε, seed) that a row's figure depends on."""
    from capc_common.dietpate import load_config

    config = load_config(args.config).model_dump(exclude={"output", "seed", "name"})
    return {
        "dataset": args.dataset,
        "train_images": total,
        "test_images": test,
        "layouts": {name: asdict(layout) for name, layout in args.all_layouts.items()},
        "split": SPLIT,
        "subset_key": SUBSET_KEY,
        "hyper": {**HYPER, "dietpate": config},
    }


def check_setting(current: dict[str, Any], csv_path: Path, rows: list[dict[str, str]]) -> None:
    """Refuse to add to a CSV recorded under another setting (in what its rows depend on); record ours.

    Raises:
        SystemExit: the recorded setting differs.
    """
    path = csv_path.with_suffix(".setting.json")
    current = json.loads(json.dumps(current))
    if path.exists():
        recorded = json.loads(path.read_text())
        changed = setting_differences(recorded, current, {r["method"] for r in rows}, USES)
        if changed:
            raise SystemExit(
                f"{csv_path} holds rows of another setting (differs in {changed}; recorded in {path}): "
                "give this run its own --out or --name, or move the old CSV away"
            )
    path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")


def append(csv_path: Path, rows: list[dict[str, Any]]) -> None:
    """Append finished cells (header first if the file is new)."""
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows({k: r[k] for k in FIELDS} for r in rows)


def cannot_run(cell: Cell, method: str) -> str:
    """Why ``method`` cannot run on this layout ('' when it can): the limits the registry's runners have."""
    smallest = min(len(r) for r in cell.records)
    if method == "dp-fedavg" and len(cell.parties) > FLOWER_MAX_CLIENTS:
        return f"{len(cell.parties)} Flower client processes (more than {FLOWER_MAX_CLIENTS} do not fit)"
    knn = HYPER["knn"]
    if method == "private-knn" and smallest * knn["sampling_rate"] < knn["neighbours"]:
        return (
            f"the smallest party's Poisson sample (rate {knn['sampling_rate']:g} of {smallest} records) "
            f"holds fewer than the {knn['neighbours']} neighbours each party must vote with"
        )
    return ""


def skip(cell: Cell, method: str, todo: list[float], why: str) -> Iterator[list[dict[str, Any]]]:
    """The rows of cells ``method`` cannot run on this layout: no accuracy, and why."""
    log(f"{cell.layout:15s} {method:13s} seed {cell.seed}: not run: {why}")
    yield [
        {
            **dict.fromkeys(("epsilon", "accuracy", "accuracy_min", "accuracy_max"), ""),
            "layout": cell.layout,
            "method": method,
            "epsilon_target": eps,
            "seed": cell.seed,
            **cell.describe(),
            "released": 0,
            "noise": f"not run: {why}",
            "seconds": 0.0,
        }
        for eps in todo
    ]


def run_method(cell: Cell, method: str, todo: list[float]) -> Iterator[list[dict[str, Any]]]:
    """The rows of ``method``'s unfinished ε of one (layout, seed), yielded run by run as each finishes (a
    pipeline runs once for all its ε, the others once per ε); each run's rows carry its time and are
    printed."""
    for batch in [todo] if method in PIPELINES else [[e] for e in todo]:
        t0 = time.perf_counter()
        if method in BASELINES:
            out = baseline(cell, method)
        elif method in PIPELINES:
            out = pipeline(cell, method, batch)
        else:
            out = registered(cell, method, batch[0])
        seconds = round(time.perf_counter() - t0, 1)
        every = " for every ε" if len(out) > 1 else ""
        rows = []
        for eps, values in out.items():
            row = {"accuracy_min": "", "accuracy_max": "", **values}
            row.update(layout=cell.layout, method=method, epsilon_target=eps, seed=cell.seed, seconds=seconds)
            row.update(cell.describe())
            acc = "–" if row["accuracy"] == "" else f"{row['accuracy']:.4f}"
            log(
                f"{cell.layout:15s} {method:13s} ε {eps:<4g} seed {cell.seed}: accuracy {acc} "
                f"({seconds} s{every}; {row['noise']})"
            )
            rows.append(row)
        yield rows


def run_grid(args: argparse.Namespace, csv_path: Path, rows: list[dict[str, Any]]) -> int:
    """Run every cell not in ``rows``, appending each run's rows to the CSV as it finishes. One pass per ε in
    the order given (ε 3 first by default: the figure's), every seed and layout in each, so the figure's
    cells over all seeds are done first; the baselines and the pipelines (every ε in one run) run in the
    first pass that reaches them. A cell a method cannot run is recorded with why (accuracy empty), so it is
    not tried again. Returns how many rows ran."""
    done = {(r["layout"], r["method"], float(r["epsilon_target"]), int(r["seed"])) for r in rows}

    def work_of(epsilon: float, seed: int, layout: str) -> dict[str, list[float]]:
        """The unfinished ε of each method in the pass of ``epsilon``, for one seed and layout."""
        work = {}
        for method in args.methods:
            targets = [epsilon] if method in REGISTERED else args.epsilons
            todo = [
                e
                for e in ([math.inf] if method in BASELINES else targets)
                if (layout, method, e, seed) not in done
            ]
            if todo:
                work[method] = todo
        return work

    passes = [(e, s, n) for e in args.epsilons for s in args.seeds for n in args.layouts]
    if not any(work_of(*p) for p in passes):
        return 0  # every cell is done: report only, without loading the features
    tx, ty, images, ex, ey = load_features(args)
    log(f"features: train {tx.shape}, test {ex.shape}")
    needs = {m: BY_NAME[m].needs(args) for m in args.methods if m in REGISTERED}
    if "pooled" in args.methods:  # the federation's recipe, noise off
        needs["pooled"] = BY_NAME["secagg-dpsgd"].needs(args)
    ran = 0
    for epsilon, seed, name in passes:
        work = work_of(epsilon, seed, name)
        if not work:
            continue
        records = layout_parties(args.all_layouts[name], images, ty, seed=seed)
        parties = [PartyData(f"party-{i}", tx[r], ty[r], images=images[r]) for i, r in enumerate(records)]
        cell = Cell(args, name, seed, records, parties, ex, ey, needs)
        for method, todo in work.items():
            why = cannot_run(cell, method)
            try:
                runs = skip(cell, method, todo, why) if why else run_method(cell, method, todo)
                for new in runs:
                    append(csv_path, new)
                    rows.extend(new)
                    ran += len(new)
            except InputError as exc:  # the method refuses this layout: record why, go on
                new = next(skip(cell, method, todo, f"refused: {exc}"))
                append(csv_path, new)
                rows.extend(new)
            done.update((name, method, float(e), seed) for e in todo)
    return ran


# ------------------------------------------------------------------------------------------ the outputs
def _stats(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def summarise(args: argparse.Namespace, rows: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    """The JSON's ``layouts``: per layout the baselines (means over seeds) and each mechanism's mean ± std
    over seeds per ε, with its gain over the best party alone."""
    out = []
    for name, layout in args.all_layouts.items():
        mine = [r for r in rows if r["layout"] == name]
        if not mine:
            continue
        local = [r for r in mine if r["method"] == "local-only"]
        pooled = [float(r["accuracy"]) for r in mine if r["method"] == "pooled"]
        best = _stats([float(r["accuracy_max"]) for r in local])[0] if local else None
        entry: dict[str, Any] = {
            "name": name,
            "parties": layout.parties,
            "examples_per_party": nominal_size(layout, total),
            "records": round(float(np.mean([float(r["records"]) for r in mine]))),
            "party_sizes": {
                "min": float(np.mean([float(r["smallest"]) for r in mine])),
                "mean": float(np.mean([float(r["records"]) / float(r["parties"]) for r in mine])),
                "max": float(np.mean([float(r["largest"]) for r in mine])),
            },
            "skew": "uniform" if layout.alpha is None else f"Dirichlet α = {layout.alpha:g}",
            "local_only": None
            if not local
            else {
                "min": _stats([float(r["accuracy_min"]) for r in local])[0],
                "mean": _stats([float(r["accuracy"]) for r in local])[0],
                "max": best,
                "seeds": len(local),
            },
            "pooled": _stats(pooled)[0] if pooled else None,
            "pooled_std": _stats(pooled)[1] if pooled else None,
            "mechanisms": [],
        }
        for method in METHODS:
            if method in BASELINES:
                continue
            for eps in sorted({float(r["epsilon_target"]) for r in mine if r["method"] == method}):
                cells = [r for r in mine if r["method"] == method and float(r["epsilon_target"]) == eps]
                scored = [r for r in cells if r["accuracy"] != ""]
                if not scored:
                    continue
                mean, std = _stats([float(r["accuracy"]) for r in scored])
                entry["mechanisms"].append(
                    {
                        "name": method,
                        "epsilon": eps,
                        "accuracy_mean": mean,
                        "accuracy_std": std,
                        "seeds": len(scored),
                        "gain_over_best_party": None if best is None else mean - best,
                        "epsilon_spent": max(float(r["epsilon"]) for r in scored),
                        "seconds_mean": float(np.mean([float(r["seconds"]) for r in cells])),
                    }
                )
        out.append(entry)
    return out


def _pct(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" + ("" if std is None else f" ± {100 * std:.1f}")


def write_markdown(layouts: list[dict[str, Any]], path: Path, epsilons: list[float], command: str) -> None:
    """The summary at ε 3 (one row per layout), then one table per layout: mechanisms × ε, accuracy mean ±
    std (%) and the gain over the best party (points)."""
    headline = 3.0 if 3.0 in epsilons else max(epsilons)
    methods = [m for m in METHODS if m not in BASELINES]
    present = [m for m in methods if any(x["name"] == m for lay in layouts for x in lay["mechanisms"])]
    lines = [
        f"Test accuracy (%), mean ± std over seeds; ε at δ = {DELTA:g}, rigorous; neighbouring datasets: "
        f"{NEIGHBOURING}. Command: `{command}`",
        "",
        f"**At ε = {headline:g}** (gain over the best party alone, points, in brackets)",
        "",
        "| layout | party alone: min / mean / max | pooled (non-private) | " + " | ".join(present) + " |",
        "|---|---|---|" + "---|" * len(present),
    ]
    for lay in layouts:
        lo = lay["local_only"] or {}
        cells = []
        for m in present:
            hit = [x for x in lay["mechanisms"] if x["name"] == m and x["epsilon"] == headline]
            cells.append(
                "–"
                if not hit
                else _pct(hit[0]["accuracy_mean"], hit[0]["accuracy_std"])
                + (
                    ""
                    if hit[0]["gain_over_best_party"] is None
                    else f" ({100 * hit[0]['gain_over_best_party']:+.1f})"
                )
            )
        lines.append(
            f"| {lay['name']} | {_pct(lo.get('min'))} / {_pct(lo.get('mean'))} / {_pct(lo.get('max'))} | "
            f"{_pct(lay['pooled'], lay['pooled_std'])} | " + " | ".join(cells) + " |"
        )
    for lay in layouts:
        sizes = lay["party_sizes"]
        lines += [
            "",
            f"**{lay['name']}**: {lay['parties']} parties ({lay['skew']}), {lay['records']} records, "
            f"party sizes {sizes['min']:.0f}–{sizes['max']:.0f} (mean {sizes['mean']:.0f})",
            "",
            "| method | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " | seeds | s/run |",
            "|---" * (len(epsilons) + 3) + "|",
        ]
        for m in methods:
            cells = {x["epsilon"]: x for x in lay["mechanisms"] if x["name"] == m}
            if not cells:
                continue
            row = [
                "–"
                if e not in cells
                else _pct(cells[e]["accuracy_mean"], cells[e]["accuracy_std"])
                + (
                    ""
                    if cells[e]["gain_over_best_party"] is None
                    else f" ({100 * cells[e]['gain_over_best_party']:+.1f})"
                )
                for e in epsilons
            ]
            any_cell = next(iter(cells.values()))
            lines.append(
                f"| {m} | " + " | ".join(row) + f" | {any_cell['seeds']} | {any_cell['seconds_mean']:.0f} |"
            )
    path.write_text("\n".join(lines) + "\n")


def plot(layouts: list[dict[str, Any]], path: Path, epsilon: float) -> None:
    """Accuracy against examples per party (log): each party alone (min–max band, mean line), the pooled
    ceiling and each mechanism at ``epsilon``; one panel for uniform layouts, one for skewed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, list[dict[str, Any]]] = {}
    for lay in sorted(layouts, key=lambda lay: lay["examples_per_party"]):
        panels.setdefault("classes uniform" if lay["skew"] == "uniform" else "classes skewed", []).append(lay)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False, sharey=True)
    methods = [m for m in METHODS if m not in BASELINES]
    for ax, (title, lays) in zip(axes[0], panels.items(), strict=True):
        x = [lay["examples_per_party"] for lay in lays]
        alone = [lay for lay in lays if lay["local_only"]]
        if alone:
            xs = [lay["examples_per_party"] for lay in alone]
            lo = [100 * lay["local_only"]["min"] for lay in alone]
            hi = [100 * lay["local_only"]["max"] for lay in alone]
            ax.fill_between(xs, lo, hi, color="grey", alpha=0.25, label="each party alone (min–max)")
            ax.plot(
                xs,
                [100 * lay["local_only"]["mean"] for lay in alone],
                "--",
                color="grey",
                label="party alone, mean",
            )
        pooled = [
            (lay["examples_per_party"], 100 * lay["pooled"]) for lay in lays if lay["pooled"] is not None
        ]
        if pooled:
            ax.plot(*zip(*pooled, strict=True), ":", color="black", label="pooled, non-private")
        for i, m in enumerate(methods):
            pts = [
                (lay["examples_per_party"], hit[0])
                for lay in lays
                if (hit := [c for c in lay["mechanisms"] if c["name"] == m and c["epsilon"] == epsilon])
            ]
            if pts:
                ax.errorbar(
                    [p[0] for p in pts],
                    [100 * p[1]["accuracy_mean"] for p in pts],
                    yerr=[100 * p[1]["accuracy_std"] for p in pts],
                    marker="o",
                    capsize=3,
                    color=plt.get_cmap("tab10")(i),
                    label=f"{m}, ε = {epsilon:g}",
                )
        ax.set_xscale("log")
        ax.set_xticks(x, [f"{lay['examples_per_party']}\n({lay['name']})" for lay in lays])
        ax.minorticks_off()
        ax.set_xlabel("examples per party")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%)")
    # One legend for both panels: a method measured in one layout only has its marker in one panel.
    handles = {}
    for ax in axes[0]:
        handles.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize="small", loc="lower right")
    fig.suptitle(f"Worth joining? Fashion-MNIST, alone vs. the federation (δ = {DELTA:g})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def export(path: Path, layouts: list[dict[str, Any]], *, dataset: str, source: str) -> None:
    """The table ``capc federation plan`` recommends from: each layout with the federation's mechanisms
    only (:data:`FEDERATION`; central DP-SGD, DP-FedAvg and PATE without public data are references no
    federation of this engine runs), labelled with where it was measured."""
    table = {
        "dataset": dataset,
        "source": f"benchmarks/joining.py: {source}",
        "engine": FEDERATION,
        "layouts": [
            {**lay, "mechanisms": [m for m in lay["mechanisms"] if m["name"] in FEDERATION]}
            for lay in layouts
        ],
    }
    path.write_text(json.dumps(table, indent=1) + "\n")


# ------------------------------------------------------------------------------------------ main
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--layouts", nargs="+", help=f"default: all ({', '.join(LAYOUTS)})")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--smoke", action="store_true", help="digits, two tiny layouts: seconds")
    parser.add_argument("--config", type=Path, help="the DIET-PATE run config (default: the shipped one)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "runs" / "cache")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "joining", help="pipeline runs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", help="output file stem (default: joining, joining-smoke with --smoke)")
    parser.add_argument(
        "--export",
        nargs="?",
        const=EXPORT,
        type=Path,
        metavar="JSON",
        help=f"also write the federation mechanisms' table for `capc federation plan` (default {EXPORT})",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.smoke else "fashion-mnist"
    for group, values in (SMOKE_HYPER if args.smoke else {}).items():
        HYPER[group].update(values)
    args.all_layouts = SMOKE_LAYOUTS if args.smoke else LAYOUTS
    args.layouts = args.layouts or list(args.all_layouts)
    unknown = sorted(set(args.layouts) - args.all_layouts.keys())
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {', '.join(args.all_layouts)}")
    if min(args.epsilons) <= 0:
        parser.error(f"every ε must be positive, got {min(args.epsilons)}")
    default = "digits-quick.yaml" if args.smoke else "fashion-mnist-diet-pate.yaml"
    args.config = args.config or ROOT / "configs" / default
    args.name = args.name or ("joining-smoke" if args.smoke else "joining")
    # What methods/data.load_features and the registry's needs read (mechanisms.py's arguments).
    args.evaluate_on, args.validation = "test", 0
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the grid (skipping finished cells) and write the outputs."""
    from capc_common.data import load_dataset

    args = parse(argv)
    started = time.perf_counter()
    total = len(load_dataset(args.dataset, split="train").labels)
    test = len(load_dataset(args.dataset, split="test").labels)
    args.train_limit, args.test_limit = total, test
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{args.name}.csv"
    rows: list[dict[str, Any]] = []
    if csv_path.exists():
        with csv_path.open() as handle:
            rows = list(csv.DictReader(handle))
    check_setting(setting_of(args, total, test), csv_path, rows)
    ran = run_grid(args, csv_path, rows)
    skipped = [
        {k: r[k] for k in ("layout", "method", "epsilon_target", "seed", "noise")}
        for r in rows
        if r["accuracy"] == ""
    ]
    layouts = summarise(args, rows, total)
    command = " ".join(["python benchmarks/joining.py", *(sys.argv[1:] if argv is None else argv)])
    epsilons = sorted({float(r["epsilon_target"]) for r in rows} - {math.inf})
    write_markdown(layouts, args.out / f"{args.name}.md", epsilons, command)
    plot(layouts, args.out / f"{args.name}.png", 3.0 if 3.0 in epsilons else max(epsilons, default=3.0))
    result = {
        "setting": {
            "dataset": args.dataset,
            "train_images": total,
            "test_images": test,
            "split": SPLIT,
            "neighbouring": NEIGHBOURING,
            "delta": DELTA,
            "config": str(args.config),
        },
        "layouts": layouts,
        "skipped": skipped,
        "rows": len(rows),
        "ran": ran,
        "seconds": round(time.perf_counter() - started, 1),
        "outputs": [str(args.out / f"{args.name}.{ext}") for ext in ("csv", "md", "png")],
    }
    if args.export:
        export(args.export, layouts, dataset=args.dataset, source=f"{len(rows)} runs, {csv_path.name}")
        result["outputs"].append(str(args.export))
    if args.format == "json":
        print(json.dumps(result, default=float))
    else:
        print((args.out / f"{args.name}.md").read_text())
    return result


if __name__ == "__main__":
    main()
