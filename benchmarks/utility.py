"""Utility benchmark: student accuracy against rigorous ε for DIET-PATE (every generator) and PATE without
public data, on Fashion-MNIST.

Grid (the issue's): teachers ∈ {100, 250, 600}, rigorous ε ∈ {1, 2, 3, 4, 6, 10} at δ = 1e-5, seeds {0, 1, 2};
DIET-PATE with each synthetic generator, and the PATE-without-public-data baseline (``pate-scratch``).
Each (method, generator, teachers, seed) is ONE ``capc dietpate run`` of the base config at the largest ε
with ``student.curve_epsilons`` set to the grid: every smaller ε is the run that budget would have made,
replayed through its own Rényi filter (its own planned order), so each point is rigorous on its own and
the teachers, features and votes are computed once. Mechanism parameters given for the base config's
teacher count are rescaled to each teacher count (threshold and σ proportional to the number of teachers,
so the same *fractions* of votes are asked for).

The benchmark is resumable: each finished run appends its rows to ``utility.csv`` and is skipped on the
next start; features, teachers and vote histograms are cached (``--cache-dir``) across runs.

    python benchmarks/utility.py                       # the whole grid (resumable)
    python benchmarks/utility.py --teachers 250 --epsilons 6 --seeds 0 --generators dead_leaves
    python benchmarks/utility.py --format json         # one JSON object: {"runs": n, "table": [...], ...}

Outputs (``--out``, default benchmarks/results): ``utility.csv`` (one row per run and ε), ``utility.md``
(mean ± std over seeds), ``utility.png`` (accuracy against ε, one panel per teacher count, mean ± std over
seeds); each run's report, labels and student go to ``--runs-dir/<run>/`` (default runs/utility).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from capc_common.dietpate import load_config, run
from capc_common.dietpate.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "fashion-mnist-diet-pate.yaml"
GENERATORS = ("gaussian", "dead_leaves", "fractal", "stylegan", "shaders")
FIELDS = (
    "method",
    "generator",
    "teachers",
    "seed",
    "epsilon_target",
    "epsilon",
    "epsilon_data_dependent",
    "order",
    "queries",
    "answered",
    "student_accuracy",
    "mean_teacher_accuracy",
    "best_teacher_accuracy",
    "ensemble_accuracy",
    "run_seconds",
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_key(method: str, generator: str, teachers: int, seed: int) -> str:
    """A run's name: its directory under ``--runs-dir`` and its resume key."""
    return f"{method}-{generator}-t{teachers}-s{seed}"


def run_config(
    base: RunConfig,
    *,
    method: str,
    generator: str,
    teachers: int,
    seed: int,
    epsilons: list[float],
    out: Path,
) -> RunConfig:
    """The base config with one run's overrides (mechanism rescaled to the teacher count)."""
    data = base.model_dump()
    scale = teachers / base.teachers.count
    mech = data["mechanism"]
    for key in ("threshold", "sigma1", "sigma2"):
        if mech.get(key) is not None:
            mech[key] = mech[key] * scale
    data.update(
        method=method,
        seed=seed,
        output=str(out / run_key(method, generator, teachers, seed)),
        plots=False,
    )
    data["teachers"]["count"] = teachers
    data["queries"]["generator"] = generator
    data["budget"]["epsilon"] = max(epsilons)
    data["student"]["curve_epsilons"] = sorted(epsilons)
    return RunConfig.model_validate(data)


def rows_of(
    report: dict[str, Any], *, method: str, generator: str, teachers: int, seed: int, epsilons: list[float]
) -> list[dict[str, Any]]:
    """One CSV row per ε of the grid (empty accuracy where the budget cannot pay for one batch)."""
    points = {c["epsilon_target"]: c for c in report["curve"]}
    rows = []
    for eps in sorted(epsilons):
        point = points.get(eps, {})
        rows.append(
            {
                "method": method,
                "generator": generator,
                "teachers": teachers,
                "seed": seed,
                "epsilon_target": eps,
                "epsilon": point.get("epsilon_spent"),
                "epsilon_data_dependent": point.get("epsilon_data_dependent"),
                "order": point.get("order"),
                "queries": point.get("queries", 0),
                "answered": point.get("answered", 0),
                "student_accuracy": point.get("student_accuracy"),
                "mean_teacher_accuracy": report["mean_teacher_accuracy"],
                "best_teacher_accuracy": report["best_teacher_accuracy"],
                "ensemble_accuracy": report["ensemble_accuracy"],
                "run_seconds": report["seconds"]["total"],
            }
        )
    return rows


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows already in the CSV (the resume state)."""
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def append_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append one finished run's rows (writing the header first if the file is new)."""
    new = not path.is_file()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows({k: row.get(k) for k in FIELDS} for row in rows)


