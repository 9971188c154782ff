"""``capc demo`` (the README's `make demo`): a local federation from start to published student."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, format_option


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _text(result: dict[str, Any]) -> str:
    from capc_services.local.demo import budget_line

    budget, student, other = result["budget"], result["student"], result["compared"]
    rec = result["recommendation"]
    lines = [
        f"DIET-CaPC demo: {result['parties']} hospitals, {result['seconds']:.0f} s",
        f"  DIET-CaPC        {result['teachers_per_party']} teachers each; {budget_line(budget)} "
        f"(δ = {budget['delta']:g}, Rényi order {budget['order']:g})",
        f"                   {budget['queries']} queries asked, {budget['answered']} answered; stopped "
        f"because {result['stopped_reason']}",
        f"  secagg-dpsgd     {other['releases']} releases; guaranteed ε {other['epsilon']:.3f} "
        f"({other['seconds']:.0f} s)",
        "",
        "  test accuracy (Fashion-MNIST, first 2,000 test images):",
        f"    DIET-CaPC student      {_percent(student['accuracy'])}  (guaranteed ε {student['epsilon']:g}, "
        f"current BN statistics)  {student['model_card']}",
        f"    secagg-dpsgd student   {_percent(other['accuracy'])}  (guaranteed ε {other['epsilon']:.3f}, "
        f"per-example features)  {other['model_card']}",
    ]
    lines += [
        "",
        "  what each hospital keeps (chosen on its own holdout; alone: linear heads, no CNN from scratch):",
    ]
    for party, figures in result["hospitals"].items():
        row = "  ".join(f"{name} {_percent(figures[name])}" for name in ("alone", "shared", "personalised"))
        lines.append(f"    {party:<12}{row}  -> keeps {figures['kept']}")
    plan = result["plan"]
    low, high = (_percent(end) for end in plan["expected_interval"])
    lines += [
        "",
        f"  use {rec['mechanism']}: {rec['why']}.",
        f"  `capc federation plan` for hospitals of these sizes answers {plan['choice']} (student expected "
        f"{_percent(plan['expected_accuracy'])}, {low}–{high}; {plan['why']})",
    ]
    return "\n".join(lines)


@click.command("demo")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".capc/demo"),
    show_default=True,
    help="Where the demo federation lives (a previous demo there is replaced).",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Leave both federations running (stop them with `capc local down`, the second one's state directory "
    "is STATE_DIR/secagg-dpsgd).",
)
@click.option(
    "--quick",
    is_flag=True,
    help="3 hospitals x 2,000 images (33 teachers each): the protocol in about a minute, a weak student.",
)
@format_option
def command(state_dir: Path, keep: bool, quick: bool, fmt: str) -> None:
    """Bring up a local federation (guardian, student, 3 hospitals), spend the privacy budget, train and
    publish the student, show the budget over REST, and shut everything down."""
    from capc_services.local.demo import (
        DEMO_COMPARE,
        DEMO_OPTIONS,
        QUICK_COMPARE,
        QUICK_OPTIONS,
        run_demo,
    )

    options, compare = (QUICK_OPTIONS, QUICK_COMPARE) if quick else (DEMO_OPTIONS, DEMO_COMPARE)
    result = run_demo(
        state_dir, options=options, compare=compare, keep=keep, say=lambda line: click.echo(line, err=True)
    )
    emit(result, fmt, _text)
