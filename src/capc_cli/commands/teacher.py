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
    help="Set up a new site first (containers): when the heads file does not exist, train the heads from "
    "the site's data and, if there is none yet, create the cap record. Never creates a record next to "
    "existing heads. A federation of a release mechanism (secagg-dpsgd, dppl) has no heads: the record is "
    "created when the site's state volume holds none.",
)
def serve(site: Path, train_missing: bool) -> None:
    """Dial the student and the guardian (no inbound port) and answer work until SIGTERM/SIGINT."""
    from capc_common.federation.config import ReleaseMember
    from capc_services.common.logging import configure_logging
    from capc_services.common.runtime import stop_event_on_signals
    from capc_services.teacher.app import serve as run_teacher
    from capc_services.teacher.cap import LocalCap
    from capc_services.teacher.settings import TeacherSettings
    from capc_services.teacher.train import train_party_heads

    settings = TeacherSettings.load(site)
    configure_logging(party=settings.party, level=settings.log_level)
    stop = stop_event_on_signals()
    config = settings.federation_config
    if train_missing and isinstance(config.mechanism, ReleaseMember):
        if not settings.cap.record.exists():  # the contributions are computed per release: nothing to train
            LocalCap.init(settings.cap.record, config=config)
    elif train_missing and not settings.heads.exists():
        train_party_heads(settings)
        if not settings.cap.record.exists():
            LocalCap.init(settings.cap.record, config=config)
    run_teacher(settings, stop=stop)


@command.command("init-cap")
@_SITE
@format_option
def init_cap(site: Path, fmt: str) -> None:
    """Create this party's local ε cap record (once, when the site is set up; `serve` refuses without it)."""
    from capc_services.teacher.cap import LocalCap
    from capc_services.teacher.settings import TeacherSettings

    settings = TeacherSettings.load(site)
    record = LocalCap.init(settings.cap.record, config=settings.federation_config)
    emit({"record": str(record), "epsilon_cap": settings.cap.epsilon}, fmt)


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


@command.command("personalise")
@_SITE
@click.option(
    "--student",
    type=click.Path(path_type=Path),
    default=None,
    help="The published student: student.safetensors (a selection mechanism's), head.npy with its "
    "model_card.json beside it (a release mechanism's), or the directory holding it [default: the output of "
    "the student whose site file lies beside this one, as in a `capc local` federation].",
)
@click.option(
    "--evaluate",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A labelled .npz of the site's (test_images/test_labels, or images/labels) to score the three "
    "models on as well.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the kept model and its card go [default: personal/ next to the heads file].",
)
@click.option(
    "--no-cnn",
    is_flag=True,
    help="Leave the CNN from scratch out of the models alone (the linear heads only: faster).",
)
@format_option
def personalise(
    site: Path, student: Path | None, evaluate: Path | None, out: Path | None, no_cnn: bool, fmt: str
) -> None:
    """After the federation published: compare on the site's holdout its best model alone, the shared
    student and the student fine-tuned on its own data, and keep the best (nothing leaves the site)."""
    from capc_services.teacher.personal import personalise_site, report_text

    report = personalise_site(
        site,
        student=student,
        evaluate=evaluate,
        out=out,
        cnn=not no_cnn,
        log=lambda line: click.echo(line, err=True),
    )
    emit(report, fmt, report_text)
