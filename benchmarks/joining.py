"""Worth joining? Each party alone against the federation — and what each party keeps — in the party layouts
a consortium really has, on two real datasets.

Layouts (``LAYOUTS``; a layout's records are a share of the dataset's training images kept by keyed hash,
dealt to parties by another keyed hash, classes uniform or Dirichlet(α = 0.5)-skewed, optionally only the
first few classes): on Fashion-MNIST's 60,000 images from one party of 60,000 to 200 of 100 and 5 of 30,
with 2, 5 and 10 classes; on scikit-learn's digits in MNIST's layout (``digits-28``: 1,438 training images)
from 2 parties of 700 to 10 of 140. Accuracy is on the dataset's test images, read once per reported figure.

**One neighbouring relation.** Every split is a keyed hash of each record's own content
(:func:`capc_common.data.site_part` keeps a layout's share, :func:`~capc_common.data.site_parts` deals it to
parties, the skew a public function of a record's label and hash), each party's holdout is one too
(:func:`~capc_common.data.holdout_part`, its fraction a public function of the layout's nominal party size),
and a party's records are dealt to its teachers by keyed hash, so every row's ε is for adding or removing one
record (``methods/data.py``). A party the split leaves empty does not join.

For each layout and seed (the seed keys the split and the holdout; the mechanisms' noise is drawn from the
operating system's CSPRNG whatever the seed, so two runs of one seed differ by their noise):

* **alone** — every party's strongest model alone (``methods/personal.py``): linear heads on the backbone's
  features (normalised, or standardised with a strong L2) and a small CNN from scratch, chosen on its
  holdout, refitted on the whole party; min, median, mean and max over parties, each party's in ``detail``;
* **pooled** — the non-private ceiling: the federation's recipe with the noise off, on every record;
* at each ε (δ = 1e-5, rigorous accounting) the mechanisms, on the parties' training parts (the holdouts
  stay at home): ``secagg-dpsgd`` (the recommended federation) — and with it **kept**: each party compares,
  on its holdout, alone, the shared student and the student fine-tuned on its data, keeps one, and every
  party's kept model is read on the test set (mean, min, max; each party's four figures and choice in
  ``detail``); ``central-dpsgd``, ``dp-fedavg``, ``dppl``, ``private-knn`` through the registry of
  ``benchmarks/mechanisms.py``; the pipelines ``diet-capc`` (what a DIET-CaPC federation computes: the
  central DIET-PATE pipeline with each party's records dealt to the teachers the planner gives it) and
  ``pate-scratch`` (PATE without public data: pixel MLPs instead of the shared backbone), which run once at
  the largest ε and give every smaller ε from their replayed filter. The registry's mechanisms and the
  pipelines assume a dataset's ten classes; on a subset of classes they are recorded as not run, with why.

``gain_over_best_party`` is a mechanism's mean accuracy minus the mean (over seeds) of the best party's
alone accuracy: what the best-placed member gains by joining; ``kept`` rows carry ``gain_over_alone`` (mean
over parties of kept − alone) and ``worse`` (parties whose kept model is more than 0.2 point below alone).

**Honest by construction.** Every row carries the hash of the code that computed it
(``methods/provenance.py``: the library's and this benchmark's syntax trees without docstrings); a run
refuses to add rows to a CSV of another code (``--fresh`` moves it aside), and the tables and ``--export``
refuse rows of mixed code. Resumable within one code: each finished cell is appended to ``joining.csv`` and
skipped on the next start; the setting (layouts, split, hyper-parameters, the pipeline config) is recorded
in ``joining.setting.json`` and a CSV of another setting is refused. Features are cached per image set in
``--cache-dir``.

    python benchmarks/joining.py --format json                        # the grid (resumable)
    python benchmarks/joining.py --layouts 4x1000 digits-3x480 --methods alone pooled secagg-dpsgd
    python benchmarks/joining.py --smoke --epsilons 20 --format json  # digits' pixels, seconds: the test

``--export`` also writes the measurements ``capc federation plan`` predicts from
(``src/capc_common/federation/joining_table.json``).

JSON keys: ``setting``; ``code``; ``layouts[]``: ``name``, ``dataset``, ``classes``, ``parties``,
``examples_per_party`` (nominal), ``records``, ``party_sizes.{min,median,mean,max}``, ``skew``,
``holdout_fraction``, ``alone.{min,median,mean,max,seeds}``, ``pooled``,
``mechanisms[].{name,epsilon,accuracy_mean,accuracy_std,gain_over_best_party,seeds,epsilon_spent,
seconds_mean,tuning}`` (``kept`` entries add ``gain_over_alone``, ``worse``, ``chose``); ``skipped[]``;
``rows``; ``ran``; ``seconds``; ``outputs``. ``setting.tuning`` is ``methods.common.TUNING``: what tuning
each method's settings got.
Outputs (``--out``, default benchmarks/results): ``joining.csv``, ``joining.md``, ``joining.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from mechanisms import BY_NAME, setting_differences
from methods.common import DELTA, HYPER, TUNING, log
from methods.data import NEIGHBOURING, SPLIT, load_features
from methods.personal import RECIPE, Party, alone_all, kept_all, split_parties, test_accuracy
from methods.provenance import code_hash, one_code

from capc_common.errors import InputError
from capc_common.mechanisms.central import PartyData, predict_head
from capc_common.privacy import SystemNoise

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Layout:
    """A consortium: ``parties`` parties sharing ``share`` of a dataset's training images of its first
    ``classes`` classes (None: all; kept by keyed hash), classes uniform (``alpha`` None) or
    Dirichlet(``alpha``)-skewed."""

    parties: int
    share: float
    alpha: float | None
    dataset: str = "fashion-mnist"
    classes: int | None = None


DIGITS = "digits-28"
LAYOUTS = {
    "10x6000-iid": Layout(10, 1.0, None),
    "10x6000-skewed": Layout(10, 1.0, 0.5),
    "2x30000": Layout(2, 1.0, None),
    "1x60000": Layout(1, 1.0, None),
    "50x400-skewed": Layout(50, 1 / 3, 0.5),
    "200x100": Layout(200, 1 / 3, None),
    "4x1000": Layout(4, 1 / 15, None),
    "3x100": Layout(3, 1 / 200, None),
    "5x30": Layout(5, 1 / 400, None),
    "5x1000-5class": Layout(5, 1 / 6, None, classes=5),
    "3x100-2class": Layout(3, 1 / 40, None, classes=2),
    "digits-2x700": Layout(2, 1.0, None, dataset=DIGITS),
    "digits-3x480": Layout(3, 1.0, None, dataset=DIGITS),
    "digits-10x140": Layout(10, 1.0, None, dataset=DIGITS),
    "digits-6x80-skewed": Layout(6, 1 / 3, 0.5, dataset=DIGITS),
    "digits-3x100-2class": Layout(3, 1.0, None, dataset=DIGITS, classes=2),
}
#: ``--smoke``: scikit-learn's digits as pixels (1,438 training images), seconds; Private-kNN asks fewer
#: neighbours (a Poisson sample of a small party holds fewer than 200 records) and fewer queries.
SMOKE_LAYOUTS = {
    "3x480-iid": Layout(3, 1.0, None, dataset="digits"),
    "6x80-skewed": Layout(6, 1 / 3, 0.5, dataset="digits"),
}
SMOKE_HYPER = {"knn": {"neighbours": 20, "queries": 128}}
#: Not private: one value per (layout, seed), shown beside every ε.
BASELINES = ("alone", "pooled")
#: The federation this benchmark measures what each party keeps of (its rows come with ``kept`` rows).
KEPT_OF = "secagg-dpsgd"
#: The mechanisms run through ``benchmarks/mechanisms.py``'s registry, by name.
REGISTERED = ("dppl", "secagg-dpsgd", "dp-fedavg", "central-dpsgd", "private-knn")
#: The two pipelines (one run per layout and seed gives every ε).
PIPELINES = {"diet-capc": "diet-pate", "pate-scratch": "pate-scratch"}
#: Cheapest first, so a seed's table fills early (``kept`` is written by ``secagg-dpsgd``'s runs).
METHODS = (*BASELINES, *REGISTERED, *PIPELINES)
#: Every method a row can name.
ROW_METHODS = (*METHODS, "kept")
#: ε 3 first: the figure's.
EPSILONS = (3.0, 1.0, 6.0, 10.0)
#: The HYPER groups (and the pipeline config, ``dietpate``) each method's rows depend on.
USES = {
    **{name: BY_NAME[name].uses for name in REGISTERED},
    "alone": ("personal",),
    "kept": ("personal", "secagg"),
    "pooled": ("secagg",),
    "diet-capc": ("dietpate",),
    "pate-scratch": ("dietpate",),
}
#: The mechanisms this engine's federation runs (benchmark name → ``mechanism.name`` in federation.yaml):
#: what ``--export`` writes for ``capc federation plan`` to predict from (the others are references).
FEDERATION = {
    "secagg-dpsgd": "secagg-dpsgd",
    "diet-capc": "confident-gnmax",
    "dppl": "dppl",
    "private-knn": "private-knn",
}
#: Where ``--export`` writes by default: next to :mod:`capc_common.federation.forecast`.
EXPORT = ROOT / "src" / "capc_common" / "federation" / "joining_table.json"
#: dp-fedavg runs one Flower client process per party (~70 MB each, measured): more do not fit the machine.
FLOWER_MAX_CLIENTS = 64
#: The layouts' image subsets are keyed apart from the party split (a site key of its own: seed + this).
SUBSET_KEY = 1 << 32
#: ``--evaluate-on validation``: the last training images of each dataset held out as the evaluation set.
VALIDATION = {"fashion-mnist": 10_000, DIGITS: 288, "digits": 288}
#: A party's kept model counts as worse than alone below this margin (the done-criterion's tolerance).
WORSE = 0.002
FIELDS = (
    "layout",
    "dataset",
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
    "code",
    "detail",
)


# ------------------------------------------------------------------------------------------ the layouts
def layout_parties(layout: Layout, images: np.ndarray, labels: np.ndarray, *, seed: int) -> list[np.ndarray]:
    """Each party's records (indices into the training images, ascending), empty parties left out: the
    layout's classes, then its share kept by one keyed hash, dealt to parties by another."""
    from capc_common.data import site_part, site_parts

    pool = np.arange(len(labels)) if layout.classes is None else np.flatnonzero(labels < layout.classes)
    kept = (
        pool
        if layout.share == 1
        else pool[
            site_part(
                images[pool], labels[pool], part=0, parts=1, seed=SUBSET_KEY + seed, fraction=layout.share
            )
        ]
    )
    parts = site_parts(images[kept], labels[kept], parts=layout.parties, seed=seed, alpha=layout.alpha)
    return [kept[p] for p in parts if len(p)]


