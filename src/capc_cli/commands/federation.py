"""``capc federation plan``: size a federation from its data before writing federation.yaml."""

from __future__ import annotations

from typing import Any

import click

from capc_cli.output import emit, format_option


def _text(r: dict[str, Any]) -> str:
    m, q, e = r["mechanism"], r["queries"], r["expected"]
    lines = [
        f"{r['teachers']} teachers: {', '.join(str(h) for h in r['heads'])} heads per party "
        f"(each shard ≥ one BatchNorm chunk of {q['bn_batch']} with 99.9 % probability per party)",
        f"mechanism: threshold {m['threshold']:g}, sigma1 {m['sigma1']:g}, sigma2 {m['sigma2']:g}",
        f"budget: ε {r['budget']['epsilon']:g}, δ {r['budget']['delta']:g}, "
        f"ledger order {r['budget']['order']:g}",
        f"queries: total {q['total']}, batch_size {q['batch_size']}, bn_batch {q['bn_batch']}",
        f"expected: about {e['queries']} queries screened, {e['answered']} answered "
        f"(at an answer rate of {e['answer_rate']:g})",
    ]
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)


@click.group(name="federation")
def command() -> None:
    """Plan a federation before it is created."""


@command.command(name="plan")
@click.option(
    "--examples",
    type=click.IntRange(min=1),
    multiple=True,
    required=True,
    help="Labelled images of one teacher party (repeat once per party).",
)
@click.option("--classes", type=click.IntRange(min=2), required=True, help="Number of classes.")
@click.option("--epsilon", type=click.FloatRange(min=0, min_open=True), required=True, help="Budget ε.")
@click.option(
    "--delta", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=1e-5, show_default=True
)
@click.option(
    "--bn-batch", type=click.IntRange(min=16), default=64, show_default=True, help="BatchNorm chunk."
)
@click.option(
    "--batch-size", type=click.IntRange(min=16), default=512, show_default=True, help="Largest batch."
)
@format_option
def plan_command(
    examples: tuple[int, ...],
    classes: int,
    epsilon: float,
    delta: float,
    bn_batch: int,
    batch_size: int,
    fmt: str,
) -> None:
    """Teachers per party, Confident-GNMax parameters, batches and expected answers for the data at hand."""
    from capc_common.federation import propose

    result = propose(
        list(examples),
        classes=classes,
        epsilon=epsilon,
        delta=delta,
        bn_batch=bn_batch,
        batch_size=batch_size,
    )
    emit(result, fmt, _text)
