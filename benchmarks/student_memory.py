"""Peak memory of the student while it trains, against the number of labelled queries.

Usage: ``.venv/bin/python benchmarks/student_memory.py --queries 100000 --format json [--chunk-queries N]``.
Prints one object: ``queries``, ``answered``, ``chunk_queries``, ``chunks``, ``peak_rss_mb`` (the student
process's maximum resident set, from ``wait4``), ``train_s``.

A local federation is provisioned (no party started), the student's label store is filled with
``--queries`` labelled queries (labels drawn at random, 60 % answered: memory does not depend on their
values), and the real ``capc student run`` process trains and publishes from it and exits
(``exit_when_done``). ``--chunk-queries`` larger than ``--queries`` holds every query's features at once
(one chunk), as the student did before chunking.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from _force import benchmark_force

from capc_common.federation import batch_plan, usable_queries
from capc_services.local.layout import Layout
from capc_services.local.provision import LocalOptions, provision
from capc_services.student.store import LabelStore


def labelled_student(
    root: Path, *, queries: int, batch_size: int = 256, evaluation: int | None = None
) -> Layout:
    """A provisioned federation whose student store holds ``queries`` labelled queries (nothing started)."""
    options = LocalOptions(
        parties=2,
        teachers_per_party=2,
        epsilon=1000.0,
        queries=queries,
        batch_size=batch_size,
        bn_batch=32,
        threshold=2.0,
        sigma1=60.0,
        sigma2=60.0,
        evaluation_images=evaluation,
        backbone="scatter-28x28x1",
        generator="dead_leaves",
        force=benchmark_force("student memory"),
    )
    layout, config, _ = provision(root, options)
    store = LabelStore(layout.party_dir(config.student) / "labels.sqlite", config_hash=config.config_hash())
    rng = np.random.default_rng(0)  # public: stand-in labels
    first, usable = 0, usable_queries(config)
    while first < usable:
        count = min(batch_size, usable - first)
        plan = batch_plan(config, first_index=first, count=count)
        store.begin(plan.batch_id, first_index=first, count=count)
        labels = np.where(rng.random(count) < 0.6, rng.integers(0, config.classes, count), -1)
        store.complete(plan.batch_id, labels=labels, parties=tuple(config.teacher_names))
        first += count
    store.close()
    return layout


def student_command(layout: Layout) -> list[str]:
    """The command line of the student party (what ``capc local up`` runs)."""
    return [sys.executable, "-m", "capc_cli", "student", "run", "--site", str(layout.site("student"))]


def measure(*, queries: int, chunk_queries: int | None) -> dict[str, Any]:
    """Train the student on ``queries`` labelled queries in a fresh process; its peak memory and time."""
    with tempfile.TemporaryDirectory(prefix="capc-student-memory-") as tmp:
        return _measure(Path(tmp) / "state", queries=queries, chunk_queries=chunk_queries)


def _measure(root: Path, *, queries: int, chunk_queries: int | None) -> dict[str, Any]:
    layout = labelled_student(root, queries=queries)
    env = {**os.environ, "CAPC_EXIT_WHEN_DONE": "true", "CAPC_TORCH_THREADS": "1"}
    if chunk_queries is not None:
        env["CAPC_TRAIN__CHUNK_QUERIES"] = str(chunk_queries)
    start = time.perf_counter()
    proc = subprocess.Popen(student_command(layout), env=env, cwd=layout.root, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    card_path = layout.party_dir("student") / "published" / "model_card.json"
    if status != 0 or not card_path.exists():
        raise click.ClickException(f"the student did not publish (wait status {status}); its log is above")
    card = json.loads(card_path.read_text())
    return {
        "queries": queries,
        "answered": card["queries"]["answered"],
        "chunk_queries": card["training"].get("chunk_queries"),
        "chunks": card["training"].get("chunks"),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "train_s": round(seconds, 1),
    }


@click.command()
@click.option("--queries", type=click.IntRange(min=256), default=100_000, show_default=True)
@click.option(
    "--chunk-queries",
    type=click.IntRange(min=256),
    default=None,
    help="train.chunk_queries of the student [default: the student's own default].",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def main(queries: int, chunk_queries: int | None, fmt: str) -> None:
    """Measure the student's peak memory while it trains on QUERIES labelled queries."""
    result = measure(queries=queries, chunk_queries=chunk_queries)
    if fmt == "json":
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key:<14} {value}")


if __name__ == "__main__":
    main()