def nominal_size(layout: Layout, labels: np.ndarray) -> int:
    """Examples per party the layout is named by (a public figure: it sets the parties' holdout)."""
    pool = len(labels) if layout.classes is None else int((labels < layout.classes).sum())
    return max(1, round(pool * layout.share / layout.parties))


def classes_of(layout: Layout) -> int:
    """The classes a layout's federation is configured with."""
    return layout.classes or 10


# ------------------------------------------------------------------------------------------ the methods
@dataclass
class Data:
    """One dataset's features (per example, L2-normalised), labels and images, training and test."""

    tx: np.ndarray
    ty: np.ndarray
    images: np.ndarray
    ex: np.ndarray
    ey: np.ndarray
    test_images: np.ndarray


@dataclass
class Cell:
    """What every method of one (layout, seed) sees: the parties (training part and holdout each), the test
    set of the layout's classes, what the methods need, and each party's model alone once fitted."""

    args: argparse.Namespace
    layout: str
    seed: int
    records: list[np.ndarray]
    parties: list[Party]
    fraction: float
    classes: int
    ex: np.ndarray
    ey: np.ndarray
    test_images: np.ndarray
    data: Data
    needs: dict[str, dict[str, Any]]

    @property
    def federation(self) -> list[PartyData]:
        """The parties as the federation sees them: their training parts."""
        return [p.data for p in self.parties]

    def alone(self) -> list[Any]:
        """Every party's best model alone (fitted once per layout and seed, whatever the ε pass)."""
        key = (self.layout, self.seed)
        if key not in self.args.alones:
            self.args.alones[key] = alone_all(self.parties, classes=self.classes, seed=self.seed)
        return self.args.alones[key]

    def describe(self) -> dict[str, Any]:
        sizes = [len(r) for r in self.records]
        return {
            "parties": len(sizes),
            "records": sum(sizes),
            "smallest": min(sizes),
            "largest": max(sizes),
        }


