"""``capc demo`` (the README's `make demo`): a local federation from start to published student."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, format_option


def _text(result: dict[str, Any]) -> str:
    from capc_services.local.demo import budget_line

    budget, student = result["budget"], result["student"]
    accuracy = "n/a" if student["accuracy"] is None else f"{100 * student['accuracy']:.1f} %"
    return "\n".join(
        [
            f"DIET-CaPC demo: {result['parties']} teacher parties × {result['teachers_per_party']} teachers, "
            f"{result['seconds']:.0f} s",
            f"  privacy budget   {budget_line(budget)} "
            f"(δ = {budget['delta']:g}, Rényi order {budget['order']:g})",
            f"  queries          {budget['queries']} asked, {budget['answered']} answered",
            f"  stopped because  {result['stopped_reason']}",
            f"  student          {student['model']}",
            f"  model card       {student['model_card']}",
            f"  test accuracy    {accuracy} (Fashion-MNIST, 2,000 test images, current BN statistics)",
        ]
    )


@click.command("demo")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".capc/demo"),
    show_default=True,
    help="Where the demo federation lives (a previous demo there is replaced).",
)
@click.option("--keep", is_flag=True, help="Leave the federation running (stop it with `capc local down`).")
@click.option(
    "--quick",
    is_flag=True,
    help="3 hospitals x 2,000 images (33 teachers each): the protocol in about a minute, a weak student.",
)
@format_option
def command(state_dir: Path, keep: bool, quick: bool, fmt: str) -> None:
    """Bring up a local federation (guardian, student, 3 hospitals), spend the privacy budget, train and
    publish the student, show the budget over REST, and shut everything down."""
    from capc_services.local.demo import DEMO_OPTIONS, QUICK_OPTIONS, run_demo

    options = QUICK_OPTIONS if quick else DEMO_OPTIONS
    result = run_demo(state_dir, options=options, keep=keep, say=lambda line: click.echo(line, err=True))
    emit(result, fmt, _text)
