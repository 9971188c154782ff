"""``capc guardian``: the privacy guardian party."""

from __future__ import annotations

from pathlib import Path

import click

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
def serve(site: Path) -> None:
    """Serve gRPC (mutual TLS) to the parties and the admin REST API until SIGTERM/SIGINT."""
    from capc_services.common.logging import configure_logging
    from capc_services.common.runtime import stop_event_on_signals
    from capc_services.guardian.app import serve as run_guardian
    from capc_services.guardian.settings import GuardianSettings

    settings = GuardianSettings.load(site)
    configure_logging(party=settings.party, level=settings.log_level)
    run_guardian(settings, stop=stop_event_on_signals())
