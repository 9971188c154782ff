"""``capc cert``: party certificates signed by the federation CA."""

from __future__ import annotations

from pathlib import Path

import click

from capc_cli.output import emit, format_option


@click.group("cert")
def command() -> None:
    """Issue and inspect party certificates (CN = party name)."""


@command.command("issue")
@click.argument("party")
@click.option(
    "--ca-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
    help="Directory holding ca.crt and ca.key.",
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where PARTY.crt and PARTY.key (0600) go [default: the CA directory].",
)
@click.option("--dns", "dns_names", multiple=True, help="Extra DNS SAN (repeatable); 'localhost' if none.")
@click.option("--ip", "ips", multiple=True, help="IP SAN (repeatable); 127.0.0.1 if none.")
@click.option("--days", type=click.IntRange(min=1), default=365, show_default=True, help="Validity in days.")
@format_option
def issue(
    party: str,
    ca_dir: Path,
    out_dir: Path | None,
    dns_names: tuple[str, ...],
    ips: tuple[str, ...],
    days: int,
    fmt: str,
) -> None:
    """Generate PARTY's key pair and a certificate for it (client and server use; party name is a SAN)."""
    from capc_services.tls import issue_certificate

    issued = issue_certificate(
        ca_dir,
        party,
        out_dir=out_dir or ca_dir,
        dns_names=dns_names or ("localhost",),
        ip_addresses=ips or ("127.0.0.1",),
        days=days,
    )
    emit(
        {
            "party": issued.party,
            "cert": str(issued.cert),
            "key": str(issued.key),
            "not_after": issued.not_after.isoformat(),
            "dns_names": list(issued.dns_names),
            "ip_addresses": list(issued.ip_addresses),
        },
        fmt,
    )


@command.command("show")
@click.argument("cert", type=click.Path(dir_okay=False, path_type=Path))
@format_option
def show(cert: Path, fmt: str) -> None:
    """Print a certificate's CN and when it expires."""
    from capc_services.tls import certificate_info

    info = certificate_info(cert)
    left = info.seconds_left()
    emit(
        {
            "common_name": info.common_name,
            "not_after": info.not_after.isoformat(),
            "expires_in_days": round(left / 86400, 2),
            "expired": left <= 0,
        },
        fmt,
    )


@command.command("bootstrap")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Holds the CA and every party's certificate and key.",
)
@click.option("--name", default="capc", show_default=True, help="Federation name (CA common name).")
@click.option("--party", "parties", multiple=True, required=True, help="A party to certify (repeatable).")
@click.option("--dns", "dns_names", multiple=True, help="Extra DNS SAN for every party (repeatable).")
@click.option(
    "--admin-token",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a fresh admin bearer token here (mode 0600) if none exists.",
)
@format_option
def bootstrap(
    directory: Path,
    name: str,
    parties: tuple[str, ...],
    dns_names: tuple[str, ...],
    admin_token: Path | None,
    fmt: str,
) -> None:
    """Idempotent one-shot provisioning (e.g. a compose job): create the CA if missing, then a certificate
    for each party that has none. Each party's name is a DNS SAN, so containers named after their party
    verify each other by name."""
    from capc_services.tls import bootstrap as provision

    emit(provision(directory, name=name, parties=parties, dns_names=dns_names, admin_token=admin_token), fmt)
