"""``capc teacher``: a teacher party (an organisation with private labelled data)."""

from __future__ import annotations

from pathlib import Path

import click

from capc_cli.output import emit, format_option

_SITE = click.option(
    "--site",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The party's site file (YAML; see docs/federation.md).",
)


@click.group("teacher")
def command() -> None:
    """A teacher party: trains its heads on its own data and answers synthetic queries."""


@command.command("serve")
@_SITE
@click.option(
    "--train-missing",
    is_flag=True,
    help="Train the heads from the site's data first if the heads file does not exist (containers).",
)
def serve(site: Path, train_missing: bool) -> None:
    """Dial the student and the guardian (no inbound port) and answer work until SIGTERM/SIGINT."""
    from capc_services.common.logging import configure_logging
    from capc_services.common.runtime import stop_event_on_signals
    from capc_services.teacher.app import serve as run_teacher
    from capc_services.teacher.settings import TeacherSettings
    from capc_services.teacher.train import train_party_heads

    settings = TeacherSettings.load(site)
    configure_logging(party=settings.party, level=settings.log_level)
    stop = stop_event_on_signals()
    if train_missing and not settings.heads.exists():
        train_party_heads(settings)
    run_teacher(settings, stop=stop)


@command.command("train")
@_SITE
@format_option
def train(site: Path, fmt: str) -> None:
    """Train this party's teacher heads on the site's own data (its `data:` section) and save them."""
    from capc_services.teacher.settings import TeacherSettings
    from capc_services.teacher.train import train_party_heads

    settings = TeacherSettings.load(site)
    emit(train_party_heads(settings), fmt)


@command.command("preflight")
@_SITE
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the PNG grid of the site's images goes [default: preflight/ next to the heads file].",
)
@click.option(
    "--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds per peer."
)
@format_option
def preflight(site: Path, out_dir: Path | None, timeout: float, fmt: str) -> None:
    """Before going live: certificate, key, admin token, backbone, data, heads, guardian and student over
    mTLS, and the local ε cap against the federation's plan. Exit 2 if any check failed; each failure
    says how to fix it."""
    from capc_common.errors import InputError
    from capc_services.teacher.preflight import run_preflight

    report = run_preflight(site, out_dir=out_dir, timeout=timeout)
    emit(report.to_dict(), fmt, lambda _: report.text())
    if not report.ok:
        raise InputError(f"preflight: {len(report.failed)} check(s) failed: {', '.join(report.failed)}")
