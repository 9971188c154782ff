"""``capc dietpate``: the central (single-machine) DIET-PATE pipeline and its PATE baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, format_option


@click.group(name="dietpate")
def command() -> None:
    """Central DIET-PATE: teachers, private aggregation and the student on one machine."""


def _text(report: dict[str, Any]) -> str:
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.2f} %"

    dd = report["epsilon_data_dependent"]
    lines = [
        f"run                  {report['name']} ({report['method']}, {report['teachers']} teachers)",
        f"student accuracy     {pct(report['student_accuracy'])} on {report['evaluated_on']}",
        f"teachers             mean {pct(report['mean_teacher_accuracy'])}, best "
        f"{pct(report['best_teacher_accuracy'])}, noiseless ensemble {pct(report['ensemble_accuracy'])} "
        "(NOT PRIVATE: research figures)",
        f"queries              {report['queries']} asked, {report['answered']} answered "
        f"({report['stop_reason']})",
        f"privacy              ε = {report['epsilon']:g} at δ = {report['delta']:g} (the guarantee: the "
        "Rényi filter's limit)",
        f"                     ε spent {report['epsilon_spent']:.4f} (data-independent charges; an odometer, "
        "not a guarantee)",
        f"                     ε = {'n/a' if dd is None else f'{dd:.4f}'} data-dependent (UNSANITISED, for "
        "comparison only)",
        f"noise                {report['noise']}",
        "seconds              " + ", ".join(f"{k} {v:.1f}" for k, v in report["seconds"].items()),
        "files                " + "\n                     ".join(report["files"]),
    ]
    return "\n".join(lines)


@command.command(name="run")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="run.yaml (see configs/).",
)
@click.option(
    "--epsilon",
    type=float,
    default=None,
    help="Override budget.epsilon (the guarantee: the Rényi filter's limit, at which the run stops).",
)
@click.option("--teachers", type=int, default=None, help="Override teachers.count.")
@click.option(
    "--seed", type=int, default=None, help="Override the run seed (shards, splits, initialisation)."
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Override the output directory.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Reuse features across runs (content-addressed .npy files).",
)
@click.option(
    "--diagnostics",
    is_flag=True,
    default=False,
    help="Also report figures of the noiseless votes (label agreement with the plurality, the teachers' "
    "consensus and its plot), marked NOT PRIVATE: research only, never publish them.",
)
@format_option
def run_command(
    config_path: Path,
    epsilon: float | None,
    teachers: int | None,
    seed: int | None,
    output: Path | None,
    cache_dir: Path | None,
    diagnostics: bool,
    fmt: str,
) -> None:
    """Run the whole pipeline: shards, teachers, private labels for synthetic queries, the student.

    Writes report.json, the student (student.safetensors + model card) and plots into the output
    directory; the JSON report is also printed with --format json.
    """
    from capc_common.dietpate import load_config, run

    config = load_config(config_path).with_overrides(
        epsilon=epsilon,
        teachers=teachers,
        seed=seed,
        output=None if output is None else str(output),
        diagnostics=diagnostics or None,
    )
    report = run(config, cache_dir=cache_dir, progress=True, log=lambda line: click.echo(line, err=True))
    emit(report, fmt, _text)
