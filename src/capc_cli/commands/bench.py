"""``capc bench``: measure the throughput of the system's parts (one subcommand per part)."""

from __future__ import annotations

from typing import Any

import click

from capc_cli.output import emit, format_option, progress


@click.group(name="bench")
def command() -> None:
    """Measure throughput; every subcommand prints figures (--format json: one JSON object)."""


def _mpc_text(result: dict[str, Any]) -> str:
    lines = [
        f"noisy argmax, {result['mode']}, c={result['classes']}, B={result['batch']} × {result['batches']} "
        f"batches, w={result['width']} bits: correct={result['correct']}",
        f"  {result['labels_per_s']:,.0f} labels/s   {result['and_gates_per_s'] / 1e6:.2f} M AND gates/s "
        f"({result['and_gates_per_label']} AND/label)",
        f"  {result['bytes_per_label'] / 1024:.1f} KiB/label   peak RSS garbler "
        f"{result['garbler_peak_rss_mb']:.0f} MB, evaluator {result['evaluator_peak_rss_mb']:.0f} MB",
        f"  CPU: garbler {result['garbler_cpu_s']:.2f} s, evaluator {result['evaluator_cpu_s']:.2f} s "
        f"({result['and_gates_per_busy_s'] / 1e6:.2f} M AND/s per busy core; "
        f"load average {result['load_average']:.1f})",
        f"  fixed-key AES on this machine: {result['aes_blocks_per_s'] / 1e6:.0f} M blocks/s",
    ]
    return "\n".join(lines)


@command.command(name="mpc")
@click.option("--classes", type=click.IntRange(min=2), default=10, show_default=True, help="Classes c.")
@click.option("--batch", type=click.IntRange(min=1), default=1024, show_default=True, help="Queries B.")
@click.option("--batches", type=click.IntRange(min=1), default=3, show_default=True, help="Batches timed.")
@click.option(
    "--width", type=click.IntRange(2, 62), default=None, help="Ring width (default: fit the noise)."
)
@click.option("--threshold", is_flag=True, help="Confident-GNMax (threshold test); default plain GNMax.")
@click.option("--teachers", type=click.IntRange(min=1), default=250, show_default=True)
@click.option("--sigma1", type=click.FloatRange(min=0), default=100.0, show_default=True)
@click.option("--sigma2", type=click.FloatRange(min=0), default=40.0, show_default=True)
@click.option("--threshold-value", type=int, default=170, show_default=True, help="Threshold T.")
@click.option("--chunk", type=click.IntRange(min=1), default=None, help="Queries per chunk (memory bound).")
@format_option
def mpc(
    classes: int,
    batch: int,
    batches: int,
    width: int | None,
    threshold: bool,
    teachers: int,
    sigma1: float,
    sigma2: float,
    threshold_value: int,
    chunk: int | None,
    fmt: str,
) -> None:
    """Garbler and evaluator in two processes over a local socket; every label checked against plaintext.

    Reports labels/s, AND gates/s (garble + transfer + evaluate, end to end), bytes per label, each side's
    peak RSS and this machine's fixed-key AES rate measured in the same run.
    """
    from capc_common.mpc.benchmark import run_benchmark

    result = run_benchmark(
        classes=classes,
        batch=batch,
        batches=batches,
        width=width,
        threshold=threshold,
        teachers=teachers,
        sigma1=sigma1,
        sigma2=sigma2,
        threshold_value=threshold_value,
        chunk_queries=chunk,
        progress=lambda it: progress(it, total=batches, desc="mpc batches", unit="batch"),
    )
    emit(result, fmt, _mpc_text)
