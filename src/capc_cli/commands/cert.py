"""``capc cert``: party certificates signed by the federation CA.

Across organisations (the default): the party runs ``capc cert request`` on its own machine (its key never
leaves it), the coordinator checks and signs the request with ``capc cert sign``. ``capc cert issue``
(key made where the CA is) and ``capc cert bootstrap`` are for local and demo federations.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from capc_cli.output import emit, format_option

if TYPE_CHECKING:
    from capc_common.federation import FederationConfig


_FEDERATION = click.option(
    "--federation",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="federation.yaml: the party must be in it and no SAN may name another party.",
)
_DNS = click.option(
    "--dns", "dns_names", multiple=True, help="DNS name the party is reached at (repeatable)."
)
_IP = click.option("--ip", "ips", multiple=True, help="IP address the party is reached at (repeatable).")
_DAYS = click.option(
    "--days",
    type=click.IntRange(min=1),
    default=365,
    show_default=True,
    help="Validity in days (at most 825, about 27 months: renew instead).",
)


def _federation(path: Path | None) -> FederationConfig | None:
    from capc_common.federation import FederationConfig

    return None if path is None else FederationConfig.load(path)


@click.group("cert")
def command() -> None:
    """Party certificates (CN = party name): request on the party's machine, sign at the coordinator."""


@command.command("request")
@click.argument("party")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Where PARTY.key (0600, stays here) and PARTY.csr (send it to the coordinator) are written.",
)
@_DNS
@_IP
@format_option
def request(party: str, out_dir: Path, dns_names: tuple[str, ...], ips: tuple[str, ...], fmt: str) -> None:
    """On PARTY's own machine: make its private key and a certificate signing request.

    Send PARTY.csr to the federation coordinator and read them the fingerprint over another channel (a
    call); the key never leaves this machine."""
    from capc_services.tls import request_certificate

    made = request_certificate(party, out_dir=out_dir, dns_names=dns_names, ip_addresses=ips)
    emit(
        {
            "party": made.party,
            "key": str(made.key),
            "csr": str(made.csr),
            "fingerprint": made.fingerprint,
            "dns_names": list(made.dns_names),
            "ip_addresses": list(made.ip_addresses),
        },
        fmt,
    )


@command.command("sign")
@click.argument("csr", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--ca-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("ca"),
    show_default=True,
    help="Directory holding ca.crt and ca.key.",
)
@click.option(
    "--federation",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("federation.yaml"),
    show_default=True,
    help="The federation the certificate is for (party names are checked against it).",
)
@click.option(
    "--fingerprint",
    required=True,
    help="The request's SHA-256 as the party read it out to you over another channel (a call), never "
    "copied from the file you received; the request is signed only if it matches.",
)
@click.option(
    "--party",
    default=None,
    help="Who you received the request from, to check it too; the party is the request's subject.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Certificate file [default: PARTY.crt next to the request].",
)
@_DAYS
@format_option
def sign(
    csr: Path,
    ca_dir: Path,
    federation: Path,
    fingerprint: str,
    party: str | None,
    out: Path | None,
    days: int,
    fmt: str,
) -> None:
    """At the coordinator: check a party's request against its fingerprint and federation.yaml, sign it.

    Refused (exit 2): a fingerprint other than the request's (the file was swapped on the way), a request
    naming a stranger to the federation (or another party than --party), a SAN equal to another party's
    name, a wildcard, a bad signature. Record the printed serial: revoking the certificate later means
    listing it under `revoked:` in federation.yaml."""
    from capc_common.federation import FederationConfig
    from capc_services.tls import sign_request

    signed = sign_request(
        csr,
        ca_dir=ca_dir,
        federation=FederationConfig.load(federation),
        fingerprint_read_out=fingerprint,
        party=party,
        out=out,
        days=days,
    )
    emit(
        {
            "party": signed.party,
            "cert": str(signed.cert),
            "serial": signed.serial,
            "not_after": signed.not_after,
            "dns_names": list(signed.dns_names),
            "ip_addresses": list(signed.ip_addresses),
            "request_fingerprint": signed.request_fingerprint,
        },
        fmt,
    )


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
@_DAYS
@_FEDERATION
@format_option
def issue(
    party: str,
    ca_dir: Path,
    out_dir: Path | None,
    dns_names: tuple[str, ...],
    ips: tuple[str, ...],
    days: int,
    federation: Path | None,
    fmt: str,
) -> None:
    """Local/demo use: generate PARTY's key where the CA is, and its certificate.

    Across organisations use `capc cert request` on the party's machine and `capc cert sign` here."""
    from capc_services.tls import issue_certificate

    issued = issue_certificate(
        ca_dir,
        party,
        out_dir=out_dir or ca_dir,
        dns_names=dns_names or ("localhost",),
        ip_addresses=ips or ("127.0.0.1",),
        days=days,
        federation=_federation(federation),
    )
    emit(
        {
            "party": issued.party,
            "cert": str(issued.cert),
            "key": str(issued.key),
            "not_after": issued.not_after.isoformat(),
            "dns_names": list(issued.dns_names),
            "ip_addresses": list(issued.ip_addresses),
            "serial": issued.serial,
        },
        fmt,
    )


@command.command("show")
@click.argument("cert", type=click.Path(dir_okay=False, path_type=Path))
@format_option
def show(cert: Path, fmt: str) -> None:
    """Print a certificate's CN, serial (what `revoked:` in federation.yaml lists), SANs and expiry."""
    from capc_services.tls import certificate_info

    info = certificate_info(cert)
    left = info.seconds_left()
    emit(
        {
            "common_name": info.common_name,
            "serial": info.serial,
            "dns_names": list(info.dns_names),
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
@click.option(
    "--dns", "dns_names", multiple=True, help="Extra DNS SAN for every party (repeatable; no party's name)."
)
@click.option(
    "--admin-token",
    "admin_tokens",
    type=click.Path(dir_okay=False, path_type=Path),
    multiple=True,
    help="Also write a fresh admin bearer token here (mode 0600) if none exists (repeatable: one per role).",
)
@format_option
def bootstrap(
    directory: Path,
    name: str,
    parties: tuple[str, ...],
    dns_names: tuple[str, ...],
    admin_tokens: tuple[Path, ...],
    fmt: str,
) -> None:
    """Idempotent one-shot provisioning (e.g. a compose job): create the CA if missing, then a certificate
    for each party that has none. Each party's name is a DNS SAN, so containers named after their party
    verify each other by name."""
    from capc_services.tls import bootstrap as provision

    made = provision(directory, name=name, parties=parties, dns_names=dns_names, admin_tokens=admin_tokens)
    emit(made, fmt)
