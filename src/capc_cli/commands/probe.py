"""``capc probe``: an HTTP readiness/liveness check for container healthchecks and exec probes."""

from __future__ import annotations

import click

from capc_common.errors import UnavailableError


@click.command("probe")
@click.argument("url", default="http://127.0.0.1:8080/readyz")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True)
def command(url: str, timeout: float) -> None:
    """Exit 0 if URL answers 200, else 4 (e.g. a party's /readyz or /livez)."""
    import httpx

    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise UnavailableError(f"{url}: {exc}") from None
    if response.status_code != 200:
        raise UnavailableError(f"{url} answered {response.status_code}: {response.text[:500]}")
    click.echo(response.text)