def pooled_ceiling(cell: Cell) -> np.ndarray:
    """One head on every record (holdouts included), not private: the federation's own recipe with the noise
    switched off (the releases' exact sums), so the gap to it is what privacy costs."""
    from methods.dpsgd import recipe_trainer

    basis = cell.needs["pooled"]["basis"] if HYPER["secagg"]["projection"] else None
    tx, ty = cell.data.tx, cell.data.ty
    trainer, _ = recipe_trainer(tx.shape[1], basis, epsilon=1.0, noiseless=True, classes=cell.classes)
    prepared = [trainer.prepare(tx[r]) for r in cell.records]
    sampler = SystemNoise()  # q = 1: every record, nothing drawn
    for _ in range(trainer.rounds):
        state = trainer.state()
        trainer.absorb(
            sum(
                trainer.contribute(state, x, y, sampler)
                for x, y in zip(prepared, (ty[r] for r in cell.records), strict=True)
            )
        )
    predicted = predict_head(trainer.head(), cell.ex)
    return np.asarray([float(np.mean(predicted == cell.ey))])


def baseline(cell: Cell, method: str) -> dict[float, dict[str, Any]]:
    """alone (each party's strongest model alone: min, mean, max; every party's in ``detail``) or pooled
    (one head on every record), not private."""
    detail: dict[str, Any] = {}
    if method == "pooled":
        acc = pooled_ceiling(cell)
    else:
        alones = cell.alone()
        acc = np.asarray([test_accuracy(a.model, cell.ex, cell.ey, cell.test_images) for a in alones])
        detail = {
            "parties": [round(float(a), 5) for a in acc],
            "kind": [a.detail["kind"] for a in alones],
            "holdout_fraction": cell.fraction,
        }
    return {
        math.inf: {
            "epsilon": math.inf,
            "accuracy": float(acc.mean()),
            "accuracy_min": float(acc.min()),
            "accuracy_max": float(acc.max()),
            "released": 0,
            "noise": "none (not private)",
            "detail": detail,
        }
    }


