"""Synthetic image throughput on ONE core: images/s per generator at 28x28x1 and 32x32x3.

Usage: ``.venv/bin/python benchmarks/synth.py [--format text|json] [--count N] [--repeats R]``.

The process pins itself to one CPU (like ``taskset -c``) and keeps every library single-threaded before
numba loads. Each generator and size is warmed up (compiled or loaded from numba's cache), then timed
``--repeats`` times on ``--count`` images; the figure is the best repeat. ``images_per_s`` divides by the
CPU time this process used, which is what one core delivers when it is ours; on a shared machine the
wall-clock rate is lower by the share other processes took, so text output and the CSV show both, and the
load average. JSON output is exactly ``{"<generator>@<HxWxC>": {"images_per_s": x, "size": "HxWxC"}}``.
The CSV goes to ``benchmarks/results/synth.csv`` (``--csv`` to change).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path
from typing import Any

SIZES = ((28, 28, 1), (32, 32, 3))
DEFAULT_CSV = Path(__file__).resolve().parent / "results" / "synth.csv"


def _pin_one_core() -> int:
    """Restrict this process to the first CPU it may run on, single-threaded; returns that CPU's number.

    Runs before numpy or numba are imported, so their thread pools see one thread.
    """
    for var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def measure(name: str, size: tuple[int, int, int], *, count: int, repeats: int) -> dict[str, Any]:
    """Time ``repeats`` generations of ``count`` images; the best repeat's CPU and wall-clock rates."""
    from capc_common.synth import generate

    height, width, channels = size
    generate(name, seed=0, start=0, count=16, height=height, width=width, channels=channels)  # warm-up
    best_cpu = best_wall = float("inf")
    for r in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        generate(name, seed=r + 1, start=0, count=count, height=height, width=width, channels=channels)
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return {
        "generator": name,
        "size": "x".join(str(d) for d in size),
        "images_per_s": round(count / max(best_cpu, 1e-9), 1),
        "wall_images_per_s": round(count / max(best_wall, 1e-9), 1),
        "count": count,
        "repeats": repeats,
    }


def _table(rows: list[dict[str, Any]], cpu: int, load: float) -> str:
    lines = [
        f"one core (CPU {cpu}), load average {load:.2f}; "
        f"best of {rows[0]['repeats']} x {rows[0]['count']} images",
        "",
        "| generator | size | images/s (CPU time) | images/s (wall clock) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['generator']} | {r['size']} | {r['images_per_s']:,.0f} | {r['wall_images_per_s']:,.0f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a table or one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--count", type=int, default=2000, help="images per timed repeat (default 2000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the best counts (default 3)")
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="where to write the CSV")
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeats < 1:
        parser.error("--count and --repeats must be at least 1")
    cpu = _pin_one_core()
    from capc_common.synth import GENERATOR_NAMES

    rows = [measure(g, s, count=args.count, repeats=args.repeats) for g in GENERATOR_NAMES for s in SIZES]
    load = os.getloadavg()[0]
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*rows[0], "cpu", "load_average"])
        writer.writeheader()
        writer.writerows({**r, "cpu": cpu, "load_average": round(load, 2)} for r in rows)
    if args.format == "json":
        result = {
            f"{r['generator']}@{r['size']}": {"images_per_s": r["images_per_s"], "size": r["size"]}
            for r in rows
        }
        print(json.dumps(result))
    else:
        print(_table(rows, cpu, load))


if __name__ == "__main__":
    main()
