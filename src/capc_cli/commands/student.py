"""``capc student``: the student party."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("student")
def command() -> None:
    """The student: schedules query batches, evaluates the 2PC, trains and publishes the student model."""


@command.command("run")
@click.option(
    "--site",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The student's site file (YAML; see docs/federation.md).",
)
def run(site: Path) -> None:
    """Label queries with the federation, then train and publish; serves until SIGTERM/SIGINT
    (or exits after publishing with exit_when_done: true)."""
    from capc_services.common.logging import configure_logging
    from capc_services.common.runtime import stop_event_on_signals
    from capc_services.student.app import run as run_student
    from capc_services.student.settings import StudentSettings

    settings = StudentSettings.load(site)
    configure_logging(party=settings.party, level=settings.log_level)
    run_student(settings, stop=stop_event_on_signals())
