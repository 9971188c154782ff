"""``capc ca``: the federation's certificate authority."""

from __future__ import annotations

from pathlib import Path

import click

from capc_cli.output import emit, format_option


@click.group("ca")
def command() -> None:
    """Create the federation CA that signs every party's certificate."""


@command.command("init")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
    help="Where ca.crt and ca.key (mode 0600) are written.",
)
@click.option("--name", default="capc", show_default=True, help="Federation name (the CA's common name).")
@click.option("--days", type=click.IntRange(min=1), default=3650, show_default=True, help="Validity in days.")
@format_option
def init(directory: Path, name: str, days: int, fmt: str) -> None:
    """Create a new CA key and self-signed certificate (refuses to overwrite an existing CA)."""
    from capc_services.tls import init_ca

    cert, key = init_ca(directory, name=name, days=days)
    emit({"ca_cert": str(cert), "ca_key": str(key), "days": days}, fmt)
