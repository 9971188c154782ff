"""The mechanisms and the baselines side by side: test accuracy against ε on the same parties' data.

Every method sees the same parties (``--parties`` disjoint parts of the first ``--train-limit`` training
images, ``iid`` or class-skewed ``imbalanced``, each record placed by a keyed hash of its own content as the
services place a site's records, so every row's ε is for adding or removing one record: ``methods/data.py``),
the same per-example features (the shared backbone with BatchNorm running statistics, each image alone,
L2-normalised), the same test images, the same δ, and is accounted rigorously:

* ``local-only`` — each party's own logistic head (non-private; the number a hospital compares against),
  the mean over parties; one value, shown at every ε;
* ``secagg-dpsgd`` — this engine's secure-aggregation DP-SGD (:class:`~capc_common.mechanisms.SecureDPSGD`):
  clipped per-example gradient sums secret-shared in the ring, exact discrete Gaussian noise. Full batch
  (``sampling_rate`` 1: DP gradient descent), so each round is the discrete Gaussian's own RDP, exactly the
  continuous Gaussian's — no subsampling bound, and none of the floor the general Poisson bound has at
  small ε (docs/mechanisms.md);
* ``central-dpsgd`` — the central baseline on the pooled features: Opacus with Poisson sampling (batch
  1,024) and its RDP accountant (continuous Gaussian, Mironov et al.'s exact subsampled analysis);
* ``dppl`` — DP prototypes (:class:`~capc_common.mechanisms.DPPrototypes`): one noisy release of per-class
  sums and counts, nearest prototype by cosine, zCDP accounting;
* ``dppl-public`` — DPPL-Public (:class:`~capc_common.mechanisms.PublicPrototypes`): no public data, so the
  candidate pool is the first ``queries`` synthetic images (per-example features); per class the exact
  exponential mechanism selects ``per_class`` of them (peeling) by the summed clipped similarity to the
  class's records, the student is the nearest class mean of its selections; ε from the bounded-range bound
  (trusted curator: central only);
* ``dppl-public-votes`` — the same pool and student, selected the way the federation runs it
  (:class:`~capc_common.mechanisms.PublicPrototypeVotes`): every record votes for its nearest candidate,
  one release of the noisy per-class vote counts (discrete Gaussian through real additive sharing, zCDP),
  each class's prototype is its ``per_class`` most-voted candidates weighted by their noisy counts;
* ``prom-pate`` — Prom-PATE (:mod:`capc_common.learn.prompts`, :mod:`capc_common.mechanisms.prompate`):
  each party deals its records to ``teachers_per_party`` teachers by keyed content hash, each a visual
  prompt plus a linear label map trained on the first ``shard`` records of its part alone through the
  frozen backbone (current statistics);
  they vote on dead-leaves queries, Confident-GNMax (T, σ1, σ2 as fractions of the teacher count)
  answers them within the budget, and the library's student learns the answers (on current-statistics
  features, as ``capc dietpate run``'s student: the regime the teachers vote in);
* ``private-knn`` — Private-kNN (:class:`~capc_common.mechanisms.PrivateKNN`) on synthetic (dead-leaves)
  queries, no public data: every party's Poisson-subsampled records vote by k nearest neighbours, GNMax
  labels every query, the student is a linear head on the labelled queries (the library's student);
* ``capc-fair`` / ``capc-greedy`` — CaPC in plaintext (:mod:`capc_common.mechanisms.capc`): a querying
  party's own records are labelled by the other parties' heads through Confident-GNMax and it retrains its
  head on its records plus the answered ones; fair splits the query budget over all parties, greedy gives it
  to one (mean over which); the accounting is the Confident-GNMax object's, all queries charged as answered;
* ``cnn-dpsgd`` — a small CNN end to end on the pooled images (no backbone), Opacus DP-SGD (``_baselines``);
* ``dp-fedavg`` — DP federated averaging of the linear head on Flower, real server and client processes on
  localhost in Flower's own virtual environment (built on first use under ``--cache-dir``: its pins conflict
  with the project's); example-level DP from each client's local DP-SGD steps (``_flower_app``).

Hyper-parameters are fixed in ``methods/common.py`` (``HYPER``); those that were tuned were chosen on a
validation split held out of the training images (``--evaluate-on validation``), never on the test set
(docs/mechanisms.md lists the candidates). That choice is a release of the protected training images that the
reported budgets do not account for (Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential
Privacy"): each row's ε covers one run at fixed settings, not the tuning. Not tuned: Private-kNN's,
Prom-PATE's (teachers, queries, T/σ ratios taken from DIET-PATE), the CNN's (Tramèr & Boneh's clip and
learning rate). The test set is read once per reported figure. Every run records its setting next to its
CSV and refuses to resume a CSV of another setting. Noise multipliers are calibrated to each ε from the
methods' own accountants (δ = 1e-5). Each method family is a module of ``methods/``.

    python benchmarks/mechanisms.py --format json                     # the grid (resumable)
    python benchmarks/mechanisms.py --epsilons 3 --seeds 0 --methods dppl secagg-dpsgd
    python benchmarks/mechanisms.py --dataset digits --train-limit 1400   # seconds: the test's short run

Outputs (``--out``, default benchmarks/results): ``mechanisms.csv`` (one row per method, partition, ε,
seed), ``mechanisms.md`` (mean ± std over seeds), ``mechanisms.png`` (accuracy against ε, one line per
method, one panel per partition). Features are cached in ``--cache-dir``.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from methods import REGISTRY
from methods.common import DELTA, HYPER, TUNING, log
from methods.data import IMBALANCE, NEIGHBOURING, SPLIT, load_features, parties_of

ROOT = Path(__file__).resolve().parents[1]
#: The methods by name, in the order of the table's rows.
BY_NAME = {m.name: m for m in REGISTRY}
METHODS = tuple(BY_NAME)
#: The HYPER groups each method reads: rows merged from another run must agree on these (``--merge``).
USES = {m.name: m.uses for m in REGISTRY}
EPSILONS = (0.5, 1.0, 2.0, 3.0, 6.0, 10.0)
FIELDS = (
    "method",
    "partition",
    "epsilon_target",
    "epsilon",
    "seed",
    "accuracy",
    "released",
    "noise",
    "seconds",
)


# ---------------------------------------------------------------------------------------------- outputs
def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± std of accuracy over seeds for each (method, partition, ε target)."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["partition"], float(r["epsilon_target"])), []).append(r)
    table = []
    for (method, part, eps), rs in sorted(
        groups.items(), key=lambda kv: (kv[0][1], METHODS.index(kv[0][0]), kv[0][2])
    ):
        acc = np.array([float(r["accuracy"]) for r in rs])
        table.append(
            {
                "method": method,
                "partition": part,
                "epsilon_target": eps,
                "seeds": len(rs),
                "accuracy_mean": float(acc.mean()),
                "accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "released": int(rs[0]["released"]),
                "seconds_mean": float(np.mean([float(r["seconds"]) for r in rs])),
                "tuning": TUNING.get(method),
            }
        )
    return table


def write_markdown(table: list[dict[str, Any]], path: Path, epsilons: list[float]) -> None:
    """One table per partition: methods × ε, accuracy mean ± std (%), under the neighbouring relation every
    row's ε is for."""
    lines = [f"Neighbouring datasets: {NEIGHBOURING}; δ = {DELTA:g}.", ""]
    for part in sorted({t["partition"] for t in table}):
        lines += [
            f"**{part}**",
            "",
            "| method | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " | releases | s/run |",
        ]
        lines.append("|---" * (len(epsilons) + 3) + "|")
        for method in METHODS:
            cells = {
                t["epsilon_target"]: t for t in table if t["method"] == method and t["partition"] == part
            }
            if not cells:
                continue
            row = [
                f"{100 * cells[e]['accuracy_mean']:.1f} ± {100 * cells[e]['accuracy_std']:.1f}"
                if e in cells
                else "–"
                for e in epsilons
            ]
            any_cell = next(iter(cells.values()))
            lines.append(
                f"| {method} | "
                + " | ".join(row)
                + f" | {any_cell['released']} | {any_cell['seconds_mean']:.0f} |"
            )
        lines.append("")
    path.write_text("\n".join(lines))


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """Accuracy against ε, one line per method (mean ± std over seeds), one panel per partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = sorted({t["partition"] for t in table})
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.2), squeeze=False, sharey=True)
    for ax, part in zip(axes[0], parts, strict=True):
        for method in METHODS:
            pts = sorted(
                (t for t in table if t["method"] == method and t["partition"] == part),
                key=lambda t: t["epsilon_target"],
            )
            if not pts:
                continue
            e = [t["epsilon_target"] for t in pts]
            m = np.array([100 * t["accuracy_mean"] for t in pts])
            s = np.array([100 * t["accuracy_std"] for t in pts])
            style = "--" if method == "local-only" else "-o"
            colour = plt.get_cmap("tab20")(METHODS.index(method) % 20)  # one colour per method (>10 methods)
            ax.plot(e, m, style, label=method, color=colour)
            ax.fill_between(e, m - s, m + s, alpha=0.2, color=colour)
        ax.set_xscale("log")
        ax.set_xlabel("ε (δ = 1e-5)")
        ax.set_title(f"partition: {part}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def setting_of(args: argparse.Namespace) -> dict[str, Any]:
    """Everything besides (method, partition, ε, seed) that a row's figure depends on."""
    keys = ("dataset", "train_limit", "test_limit", "evaluate_on", "validation", "parties")
    return {**{k: getattr(args, k) for k in keys}, "split": SPLIT, "hyper": HYPER, "tuning": TUNING}


