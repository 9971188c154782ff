"""``capc probe``: an HTTP readiness/liveness check for container healthchecks and exec probes."""

from __future__ import annotations

from pathlib import Path

import click

from capc_cli.output import ca_option
from capc_common.errors import InputError, UnavailableError


@click.command("probe")
@click.argument("url", default="http://127.0.0.1:8080/readyz")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True)
@ca_option()
def command(url: str, timeout: float, ca: Path | None) -> None:
    """Exit 0 if URL answers 200, else 4 (e.g. a party's /readyz or /livez).

    It sends no token and reads only pass or fail, so any host is allowed, and an https:// party's certificate
    is verified only with --ca (as a kubelet's HTTPS probe does not verify)."""
    import ssl

    import httpx

    verify: ssl.SSLContext | bool = False
    if ca is not None:
        try:
            verify = ssl.create_default_context(cafile=str(ca))
        except OSError as exc:  # missing, unreadable or not a certificate (ssl.SSLError)
            raise InputError(f"--ca {ca} is not a readable CA certificate: {exc}") from None
    try:
        response = httpx.get(url, timeout=timeout, verify=verify)
    except httpx.HTTPError as exc:
        raise UnavailableError(f"{url}: {exc}") from None
    if response.status_code != 200:
        raise UnavailableError(f"{url} answered {response.status_code}: {response.text[:500]}")
    click.echo(response.text)