def summarise(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Mean ± std over seeds per (method, generator, teachers, ε target)."""
    groups: dict[tuple[str, str, int, float], list[dict[str, str]]] = {}
    for r in rows:
        key = (r["method"], r["generator"], int(r["teachers"]), float(r["epsilon_target"]))
        groups.setdefault(key, []).append(r)
    table = []
    for (method, generator, teachers, eps), rs in sorted(groups.items()):
        acc = np.array([float(r["student_accuracy"]) for r in rs if r["student_accuracy"]])
        spent = [float(r["epsilon"]) for r in rs if r["epsilon"]]
        table.append(
            {
                "method": method,
                "generator": generator,
                "teachers": teachers,
                "epsilon": eps,
                "seeds": len(rs),
                "student_accuracy": float(acc.mean()) if acc.size else None,
                "student_accuracy_std": float(acc.std()) if acc.size else None,
                "answered": float(np.mean([float(r["answered"]) for r in rs])),
                "mean_teacher_accuracy": float(np.mean([float(r["mean_teacher_accuracy"]) for r in rs])),
                "epsilon_achieved": float(np.mean(spent)) if spent else None,
            }
        )
    return table


def write_table(path: Path, table: list[dict[str, Any]], *, dataset: str, command: str) -> None:
    """Markdown table: one row per (method, generator, teachers), one column per ε."""
    epsilons = sorted({t["epsilon"] for t in table})
    rows: dict[tuple[str, str, int], dict[float, dict[str, Any]]] = {}
    for t in table:
        rows.setdefault((t["method"], t["generator"], t["teachers"]), {})[t["epsilon"]] = t
    lines = [
        f"Student accuracy (%) on the {dataset} test set, mean ± std over the seeds run (n); rigorous "
        f"data-independent ε, δ = 1e-5; – where the budget cannot pay for one batch. Command: `{command}`",
        "",
        "| method | generator | teachers | n | mean teacher | "
        + " | ".join(f"ε = {e:g}" for e in epsilons)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(epsilons),
    ]
    for (method, generator, teachers), cells in sorted(rows.items()):
        teacher = np.mean([c["mean_teacher_accuracy"] for c in cells.values()])
        seeds = max(c["seeds"] for c in cells.values())
        entries = []
        for e in epsilons:
            c = cells.get(e)
            if c is None or c["student_accuracy"] is None:
                entries.append("–")
            else:
                entries.append(f"{100 * c['student_accuracy']:.1f} ± {100 * c['student_accuracy_std']:.1f}")
        lines.append(
            f"| {method} | {generator} | {teachers} | {seeds} | {100 * teacher:.1f} | "
            + " | ".join(entries)
            + " |"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def plot(path: Path, table: list[dict[str, Any]], *, dataset: str) -> None:
    """Accuracy against ε, one panel per teacher count, one line per method/generator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({t["teachers"] for t in table})
    fig, axes = plt.subplots(1, len(counts), figsize=(5.5 * len(counts), 4), squeeze=False)
    for ax, n in zip(axes[0], counts, strict=True):
        lines: dict[str, list[dict[str, Any]]] = {}
        for t in table:
            if t["teachers"] == n and t["student_accuracy"] is not None:
                name = (
                    "PATE, no public data"
                    if t["method"] == "pate-scratch"
                    else f"DIET-PATE, {t['generator']}"
                )
                lines.setdefault(name, []).append(t)
        for name, pts in sorted(lines.items()):
            pts.sort(key=lambda t: t["epsilon"])
            ax.errorbar(
                [t["epsilon"] for t in pts],
                [t["student_accuracy"] for t in pts],
                yerr=[t["student_accuracy_std"] for t in pts],
                marker="o",
                capsize=3,
                label=name,
            )
        ax.set_title(f"{dataset}, {n} teachers")
        ax.set_xlabel("rigorous ε budget (δ = 1e-5)")
        ax.set_ylabel("student test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="base run config")
    parser.add_argument("--teachers", default="100,250,600", help="comma-separated teacher counts")
    parser.add_argument("--epsilons", default="1,2,3,4,6,10", help="comma-separated rigorous ε targets")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (shards, init)")
    parser.add_argument("--generators", default=",".join(GENERATORS), help="DIET-PATE query generators")
    parser.add_argument("--no-baseline", action="store_true", help="skip PATE without public data")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "utility", help="each run's outputs")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "runs" / "cache")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)

    base = load_config(args.config)
    teachers = [int(v) for v in args.teachers.split(",")]
    epsilons = sorted({float(v) for v in args.epsilons.split(",")})
    seeds = [int(v) for v in args.seeds.split(",")]
    generators = [g for g in args.generators.split(",") if g]
    unknown = sorted(set(generators) - set(GENERATORS))
    if unknown:
        parser.error(f"unknown generator(s) {', '.join(unknown)}; choose from {', '.join(GENERATORS)}")
    methods = [("diet-pate", g) for g in generators]
    if not args.no_baseline:
        methods.append(("pate-scratch", base.queries.generator))
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "utility.csv"
    done = {
        run_key(r["method"], r["generator"], int(r["teachers"]), int(r["seed"])) for r in read_rows(csv_path)
    }
    runs = [(n, m, g, s) for n in teachers for m, g in methods for s in seeds]
    todo = [r for r in runs if run_key(r[1], r[2], r[0], r[3]) not in done]
    log(f"{len(runs)} runs, {len(runs) - len(todo)} already done")
    for i, (n, method, generator, seed) in enumerate(todo, 1):
        key = run_key(method, generator, n, seed)
        log(f"[{i}/{len(todo)}] {key}")
        config = run_config(
            base,
            method=method,
            generator=generator,
            teachers=n,
            seed=seed,
            epsilons=epsilons,
            out=args.runs_dir,
        )
        report = run(config, cache_dir=args.cache_dir, log=lambda line: log("    " + line))
        append_rows(
            csv_path,
            rows_of(report, method=method, generator=generator, teachers=n, seed=seed, epsilons=epsilons),
        )
    table = summarise(read_rows(csv_path))
    command = " ".join(["python benchmarks/utility.py", *(argv if argv is not None else sys.argv[1:])])
    write_table(args.out / "utility.md", table, dataset=base.dataset.name, command=command)
    plot(args.out / "utility.png", table, dataset=base.dataset.name)
    files = [str(csv_path), str(args.out / "utility.md"), str(args.out / "utility.png")]
    if args.format == "json":
        print(json.dumps({"runs": len(runs), "ran": len(todo), "table": table, "files": files}))
    else:
        print((args.out / "utility.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
