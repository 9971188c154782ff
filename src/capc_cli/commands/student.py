"""``capc student``: the student party."""

from __future__ import annotations

import sys
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
    (or exits after publishing with exit_when_done: true; a non-zero exit code if it failed instead)."""
    from capc_services.common.logging import configure_logging
    from capc_services.common.runtime import stop_event_on_signals
    from capc_services.student.app import run as run_student
    from capc_services.student.settings import StudentSettings

    settings = StudentSettings.load(site)
    configure_logging(party=settings.party, level=settings.log_level)
    failure = run_student(settings, stop=stop_event_on_signals())
    if failure is not None and settings.exit_when_done:
        # A one-shot job (a Kubernetes Job, a compose service whose exit is awaited) must not report success
        # for a student that never published; a serving student's exit after SIGTERM stays 0.
        click.echo(
            f"error: the student failed: {failure.reason} (what it has done is kept: fix the cause and start "
            "it again to finish)",
            err=True,
        )
        sys.exit(failure.exit_code)
