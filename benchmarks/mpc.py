"""The MPC benchmark table: `capc bench mpc` for c ∈ {2, 10, 100} × B ∈ {64, 1024, 8192}, Confident-GNMax.

Usage: ``.venv/bin/python benchmarks/mpc.py [--format text|json]``. Text output is the Markdown table of
docs/mpc.md; JSON output is one object ``{"rows": [...]}`` with every figure of every run. Each cell is one
``run_benchmark`` call: garbler and evaluator in two processes over a Unix socket, every label checked. Every
figure of every cell also goes to ``benchmarks/results/mpc.csv`` (``--csv`` to change).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import click

from capc_common.mpc.benchmark import run_benchmark

CLASSES = (2, 10, 100)
BATCHES = (64, 1024, 8192)
DEFAULT_CSV = Path(__file__).resolve().parent / "results" / "mpc.csv"


def _batches_for(batch: int, queries: int) -> int:
    """Enough batches that every cell times at least ``queries`` queries (but at least 2 batches)."""
    return max(2, queries // batch)


def _table(rows: list[dict]) -> str:
    lines = [
        "| c | B | labels/s | M AND/s | M AND/s per busy core | AND/label | KiB/label "
        "| RSS garbler / evaluator (MB) | load | correct |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate, busy = r["and_gates_per_s"] / 1e6, r["and_gates_per_busy_s"] / 1e6
        lines.append(
            f"| {r['classes']} | {r['batch']} | {r['labels_per_s']:,.0f} | {rate:.2f} | {busy:.2f} | "
            f"{r['and_gates_per_label']} | {r['bytes_per_label'] / 1024:.1f} | "
            f"{r['garbler_peak_rss_mb']:.0f} / {r['evaluator_peak_rss_mb']:.0f} | {r['load_average']:.1f} "
            f"| {r['correct']} |"
        )
    aes = max(r["aes_blocks_per_s"] for r in rows)
    lines.append(f"\nHighest fixed-key AES rate measured during these runs: {aes / 1e6:.0f} M blocks/s.")
    return "\n".join(lines)


def _write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@click.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--classes", "classes", type=int, multiple=True, help="Subset of classes to run.")
@click.option("--batch", "batches", type=int, multiple=True, help="Subset of batch sizes to run.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_CSV)
@click.option(
    "--queries", type=click.IntRange(min=1), default=8192, show_default=True, help="Queries timed per cell."
)
def main(fmt: str, classes: tuple[int, ...], batches: tuple[int, ...], csv_path: Path, queries: int) -> None:
    """Run the grid and print the table (text) or one JSON object (json)."""
    rows = []
    for c in classes or CLASSES:
        for b in batches or BATCHES:
            rows.append(run_benchmark(classes=c, batch=b, batches=_batches_for(b, queries), threshold=True))
            click.echo(f"c={c} B={b}: {rows[-1]['labels_per_s']:,.0f} labels/s", err=True)
    _write_csv(rows, csv_path)
    if fmt == "json":
        click.echo(json.dumps({"rows": rows}))
    else:
        click.echo(_table(rows))
    if not all(r["correct"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