def registered(cell: Cell, method: str, epsilon: float) -> dict[str, dict[float, dict[str, Any]]]:
    """One ε of a method of ``mechanisms.py``'s registry, as that benchmark runs it, on the parties'
    training parts; for :data:`KEPT_OF` also what each party keeps (``kept``)."""
    m = BY_NAME[method]
    extra = {"classes": cell.classes} if method == KEPT_OF else {}
    out = m.run(
        cell.federation, cell.ex, cell.ey, epsilon=epsilon, seed=cell.seed, **cell.needs[method], **extra
    )
    rows = {method: {epsilon: {k: out[k] for k in ("accuracy", "epsilon", "released", "noise")}}}
    if method == KEPT_OF:
        per_party = kept_all(
            cell.parties,
            cell.alone(),
            out["head"],
            classes=cell.classes,
            seed=cell.seed,
            test=(cell.ex, cell.ey, cell.test_images),
        )
        kept = np.asarray([p["kept"] for p in per_party])
        alone = np.asarray([p["alone"] for p in per_party])
        kept_mix = np.asarray([p["kept_mix"] for p in per_party])
        alone_mix = np.asarray([p["alone_mix"] for p in per_party])
        chose = [p["chose"] for p in per_party]
        rows["kept"] = {
            epsilon: {
                "accuracy": float(kept.mean()),
                "accuracy_min": float(kept.min()),
                "accuracy_max": float(kept.max()),
                "epsilon": out["epsilon"],
                "released": out["released"],
                "noise": f"each party kept {', '.join(f'{chose.count(c)} {c}' for c in sorted(set(chose)))}",
                "detail": {
                    "parties": [_rounded(p) for p in per_party],
                    "gain_over_alone": float((kept - alone).mean()),
                    "gain_over_alone_mix": float((kept_mix - alone_mix).mean()),
                    "worse": int((kept < alone - WORSE).sum()),
                    "worse_mix": int((kept_mix < alone_mix - WORSE).sum()),
                },
            }
        }
    return rows


