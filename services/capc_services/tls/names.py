"""Which certificates a federation accepts: names and revoked serials.

A client pins the peer it dials by name: every party certificate carries its party name as a DNS SAN, and
the client overrides the TLS target name with the party it expects (see :mod:`.credentials`). A certificate
that also carried *another* party's name would therefore pass as that party — hospital-a's certificate with
the SAN ``guardian`` could serve as the guardian to every teacher. So the CA refuses to sign one
(:func:`check_certificate_names`), and a party refuses to start with, and the guardian and the student
refuse a caller presenting, a certificate that names another party or whose serial ``federation.yaml``
revokes (:func:`refusal`).
"""

from __future__ import annotations

from collections.abc import Iterable

from capc_common.errors import InputError
from capc_common.federation import FederationConfig


def foreign_names(config: FederationConfig, party: str, dns_names: Iterable[str]) -> list[str]:
    """The DNS SANs of ``party``'s certificate that name another party (DNS names compare case-blind)."""
    others = {name for name in config.party_names if name != party}
    return sorted({d for d in dns_names if d.lower().rstrip(".") in others})


def check_certificate_names(config: FederationConfig, party: str, dns_names: Iterable[str]) -> None:
    """Refuse to certify ``party`` with ``dns_names`` unless it is a party and no SAN names another one.

    Raises:
        InputError: ``party`` is not in ``federation.yaml``, a SAN is another party's name, or a SAN is a
            wildcard (which could match a name the party does not own).
    """
    dns_names = list(dns_names)
    if config.role_of(party) is None:
        raise InputError(
            f"{party!r} is not a party of federation {config.name!r} (parties: {list(config.party_names)}); "
            "add it to federation.yaml first, or check the name in the request"
        )
    foreign = foreign_names(config, party, dns_names)
    if foreign:
        raise InputError(
            f"a certificate for {party} may not carry the name(s) {foreign} of another party of federation "
            f"{config.name!r}: whoever holds it could pass as that party to anyone who dials it; make the "
            "request again without them"
        )
    wildcards = [d for d in dns_names if "*" in d]
    if wildcards:
        raise InputError(
            f"a certificate for {party} may not carry wildcard names {wildcards}; list each host name"
        )


def refusal(
    config: FederationConfig, *, common_name: str, serial: str, dns_names: Iterable[str]
) -> str | None:
    """Why the federation refuses a certificate (revoked, or it names another party), or None.

    Args:
        config: the federation (its ``revoked`` list and party names).
        common_name: the certificate's CN (its party).
        serial: its serial in lowercase hex (:func:`capc_common.federation.serial_hex`).
        dns_names: its DNS SANs.
    """
    for revocation in config.revoked:
        if revocation.serial == serial:
            why = f" ({revocation.reason})" if revocation.reason else ""
            return (
                f"certificate serial {serial} of {common_name!r} is revoked in federation.yaml{why}; "
                f"{common_name} needs a new certificate (`capc cert request` / `capc cert sign`)"
            )
    foreign = foreign_names(config, common_name, dns_names)
    if foreign:
        return (
            f"certificate of {common_name!r} (serial {serial}) carries the name(s) {foreign} of another "
            "party; revoke it and sign a new one without them"
        )
    return None
