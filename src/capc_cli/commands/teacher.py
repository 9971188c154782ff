"""``capc teacher``: a teacher party (an organisation with private labelled data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    "the site's data and create whichever of the cap record and the site ledger (`lifetime:`) does not exist "
    "yet. Never creates a record next to existing heads. A federation of a release mechanism (secagg-dpsgd, "
    "dppl) has no heads: the records are set up when the site's state volume holds no cap record.",
)
def serve(site: Path, train_missing: bool) -> None:
    """Dial the student and the guardian (no inbound port) and answer work until SIGTERM/SIGINT.

    Refuses to start (exit 3) when the federation's plan does not fit what is left of the hospital's
    lifetime budget (`lifetime:` in the site file; `capc teacher budget` shows it)."""
    from capc_common.federation.config import ReleaseMember
    from capc_services.common.logging import configure_logging
    from capc_services.common.runtime import stop_event_on_signals
    from capc_services.teacher.app import serve as run_teacher
    from capc_services.teacher.settings import TeacherSettings
    from capc_services.teacher.train import train_party_heads

    settings = TeacherSettings.load(site)
    configure_logging(party=settings.party, level=settings.log_level)
    stop = stop_event_on_signals()
    set_up = False
    if train_missing and isinstance(settings.federation_config.mechanism, ReleaseMember):
        set_up = not settings.cap.record.exists()  # contributions are computed per release: nothing to train
    elif train_missing and not settings.heads.exists():
        train_party_heads(settings)
        set_up = True
    run_teacher(settings, stop=stop, set_up=set_up)


@command.command("init-cap")
@_SITE
@format_option
def init_cap(site: Path, fmt: str) -> None:
    """Create this party's local ε cap record and, with `lifetime:` in the site file, the hospital's site
    ledger — whichever does not exist yet (once, when the site is set up or joins a federation; `serve`
    refuses without them). A site ledger added beside an existing cap record counts that record in when the
    teacher next starts."""
    from capc_services.teacher.records import create_missing_records
    from capc_services.teacher.settings import TeacherSettings

    settings = TeacherSettings.load(site)
    created = create_missing_records(settings, _exposure(settings))
    emit({**created, "epsilon_cap": settings.cap.epsilon}, fmt)


def _exposure(settings: Any) -> Any:
    """What the site's federation charges it (a release federation's protocol is built for it)."""
    from capc_common.federation import ReleaseMember, check_runnable, exposure_of

    config = settings.federation_config
    protocol = None
    if isinstance(config.mechanism, ReleaseMember):
        protocol = check_runnable(config, model=False).protocol
    return exposure_of(config, protocol=protocol)


@command.command("budget")
@_SITE
@click.option(
    "--close",
    "close_reason",
    metavar="REASON",
    default=None,
    help="Record that this site file's federation is over (e.g. 'published 2026-12-01'): its unspent "
    "reservation returns to the lifetime budget; a later start of its teacher reserves again.",
)
@format_option
def budget(site: Path, close_reason: str | None, fmt: str) -> None:
    """The hospital's lifetime budget: what each federation charged on its records and reserved, the total,
    and what is left (the site ledger named by `lifetime:` in the site file)."""
    from capc_common.errors import InputError
    from capc_services.teacher.settings import TeacherSettings
    from capc_services.teacher.site_ledger import SiteLedger

    settings = TeacherSettings.load(site)
    life = settings.lifetime
    if life is None:
        raise InputError(
            f"{site} sets no lifetime budget: add `lifetime: {{epsilon: E, ledger: PATH}}` (the same ledger "
            "in every site file of this hospital) and create it with `capc teacher init-cap --site FILE`"
        )
    if close_reason is not None:
        ledger = SiteLedger(life.ledger, epsilon=life.epsilon, delta=life.delta, order=life.order)
        report = ledger.close_federation(settings.federation_config, reason=close_reason)
    else:
        view = SiteLedger(
            life.ledger, epsilon=life.epsilon, delta=life.delta, order=life.order, writable=False
        )
        report = view.report()
    emit(report, fmt, _budget_text)


def _budget_text(r: dict[str, Any]) -> str:
    limit, total = r["limit"], r["total"]
    lines = [
        f"site ledger {r['ledger']}: lifetime limit ε {limit['epsilon']:g} at δ {limit['delta']:g}, "
        f"order {limit['order']:g} (RDP {limit['budget_rdp']:.6g}; {r['neighbouring']} neighbours; δ with "
        f"the noise samplers {limit['delta_total']:.3g})"
    ]
    if r["site_file_limit"] != limit["epsilon"]:
        lines.append(f"  the site file sets ε {r['site_file_limit']:g}: recorded at its teacher's next start")
    for f in r["federations"]:
        state = "closed" if f["closed"] else f"reserves RDP {f['reserved_rdp']:.6g}"
        lines.append(
            f"  {f['name']:<20} spent ε {f['spent_epsilon']:.3g} (RDP {f['spent_rdp']:.6g}, {f['charges']} "
            f"charges); plan ε {f['planned_epsilon']:.3g}; {state}"
        )
    lines.append(
        f"  total: spent ε {total['spent_epsilon']:.3g} (RDP {total['spent_rdp']:.6g}); spent or reserved "
        f"ε {total['reserved_epsilon']:.3g}; left RDP {total['remaining_rdp']:.6g}"
    )
    return "\n".join(lines)


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
@click.option(
    "--force",
    metavar="REASON",
    default=None,
    help="This hospital means its cap to stop it part-way through the federation's plan, for REASON: the "
    "local_cap check then warns instead of failing.",
)
@format_option
def preflight(site: Path, out_dir: Path | None, timeout: float, force: str | None, fmt: str) -> None:
    """Before going live: certificate, key, admin token, backbone, data, heads, guardian and student over
    mTLS, the local ε cap against the federation's plan (and why it exceeds the federation's ε), and the
    hospital's lifetime budget. Exit 2 if any check failed; each failure says how to fix it."""
    from capc_common.errors import InputError
    from capc_services.teacher.preflight import run_preflight

    report = run_preflight(site, out_dir=out_dir, timeout=timeout, force=force)
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