def _rounded(value: Any) -> Any:
    """Floats of a JSON-able value rounded to 5 digits (the CSV's detail column stays readable)."""
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def teacher_shards(cell: Cell, heads: list[int], images: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    """Each party's training part dealt to its ``heads[i]`` teachers by keyed content hash (the teacher
    service's split), as indices into the training images."""
    from capc_common.data import partition

    shards = []
    for records, count in zip((p.rows for p in cell.parties), heads, strict=True):
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
    dataset = args.all_layouts[cell.layout].dataset
    base = load_config(args.config)
    bn = base.backbone.bn_batch
    sizes = [len(p.rows) for p in cell.parties]
    heads = [heads_for(n, bn_batch=bn) for n in sizes]
    plan = propose(
        [n for n, h in zip(sizes, heads, strict=True) if h],
        classes=10,
        epsilon=max(epsilons),
        delta=base.budget.delta,
        bn_batch=bn,
    )
    train = load_dataset(dataset, split="train")
    data = base.model_dump()
    data.update(
        method=PIPELINES[method],
        seed=cell.seed,
        output=str(args.runs_dir / f"{cell.layout}-{method}-s{cell.seed}"),
        plots=False,
    )
    data["dataset"].update(name=dataset, train_limit=None, test_limit=None, validation=0)
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
def setting_of(args: argparse.Namespace) -> dict[str, Any]:
    """Everything besides (layout, method, ε, seed) that a row's figure depends on (the code: each row's)."""
    from capc_common.dietpate import load_config

    config = load_config(args.config).model_dump(exclude={"output", "seed", "name"})
    return {
        "evaluate_on": args.evaluate_on,
        "layouts": {name: asdict(layout) for name, layout in args.all_layouts.items()},
        "split": SPLIT,
        "subset_key": SUBSET_KEY,
        "hyper": {**HYPER, "dietpate": config, "personal": RECIPE.describe()},
        "tuning": TUNING,
    }


def check_setting(current: dict[str, Any], csv_path: Path, rows: list[dict[str, str]]) -> None:
    """Refuse to add to a CSV recorded under another setting (in what its rows depend on), or holding rows of
    another code; record ours.

    Raises:
        SystemExit: the recorded setting differs, or the CSV holds rows of other code.
    """
    path = csv_path.with_suffix(".setting.json")
    current = json.loads(json.dumps(current))
    if path.exists():
        recorded = json.loads(path.read_text())
        changed = setting_differences(recorded, current, {r["method"] for r in rows}, USES)
        if changed:
            raise SystemExit(
                f"{csv_path} holds rows of another setting (differs in {changed}; recorded in {path}): "
                "give this run its own --out or --name, or move the old CSV away (--fresh)"
            )
    code = code_hash()
    stale = sum(1 for r in rows if r.get("code") != code)
    if stale:
        raise SystemExit(
            f"{csv_path} holds {stale} rows of other code than this ({code}): a grid is one experiment, "
            "so this run does not add to it; --fresh moves it aside (to .old) and starts again, or give "
            "this run its own --out or --name"
        )
    path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")


def append(csv_path: Path, rows: list[dict[str, Any]]) -> None:
    """Append finished cells (header first if the file is new)."""
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows({k: json.dumps(r[k]) if k == "detail" else r[k] for k in FIELDS} for r in rows)


def cannot_run(cell: Cell, method: str) -> str:
    """Why ``method`` cannot run on this layout ('' when it can): the limits the registry's runners have."""
    layout = cell.args.all_layouts[cell.layout]
    ten = layout.classes is None and layout.dataset in ("fashion-mnist", "digits", DIGITS)
    if method not in (*BASELINES, KEPT_OF) and not ten:
        return f"{method} is measured on all ten classes of a dataset only"
    if method in PIPELINES and cell.args.evaluate_on == "validation":
        return (
            f"{method}'s pipeline scores its student on its config's evaluation set (the test images), "
            "not on this run's validation split"
        )
    smallest = min(len(p.rows) for p in cell.parties)
    if method == "dp-fedavg" and len(cell.parties) > FLOWER_MAX_CLIENTS:
        return f"{len(cell.parties)} Flower client processes (more than {FLOWER_MAX_CLIENTS} do not fit)"
    knn = HYPER["knn"]
    if method == "private-knn" and smallest * knn["sampling_rate"] < knn["neighbours"]:
        return (
            f"the smallest party's Poisson sample (rate {knn['sampling_rate']:g} of {smallest} records) "
            f"holds fewer than the {knn['neighbours']} neighbours each party must vote with"
        )
    return ""


def _row(cell: Cell, method: str, eps: float, seconds: float, values: dict[str, Any]) -> dict[str, Any]:
    row = {"accuracy_min": "", "accuracy_max": "", "detail": {}, **values}
    row.update(
        layout=cell.layout,
        dataset=cell.args.all_layouts[cell.layout].dataset,
        method=method,
        epsilon_target=eps,
        seed=cell.seed,
        seconds=seconds,
        code=cell.args.code,
    )
    row.update(cell.describe())
    return row


def skip(cell: Cell, method: str, todo: list[float], why: str) -> Iterator[list[dict[str, Any]]]:
    """The rows of cells ``method`` cannot run on this layout: no accuracy, and why."""
    log(f"{cell.layout:15s} {method:13s} seed {cell.seed}: not run: {why}")
    empty = dict.fromkeys(("epsilon", "accuracy", "accuracy_min", "accuracy_max"), "")
    yield [
        _row(cell, m, eps, 0.0, {**empty, "released": 0, "noise": f"not run: {why}"})
        for eps in todo
        for m in ([method, "kept"] if method == KEPT_OF else [method])
    ]


def run_method(cell: Cell, method: str, todo: list[float]) -> Iterator[list[dict[str, Any]]]:
    """The rows of ``method``'s unfinished ε of one (layout, seed), yielded run by run as each finishes (a
    pipeline runs once for all its ε, the others once per ε); each run's rows carry its time and are
    printed."""
    for batch in [todo] if method in PIPELINES else [[e] for e in todo]:
        t0 = time.perf_counter()
        if method in BASELINES:
            out = {method: baseline(cell, method)}
        elif method in PIPELINES:
            out = {method: pipeline(cell, method, batch)}
        else:
            out = registered(cell, method, batch[0])
        seconds = round(time.perf_counter() - t0, 1)
        rows = []
        for name, by_eps in out.items():
            every = " for every ε" if len(by_eps) > 1 else ""
            for eps, values in by_eps.items():
                row = _row(cell, name, eps, seconds, values)
                acc = "–" if row["accuracy"] == "" else f"{row['accuracy']:.4f}"
                log(
                    f"{cell.layout:15s} {name:13s} ε {eps:<4g} seed {cell.seed}: accuracy {acc} "
                    f"({seconds} s{every}; {row['noise']})"
                )
                rows.append(row)
        yield rows


def dataset_data(args: argparse.Namespace, name: str) -> Data:
    """A dataset's features, labels and images (cached per run)."""
    if name not in args.data:
        from capc_common.data import load_dataset

        sub = argparse.Namespace(**vars(args))
        sub.dataset = name
        sub.train_limit = len(load_dataset(name, split="train").labels)
        sub.test_limit = None
        sub.validation = VALIDATION[name] if args.evaluate_on == "validation" else 0
        tx, ty, images, ex, ey = load_features(sub)
        test_images = (
            load_dataset(name, split="train").images[len(ty) :]
            if args.evaluate_on == "validation"
            else load_dataset(name, split="test").images
        )
        args.data[name] = Data(tx, ty, images, ex, ey, test_images)
        log(f"{name}: features of {tx.shape[0]} training and {ex.shape[0]} test images ({tx.shape[1]} each)")
    return args.data[name]


def needs_of(args: argparse.Namespace, dataset: str, method: str) -> dict[str, Any]:
    """What ``method`` needs besides the parties on ``dataset`` (prepared once per run and dataset)."""
    key = (dataset, method)
    if key not in args.needs:
        sub = argparse.Namespace(**vars(args))
        sub.dataset = dataset
        source = "secagg-dpsgd" if method == "pooled" else method
        args.needs[key] = BY_NAME[source].needs(sub) if source in BY_NAME else {}
    return args.needs[key]


def make_cell(args: argparse.Namespace, name: str, seed: int, methods: list[str]) -> Cell:
    """The parties of one (layout, seed), split into training parts and holdouts."""
    layout = args.all_layouts[name]
    data = dataset_data(args, layout.dataset)
    records = layout_parties(layout, data.images, data.ty, seed=seed)
    parties, fraction = split_parties(
        records, data.tx, data.ty, data.images, nominal=nominal_size(layout, data.ty), seed=seed
    )
    test = np.arange(len(data.ey)) if layout.classes is None else np.flatnonzero(data.ey < layout.classes)
    needs = {m: needs_of(args, layout.dataset, m) for m in methods if m in (*REGISTERED, "pooled")}
    return Cell(
        args,
        name,
        seed,
        records,
        parties,
        fraction,
        classes_of(layout),
        data.ex[test],
        data.ey[test],
        data.test_images[test],
        data,
        needs,
    )


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
    ran = 0
    for epsilon, seed, name in passes:
        work = work_of(epsilon, seed, name)
        if not work:
            continue
        cell = make_cell(args, name, seed, list(work))
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


def _detail(row: dict[str, Any]) -> dict[str, Any]:
    value = row.get("detail") or "{}"
    return value if isinstance(value, dict) else json.loads(value)


def summarise(args: argparse.Namespace, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON's ``layouts``: per layout the baselines (means over seeds) and each mechanism's mean ± std
    over seeds per ε, with its gain over the best party alone; ``kept`` with what the parties kept."""
    out = []
    for name, layout in args.all_layouts.items():
        mine = [r for r in rows if r["layout"] == name]
        if not mine:
            continue
        alone = [r for r in mine if r["method"] == "alone" and r["accuracy"] != ""]
        pooled = [float(r["accuracy"]) for r in mine if r["method"] == "pooled" and r["accuracy"] != ""]
        best = _stats([float(r["accuracy_max"]) for r in alone])[0] if alone else None
        medians = [float(np.median(_detail(r)["parties"])) for r in alone]
        sizes = [float(r["records"]) / float(r["parties"]) for r in mine]
        entry: dict[str, Any] = {
            "name": name,
            "dataset": layout.dataset,
            "classes": classes_of(layout),
            "parties": layout.parties,
            "examples_per_party": nominal_size(layout, dataset_labels(args, layout.dataset)),
            "records": round(float(np.mean([float(r["records"]) for r in mine]))),
            "party_sizes": {
                "min": float(np.mean([float(r["smallest"]) for r in mine])),
                "mean": float(np.mean(sizes)),
                "max": float(np.mean([float(r["largest"]) for r in mine])),
            },
            "skew": "uniform" if layout.alpha is None else f"Dirichlet α = {layout.alpha:g}",
            "holdout_fraction": _detail(alone[0]).get("holdout_fraction") if alone else None,
            "alone": None
            if not alone
            else {
                "min": _stats([float(r["accuracy_min"]) for r in alone])[0],
                "median": _stats(medians)[0],
                "mean": _stats([float(r["accuracy"]) for r in alone])[0],
                "max": best,
                "seeds": len(alone),
            },
            "pooled": _stats(pooled)[0] if pooled else None,
            "pooled_std": _stats(pooled)[1] if pooled else None,
            "mechanisms": [],
        }
        for method in ROW_METHODS:
            if method in BASELINES:
                continue
            for eps in sorted({float(r["epsilon_target"]) for r in mine if r["method"] == method}):
                cells = [r for r in mine if r["method"] == method and float(r["epsilon_target"]) == eps]
                scored = [r for r in cells if r["accuracy"] != ""]
                if not scored:
                    continue
                mean, std = _stats([float(r["accuracy"]) for r in scored])
                item: dict[str, Any] = {
                    "name": method,
                    "epsilon": eps,
                    "accuracy_mean": mean,
                    "accuracy_std": std,
                    "seeds": len(scored),
                    "gain_over_best_party": None if best is None else mean - best,
                    "epsilon_spent": max(float(r["epsilon"]) for r in scored),
                    "seconds_mean": float(np.mean([float(r["seconds"]) for r in cells])),
                    "tuning": TUNING.get(method),
                }
                if method == "kept":
                    details = [_detail(r) for r in scored]
                    chose = [p["chose"] for d in details for p in d["parties"]]
                    item.update(
                        gain_over_alone=_stats([d["gain_over_alone"] for d in details])[0],
                        gain_over_alone_mix=_stats([d["gain_over_alone_mix"] for d in details])[0],
                        worse=sum(d["worse"] for d in details),
                        worse_mix=sum(d["worse_mix"] for d in details),
                        party_runs=len(chose),
                        chose={c: chose.count(c) for c in sorted(set(chose))},
                    )
                entry["mechanisms"].append(item)
        out.append(entry)
    return out


def dataset_labels(args: argparse.Namespace, name: str) -> np.ndarray:
    """A dataset's training labels, the evaluation part cut off (what a layout's nominal party size is
    counted from)."""
    if name in args.data:
        return args.data[name].ty
    if name not in args.labels:
        from capc_common.data import load_dataset

        labels = load_dataset(name, split="train").labels
        cut = VALIDATION[name] if args.evaluate_on == "validation" else 0
        args.labels[name] = labels[: len(labels) - cut]
    return args.labels[name]


def _pct(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" + ("" if std is None else f" ± {100 * std:.1f}")


def _tuned(method: str) -> str:
    """``method`` and how many settings its tuning compared."""
    count = TUNING[method]["candidates"]
    return f"{method} {'per party, on its holdout' if count is None else count}"


def write_markdown(
    layouts: list[dict[str, Any]],
    path: Path,
    epsilons: list[float],
    command: str,
    code: str,
    skipped: list[dict[str, Any]],
) -> None:
    """The summary at ε 3 (one row per layout), then one table per layout: mechanisms × ε, accuracy mean ±
    std (%) and the gain over the best party (points); ``kept`` with its gain over alone. A method that did
    not run in a layout (refused before spending, or beyond a runner's limits) is a "not run" cell, its
    reason listed under the summary."""
    headline = 3.0 if 3.0 in epsilons else max(epsilons)
    methods = [m for m in ROW_METHODS if m not in BASELINES]
    not_run: dict[tuple[str, str], str] = {}
    for r in skipped:
        not_run.setdefault((r["layout"], r["method"]), str(r["noise"]).removeprefix("not run: "))
    present = [
        m
        for m in methods
        if any(x["name"] == m for lay in layouts for x in lay["mechanisms"])
        or any(method == m for _, method in not_run)
    ]
    lines = [
        f"Test accuracy (%), mean ± std over seeds; ε at δ = {DELTA:g}, rigorous; neighbouring datasets: "
        f"{NEIGHBOURING}. Code {code}. Command: `{command}`",
        "",
        "Settings compared on a validation split before these runs (never the test set; the JSON's "
        "`setting.tuning` says which split, over what and where it is written down): "
        + ", ".join(_tuned(m) for m in ("alone", "pooled", *present) if m in TUNING)
        + ".",
        "",
        f"**At ε = {headline:g}** (gain over the best party alone, points, in brackets; for `kept`, the mean "
        "gain of each party's kept model over its own model alone)",
        "",
        "| layout | party alone: min / median / max | pooled (non-private) | " + " | ".join(present) + " |",
        "|---|---|---|" + "---|" * len(present),
    ]

    def cell(hit: dict[str, Any]) -> str:
        gain = hit.get("gain_over_alone", hit["gain_over_best_party"])
        return _pct(hit["accuracy_mean"], hit["accuracy_std"]) + (
            "" if gain is None else f" ({100 * gain:+.1f})"
        )

    for lay in layouts:
        lo = lay["alone"] or {}
        cells = []
        for m in present:
            hit = [x for x in lay["mechanisms"] if x["name"] == m and x["epsilon"] == headline]
            cells.append(cell(hit[0]) if hit else "not run" if (lay["name"], m) in not_run else "–")
        lines.append(
            f"| {lay['name']} | {_pct(lo.get('min'))} / {_pct(lo.get('median'))} / {_pct(lo.get('max'))} | "
            f"{_pct(lay['pooled'], lay['pooled_std'])} | " + " | ".join(cells) + " |"
        )
    if not_run:
        lines += ["", "Not run (each seed's row records why; the first is quoted):", ""]
        lines += [f"* {method} on {layout}: {why}" for (layout, method), why in sorted(not_run.items())]
    for lay in layouts:
        sizes = lay["party_sizes"]
        lines += [
            "",
            f"**{lay['name']}** ({lay['dataset']}, {lay['classes']} classes): {lay['parties']} parties "
            f"({lay['skew']}), {lay['records']} records, party sizes {sizes['min']:.0f}–{sizes['max']:.0f} "
            f"(mean {sizes['mean']:.0f}), holdout {lay['holdout_fraction']}",
            "",
            "| method | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " | seeds | s/run |",
            "|---" * (len(epsilons) + 3) + "|",
        ]
        for m in methods:
            cells_of = {x["epsilon"]: x for x in lay["mechanisms"] if x["name"] == m}
            if not cells_of:
                continue
            row = ["–" if e not in cells_of else cell(cells_of[e]) for e in epsilons]
            any_cell = next(iter(cells_of.values()))
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
        if lay["classes"] != 10 or lay["parties"] < 2:
            continue
        skew = "classes uniform" if lay["skew"] == "uniform" else "classes skewed"
        panels.setdefault(f"{lay['dataset']}, {skew}", []).append(lay)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False, sharey=True)
    methods = [m for m in ROW_METHODS if m not in BASELINES]
    for ax, (title, lays) in zip(axes[0], panels.items(), strict=True):
        x = [lay["examples_per_party"] for lay in lays]
        alone = [lay for lay in lays if lay["alone"]]
        if alone:
            xs = [lay["examples_per_party"] for lay in alone]
            lo = [100 * lay["alone"]["min"] for lay in alone]
            hi = [100 * lay["alone"]["max"] for lay in alone]
            ax.fill_between(xs, lo, hi, color="grey", alpha=0.25, label="each party alone (min–max)")
            ax.plot(
                xs,
                [100 * lay["alone"]["median"] for lay in alone],
                "--",
                color="grey",
                label="party alone, median",
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
    names = sorted(
        {"Fashion-MNIST" if lay["dataset"] == "fashion-mnist" else lay["dataset"] for lay in layouts}
    )
    fig.suptitle(
        f"Worth joining? {', '.join(names)}: alone vs. the federation and what each party keeps "
        f"(δ = {DELTA:g})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def export(path: Path, layouts: list[dict[str, Any]], *, code: str, source: str) -> None:
    """The measurements ``capc federation plan`` predicts from: every layout with the federation's
    mechanisms (:data:`FEDERATION`) and what the parties kept, labelled with the code that measured them
    (central DP-SGD, DP-FedAvg and PATE without public data are references no federation of this engine
    runs)."""
    keep = {*FEDERATION, "kept"}
    table = {
        "source": f"benchmarks/joining.py: {source}",
        "code": code,
        "engine": FEDERATION,
        "layouts": [
            {**lay, "mechanisms": [m for m in lay["mechanisms"] if m["name"] in keep]}
            for lay in layouts
            if lay["alone"]
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
    parser.add_argument("--smoke", action="store_true", help="digits' pixels, two tiny layouts: seconds")
    parser.add_argument("--config", type=Path, help="the DIET-PATE run config (default: the shipped one)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "runs" / "cache")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "joining", help="pipeline runs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", help="output file stem (default: joining, joining-smoke with --smoke)")
    parser.add_argument(
        "--fresh", action="store_true", help="move a CSV of other code aside (to .old) and start again"
    )
    parser.add_argument(
        "--export",
        nargs="?",
        const=EXPORT,
        type=Path,
        metavar="JSON",
        help=f"also write the measurements `capc federation plan` predicts from (default {EXPORT})",
    )
    parser.add_argument(
        "--evaluate-on",
        choices=("test", "validation"),
        default="test",
        help="validation: hold the last training images of each dataset out as the evaluation set "
        f"({', '.join(f'{k} {v}' for k, v in VALIDATION.items())}), for choosing settings",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
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
    suffix = "-validation" if args.evaluate_on == "validation" else ""
    args.name = args.name or ("joining-smoke" if args.smoke else "joining") + suffix
    args.data, args.needs, args.alones, args.labels = {}, {}, {}, {}
    return args


def read_rows(csv_path: Path) -> list[dict[str, Any]]:
    """The CSV's rows (none if it does not exist)."""
    if not csv_path.exists():
        return []
    with csv_path.open() as handle:
        return list(csv.DictReader(handle))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the grid (skipping finished cells) and write the outputs."""
    args = parse(argv)
    started = time.perf_counter()
    args.code = code_hash()
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{args.name}.csv"
    rows = read_rows(csv_path)
    if args.fresh and any(r.get("code") != args.code for r in rows):
        for path in (csv_path, csv_path.with_suffix(".setting.json")):
            if path.exists():
                shutil.move(path, path.with_name(path.name + ".old"))
        log(f"{csv_path}: rows of other code moved to {csv_path.name}.old; starting again")
        rows = []
    check_setting(setting_of(args), csv_path, rows)
    ran = run_grid(args, csv_path, rows)
    code = one_code(rows, what=f"the tables of {csv_path}")
    skipped = [
        {k: r[k] for k in ("layout", "method", "epsilon_target", "seed", "noise")}
        for r in rows
        if r["accuracy"] == "" and r["method"] != "kept"
    ]
    layouts = summarise(args, rows)
    command = " ".join(["python benchmarks/joining.py", *(sys.argv[1:] if argv is None else argv)])
    epsilons = sorted({float(r["epsilon_target"]) for r in rows} - {math.inf})
    write_markdown(layouts, args.out / f"{args.name}.md", epsilons, command, code, skipped)
    plot(layouts, args.out / f"{args.name}.png", 3.0 if 3.0 in epsilons else max(epsilons, default=3.0))
    result = {
        "setting": {
            "split": SPLIT,
            "neighbouring": NEIGHBOURING,
            "delta": DELTA,
            "config": str(args.config),
            "personal": RECIPE.describe(),
            "tuning": TUNING,
            "seed": "keys the layout's share, the party split and each party's holdout; the mechanisms' "
            "noise comes from the operating system's CSPRNG whatever the seed",
        },
        "code": code,
        "layouts": layouts,
        "skipped": skipped,
        "rows": len(rows),
        "ran": ran,
        "seconds": round(time.perf_counter() - started, 1),
        "outputs": [str(args.out / f"{args.name}.{ext}") for ext in ("csv", "md", "png")],
    }
    if args.export:
        export(args.export, layouts, code=code, source=f"{len(rows)} rows, {csv_path.name}")
        result["outputs"].append(str(args.export))
    if args.format == "json":
        print(json.dumps(result, default=float))
    else:
        print((args.out / f"{args.name}.md").read_text())
    return result


if __name__ == "__main__":
    main()
