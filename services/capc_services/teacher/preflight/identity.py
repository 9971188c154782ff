"""Preflight of a site's identity: its certificate, its private key and its admin token."""

from __future__ import annotations

import datetime as dt
import stat

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_services.common.settings import SiteSettings, load_admin_token
from capc_services.teacher.preflight.report import Check
from capc_services.tls import describe_certificate
from capc_services.tls.names import foreign_names

EXPIRY_WARNING_DAYS = 14
_NEW_CERTIFICATE = (
    "make a new key and request with `capc cert request {party}` and have the coordinator sign it"
)


def _load_certificate(path: object, what: str) -> x509.Certificate:
    try:
        with open(str(path), "rb") as handle:
            return x509.load_pem_x509_certificate(handle.read())
    except OSError as exc:
        raise InputError(f"{what} {path} cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise InputError(f"{what} {path} is not a PEM certificate ({exc})") from None


def _public_der(key: object) -> bytes:
    public = key.public_key()  # type: ignore[attr-defined]
    der: bytes = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def certificate_checks(
    settings: SiteSettings, config: FederationConfig, *, now: dt.datetime | None = None
) -> list[Check]:
    """Chain, name, revocation and expiry of the site's certificate; mode and match of its key.

    Args:
        settings: the site (its ``tls:`` paths and party).
        config: the federation (party names, revoked serials).
        now: the time to judge expiry at (default: now).
    """
    tls, party = settings.tls, settings.party
    fix_new = _NEW_CERTIFICATE.format(party=party)
    try:
        ca = _load_certificate(tls.ca, "CA certificate")
        cert = _load_certificate(tls.cert, "certificate")
    except InputError as exc:
        return [
            Check.fail(
                "certificate.files",
                str(exc),
                fix="put the federation's ca.crt (from the coordinator) and this party's certificate (from "
                "`capc cert sign`) where the site's tls: section points",
            )
        ]
    info = describe_certificate(cert)
    checks: list[Check] = []
    try:
        cert.verify_directly_issued_by(ca)
        checks.append(
            Check.ok(
                "certificate.chain",
                f"{info.common_name!r} signed by {ca.subject.rfc4514_string()!r} ({tls.ca})",
                issuer=ca.subject.rfc4514_string(),
            )
        )
    except (ValueError, TypeError, InvalidSignature):
        checks.append(
            Check.fail(
                "certificate.chain",
                f"{tls.cert} (issuer {cert.issuer.rfc4514_string()!r}) is not signed by the federation CA in "
                f"{tls.ca} ({ca.subject.rfc4514_string()!r}); the guardian and the student would refuse the "
                "TLS handshake",
                fix=f"use the federation's ca.crt and a certificate its CA signed ({fix_new})",
            )
        )
    foreign = foreign_names(config, info.common_name, info.dns_names)
    if info.common_name != party:
        checks.append(
            Check.fail(
                "certificate.name",
                f"{tls.cert} is for {info.common_name!r}, but this site is party {party!r}",
                fix=f"point tls.cert/tls.key at {party}'s own files, or {fix_new}",
            )
        )
    elif foreign:
        checks.append(
            Check.fail(
                "certificate.name",
                f"{tls.cert} also carries the name(s) {foreign} of another party; the servers refuse it",
                fix=f"{fix_new} (without those names)",
            )
        )
    else:
        checks.append(
            Check.ok(
                "certificate.name",
                f"CN {info.common_name!r}, SANs {list(info.dns_names)}",
                dns_names=list(info.dns_names),
            )
        )
    revoked = {r.serial: r for r in config.revoked}.get(info.serial)
    if revoked is not None:
        why = f" ({revoked.reason})" if revoked.reason else ""
        checks.append(
            Check.fail(
                "certificate.revoked",
                f"serial {info.serial} is revoked in federation.yaml{why}; guardian and student refuse it",
                fix=fix_new,
                serial=info.serial,
            )
        )
    else:
        checks.append(
            Check.ok("certificate.revoked", f"serial {info.serial} is not revoked", serial=info.serial)
        )
    checks.append(_expiry(cert, now=now or dt.datetime.now(dt.UTC), fix=fix_new))
    checks.extend(_key_checks(settings, cert, fix_new=fix_new))
    return checks


def _expiry(cert: x509.Certificate, *, now: dt.datetime, fix: str) -> Check:
    after, before = cert.not_valid_after_utc, cert.not_valid_before_utc
    days = (after - now).total_seconds() / 86400
    data = {"not_after": after.isoformat(), "days_left": round(days, 2)}
    if now < before:
        return Check.fail(
            "certificate.expiry",
            f"not valid before {before.isoformat()} (this machine's clock says {now.isoformat()})",
            fix="set this machine's clock right (NTP); TLS peers judge validity by their own clocks",
            **data,
        )
    if days <= 0:
        return Check.fail("certificate.expiry", f"expired on {after.isoformat()}", fix=fix, **data)
    if days < EXPIRY_WARNING_DAYS:
        return Check.warn(
            "certificate.expiry",
            f"expires in {days:.1f} days ({after.isoformat()})",
            fix=f"soon: {fix}",
            **data,
        )
    return Check.ok("certificate.expiry", f"valid for {days:.0f} more days (until {after.date()})", **data)


def _key_checks(settings: SiteSettings, cert: x509.Certificate, *, fix_new: str) -> list[Check]:
    path = settings.tls.key
    if not path.is_file():
        return [
            Check.fail(
                "key.permissions",
                f"private key {path} does not exist",
                fix=f"point tls.key at the key `capc cert request` wrote on this machine, or {fix_new}",
            )
        ]
    checks: list[Check] = []
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        checks.append(
            Check.fail(
                "key.permissions",
                f"private key {path} is readable by others (mode {mode:o}); every party refuses to start so",
                fix=f"chmod 600 {path} (and check who could have read it; if in doubt, revoke and re-key)",
                mode=f"{mode:o}",
            )
        )
    else:
        checks.append(Check.ok("key.permissions", f"{path} mode {mode:o}", mode=f"{mode:o}"))
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        checks.append(
            Check.fail("key.match", f"{path} is not an unencrypted PEM private key ({exc})", fix=fix_new)
        )
        return checks
    if _public_der(key) != _public_der(cert):
        checks.append(
            Check.fail(
                "key.match",
                f"{path} is not the key of {settings.tls.cert} (their public keys differ); TLS would fail",
                fix="use the certificate that was signed for this key's request (or the key that made the "
                f"certificate's request); else {fix_new}",
            )
        )
    else:
        checks.append(Check.ok("key.match", "the key is the certificate's"))
    return checks


def admin_token_check(settings: SiteSettings) -> Check:
    """The admin token exists, is private, long and not a default (what the party checks at start)."""
    try:
        load_admin_token(settings.admin.token_file)
    except InputError as exc:
        fix = str(exc).partition("; ")[2] or "write a fresh token and chmod 600 it"
        return Check.fail("admin.token", str(exc).partition(";")[0], fix=fix)
    return Check.ok("admin.token", f"{settings.admin.token_file} (admin API on {settings.admin.bind})")
