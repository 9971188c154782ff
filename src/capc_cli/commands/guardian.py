"""``capc guardian``: the privacy guardian party (``serve``), and a membership change recorded on its ledger
(``membership``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from capc_cli.output import ca_option, emit, file_option, format_option

_SITE = click.option(
    "--site",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The guardian's site file (YAML; see docs/federation.md).",
)


@click.group("guardian")
def command() -> None:
    """The privacy guardian: budget ledger, noise and the garbler of the 2PC."""


@command.command("serve")
@_SITE
@click.option(
    "--force",
    metavar="REASON",
    default=None,
    help="Run a federation the pre-spend checks refuse as a judgement (e.g. a party whose heads would all "
    "abstain), stating why; the reason is logged with what it overrode [default: the site file's force].",
)
def serve(site: Path, force: str | None) -> None:
    """Serve gRPC (mutual TLS) to the parties and the admin REST API until SIGTERM/SIGINT."""
    from capc_services.common.logging import configure_logging
    from capc_services.common.runtime import stop_event_on_signals
    from capc_services.guardian.app import serve as run_guardian
    from capc_services.guardian.settings import GuardianSettings

    settings = GuardianSettings.load(site)
    if force is not None:
        settings = settings.model_copy(update={"force": force})
    configure_logging(party=settings.party, level=settings.log_level)
    run_guardian(settings, stop=stop_event_on_signals())


def _membership_text(r: dict[str, Any]) -> str:
    change = "; ".join(f"{verb} {', '.join(r[verb])}" for verb in ("added", "retired") if r[verb])
    released = r["released_batches"]
    note = f" ({released} open batch(es) released: they revealed nothing)" if released else ""
    return "\n".join(
        [
            f"ledger entry {r['entry']}: {change}; config {r['previous_config_hash'][:16]}… -> "
            f"{r['config_hash'][:16]}…; the budget spent so far carries over{note}",
            f"head {r['head']}",
            f"next: {r['next']}",
        ]
    )


@command.command("membership")
@click.option(
    "--url", required=True, help="The guardian's admin API: https://GUARDIAN:8080 (http:// on this machine)."
)
@file_option(
    "--token-file",
    help="The guardian's admin token file (it authorises the change and signs the ledger entry).",
)
@file_option(
    "--federation", help="The new federation.yaml (from `capc federation add-party` or `retire-party`)."
)
@ca_option()
@format_option
def membership(url: str, token_file: Path, federation: Path, ca: Path | None, fmt: str) -> None:
    """Record a membership change on the running guardian's ledger (POST /api/v1/membership).

    The guardian checks that only teacher parties (and the quorum) change, releases the batches reserved
    under the old membership that revealed nothing, appends one hash-chained membership entry authorised by
    the admin token — the budget spent carries over — and stops: start it again with the new file."""
    from capc_common.federation import FederationConfig
    from capc_services.common.settings import load_admin_token
    from capc_services.guardian.membership_client import record_membership

    reply = record_membership(
        url, token=load_admin_token(token_file), config=FederationConfig.load(federation), ca=ca
    )
    emit(reply, fmt, _membership_text)