def setting_differences(
    recorded: dict[str, Any],
    current: dict[str, Any],
    methods: set[str],
    uses: Mapping[str, tuple[str, ...]] = USES,
) -> list[str]:
    """What differs between two recorded settings that rows of ``methods`` depend on: every key but the
    hyper-parameters and the tuning, the hyper-parameter groups those methods read (``uses``: this
    benchmark's :data:`USES`, or another benchmark's map of the same kind) and those methods' tuning (a
    setting recorded without one differs)."""
    unknown = sorted(methods - uses.keys())
    if unknown:
        raise SystemExit(f"rows of unknown methods {unknown}: this benchmark runs {sorted(uses)}")
    groups = {g for m in methods for g in uses[m]}
    tuned = current.get("tuning", {})
    return sorted(
        [
            k
            for k in current.keys() | recorded.keys()
            if k not in ("hyper", "tuning") and recorded.get(k) != current.get(k)
        ]
        + [f"hyper.{g}" for g in groups if recorded.get("hyper", {}).get(g) != current["hyper"][g]]
        + [
            f"tuning.{m}"
            for m in methods
            if "tuning" not in recorded or recorded["tuning"].get(m) != tuned.get(m)
        ]
    )


def _values(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """The recorded and current values of the party split when they differ: a setting recorded without one
    split its parties by position and seeded permutation (replace-one only), before the keyed hash."""
    if recorded.get("split") == current["split"]:
        return ""
    was = recorded.get("split", "by position and seeded permutation (no split recorded)")
    return f"; parties split {was}, this run {current['split']}"


def check_setting(args: argparse.Namespace, csv_path: Path) -> None:
    """Refuse to resume a CSV written under another setting (rows are keyed by method, partition, ε and seed
    only, so a validation run or a ``--set`` sweep would otherwise be skipped as done, or its rows mixed with
    the test figures); record the setting next to the CSV. Hyper-parameters of methods the CSV holds no row of
    may differ: no row depends on them.

    Raises:
        SystemExit: the CSV's recorded setting differs from this run's in what its rows depend on.
    """
    path = csv_path.with_suffix(".setting.json")
    current = json.loads(json.dumps(setting_of(args)))
    if path.exists():
        methods: set[str] = set()
        if csv_path.exists():
            with csv_path.open() as handle:
                methods = {r["method"] for r in csv.DictReader(handle)}
        recorded = json.loads(path.read_text())
        changed = setting_differences(recorded, current, methods)
        if changed:
            raise SystemExit(
                f"{csv_path} holds rows of another setting (differs in {changed}"
                f"{_values(recorded, current)}; recorded in {path}): "
                "give this run its own --out or --name"
            )
    elif csv_path.exists() and csv_path.stat().st_size:
        log(f"note: {csv_path} has no recorded setting; recording this run's in {path}")
    path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")


def merge_rows(args: argparse.Namespace, rows: list[dict[str, Any]], sources: list[Path]) -> int:
    """Append the rows of other runs' CSVs (cells not in ``rows`` yet), refusing a run whose recorded setting
    differs from this one in anything its methods depend on: the table gathers runs made at different times
    (one method or seed per command), never rows of another setting.

    Returns:
        How many rows were added to ``rows`` (and to the CSV at ``--out``/``--name``).

    Raises:
        SystemExit: a source has no recorded setting, or one that differs.
    """
    current = json.loads(json.dumps(setting_of(args)))
    done = {(r["method"], r["partition"], float(r["epsilon_target"]), int(r["seed"])) for r in rows}
    added = []
    for source in sources:
        recorded_path = source.with_suffix(".setting.json")
        if not recorded_path.exists():
            raise SystemExit(f"{source} has no recorded setting ({recorded_path}): cannot check what it ran")
        recorded = json.loads(recorded_path.read_text())
        with source.open() as handle:
            incoming = list(csv.DictReader(handle))
        differs = setting_differences(recorded, current, {r["method"] for r in incoming})
        if differs:
            raise SystemExit(
                f"{source} was run under another setting (differs in {differs}{_values(recorded, current)}): "
                "not merged"
            )
        for r in incoming:
            key = (r["method"], r["partition"], float(r["epsilon_target"]), int(r["seed"]))
            if key not in done:
                done.add(key)
                added.append({k: r[k] for k in FIELDS})
    csv_path = args.out / f"{args.name}.csv"
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(added)
    rows.extend(added)
    return len(added)


def report(
    args: argparse.Namespace, rows: list[dict[str, Any]], started: float, *, images: tuple[int, int]
) -> dict[str, Any]:
    """Write the table (MD) and plot (PNG) of every row and return the JSON result; ``images`` are the
    training and evaluation set sizes."""
    # local-only is not private: show its one value at every ε.
    expanded = []
    for r in rows:
        if r["method"] == "local-only":
            expanded += [{**r, "epsilon_target": e} for e in args.epsilons]
        else:
            expanded.append(r)
    table = summarise(expanded)
    write_markdown(table, args.out / f"{args.name}.md", sorted(args.epsilons))
    plot(table, args.out / f"{args.name}.png")
    result = {
        "setting": {
            "dataset": args.dataset,
            "train_images": images[0],
            "evaluation_images": images[1],
            "evaluate_on": args.evaluate_on,
            "parties": args.parties,
            "split": SPLIT,
            "neighbouring": NEIGHBOURING,
            "delta": DELTA,
            "hyper": HYPER,
            "tuning": TUNING,
        },
        "rows": len(rows),
        "table": table,
        "seconds": round(time.perf_counter() - started, 1),
        "outputs": [str(args.out / f"{args.name}.{ext}") for ext in ("csv", "md", "png")],
    }
    if args.format == "json":
        print(json.dumps(result, default=float))
    else:
        print((args.out / f"{args.name}.md").read_text())
    return result


def _typed(current: Any, value: str, *, name: str, error: Callable[[str], Any]) -> Any:
    """``--set``'s text as the type of the value it replaces; a boolean only from true or false
    (``bool("False")`` is True)."""
    if isinstance(current, bool):
        if value.lower() not in ("true", "false"):
            error(f"{name} is true or false, not {value!r}")
        return value.lower() == "true"
    return type(current)(value)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the grid (skipping rows already in the CSV) and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--partitions", nargs="+", choices=tuple(IMBALANCE), default=list(IMBALANCE))
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--dataset", choices=("fashion-mnist", "digits"), default="fashion-mnist")
    parser.add_argument("--train-limit", type=int, default=20_000)
    parser.add_argument("--test-limit", type=int, default=4_000)
    parser.add_argument("--evaluate-on", choices=("test", "validation"), default="test")
    parser.add_argument("--validation", type=int, default=2_000)
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "runs" / "cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="mechanisms", help="output file stem")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="GROUP.KEY=VALUE",
        help="override a hyper-parameter (validation sweeps only), e.g. dpsgd.learning_rate=0.5",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=[],
        metavar="CSV",
        help="run nothing: add these runs' rows (same setting) to --out/--name and redraw its table and plot",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    for item in args.set:
        name, _, value = item.partition("=")
        group, _, key = name.partition(".")
        if group not in HYPER or key not in HYPER[group]:
            parser.error(f"unknown hyper-parameter {name!r}; known: {sorted(HYPER)} with their keys")
        HYPER[group][key] = _typed(HYPER[group][key], value, name=name, error=parser.error)

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{args.name}.csv"
    check_setting(args, csv_path)
    rows: list[dict[str, Any]] = []
    if csv_path.exists():
        with csv_path.open() as handle:
            rows = list(csv.DictReader(handle))
    started = time.perf_counter()
    if args.merge:
        log(f"merged {merge_rows(args, rows, args.merge)} rows into {csv_path}")
        validation = args.evaluate_on == "validation"
        images = (
            args.train_limit - (args.validation if validation else 0),
            args.validation if validation else args.test_limit,
        )
        return report(args, rows, started, images=images)
    done = {(r["method"], r["partition"], float(r["epsilon_target"]), int(r["seed"])) for r in rows}
    tx, ty, images, ex, ey = load_features(args)
    log(f"features: train {tx.shape}, evaluation {ex.shape} ({args.evaluate_on})")
    needs = {m: BY_NAME[m].needs(args) for m in args.methods}
    for part in args.partitions:
        for seed in args.seeds:
            parties = parties_of(tx, ty, images, scheme=part, parties=args.parties, seed=seed)
            for method in args.methods:
                targets = [max(args.epsilons)] if method == "local-only" else args.epsilons
                for eps in targets:
                    key = (method, part, float(eps), seed)
                    if key in done:
                        continue
                    t0 = time.perf_counter()
                    out = BY_NAME[method].run(parties, ex, ey, epsilon=eps, seed=seed, **needs[method])
                    row = {
                        "method": method,
                        "partition": part,
                        "epsilon_target": eps,
                        "seed": seed,
                        **out,
                        "seconds": round(time.perf_counter() - t0, 2),
                    }
                    log(
                        f"{method:14s} {part:10s} ε {eps:<5g} seed {seed}: accuracy {out['accuracy']:.4f} "
                        f"({row['seconds']} s, {out['noise']})"
                    )
                    rows.append(row)
                    new = not csv_path.exists()
                    with csv_path.open("a", newline="") as handle:
                        writer = csv.DictWriter(handle, fieldnames=FIELDS)
                        if new:
                            writer.writeheader()
                        writer.writerow({k: row[k] for k in FIELDS})
    return report(args, rows, started, images=(len(ty), len(ey)))


if __name__ == "__main__":
    main()
