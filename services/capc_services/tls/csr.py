"""Certificates across organisations: the party keeps its key, only a request and a certificate travel.

``request_certificate`` runs on the party's own machine: it writes the private key (mode 0600, never
overwritten) and a certificate signing request (CSR) naming the party and its host names, and prints the
request's fingerprint, which the party reads out to the coordinator over a second channel (a call). The
coordinator's ``sign_request`` takes the party from the request's subject, signs only a request whose
fingerprint is the one read out (a file swapped on the way is refused, whoever's name it carries), checks
it against ``federation.yaml`` — a party of the federation, no SAN naming another party — and signs it with
the federation CA for at most :data:`~capc_services.tls.pki.MAX_DAYS` days. Nothing secret crosses
organisations; the coordinator never holds a party's key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from capc_common.errors import InputError
from capc_common.federation import FederationConfig, check_party_name, serial_hex
from capc_services.tls.names import check_certificate_names
from capc_services.tls.pki import party_certificate, party_sans, pem_key, write_certificate, write_private

_EC_CURVES = (ec.SECP256R1, ec.SECP384R1)
_MIN_RSA_BITS = 2048


@dataclass(frozen=True)
class CertificateRequest:
    """What ``capc cert request`` wrote: the key (0600), the request, and the request's fingerprint.

    The fingerprint (SHA-256 of the DER request) is what the party reads out to the coordinator over a
    second channel, so the coordinator knows the file it signs is the one the party made.
    """

    party: str
    key: Path
    csr: Path
    fingerprint: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]


@dataclass(frozen=True)
class SignedCertificate:
    """What ``capc cert sign`` wrote: the certificate and the facts the coordinator records."""

    party: str
    cert: Path
    serial: str
    not_after: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    request_fingerprint: str


def fingerprint(request: x509.CertificateSigningRequest) -> str:
    """SHA-256 (hex) of the DER-encoded request."""
    return hashlib.sha256(request.public_bytes(serialization.Encoding.DER)).hexdigest()


def _normalised(value: str) -> str:
    """A fingerprint as read out: any case, colons and spaces between the hex digits."""
    return "".join(value.split()).replace(":", "").lower()


def request_certificate(
    party: str,
    *,
    out_dir: str | Path,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
) -> CertificateRequest:
    """Make ``party``'s private key and a signing request for it, on the party's own machine.

    Args:
        party: the party name (the CN and the first DNS SAN).
        out_dir: where ``PARTY.key`` (0600) and ``PARTY.csr`` are written.
        dns_names: host names the party is reached at (guardian, student; a teacher is never dialled).
        ip_addresses: IP addresses it is reached at.

    Raises:
        InputError: a bad name or IP address, or ``PARTY.key`` already exists (a key is never replaced).
    """
    dns, ips = party_sans(party, dns_names, ip_addresses)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key_path, csr_path = out / f"{party}.key", out / f"{party}.csr"
    key = ec.generate_private_key(ec.SECP256R1())
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, party)]))
        .add_extension(
            x509.SubjectAlternativeName([*(x509.DNSName(d) for d in dns), *(x509.IPAddress(i) for i in ips)]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    write_private(key_path, pem_key(key))
    csr_path.write_bytes(request.public_bytes(serialization.Encoding.PEM))
    csr_path.chmod(0o644)
    return CertificateRequest(
        party=party,
        key=key_path,
        csr=csr_path,
        fingerprint=fingerprint(request),
        dns_names=dns,
        ip_addresses=tuple(str(i) for i in ips),
    )


def _load_request(path: Path) -> x509.CertificateSigningRequest:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"certificate request {path} does not exist") from None
    try:
        request = x509.load_pem_x509_csr(data)
    except ValueError as exc:
        raise InputError(f"{path} is not a PEM certificate signing request: {exc}") from None
    if not request.is_signature_valid:
        raise InputError(f"{path}: the request's signature does not verify; ask the party for a fresh one")
    return request


def _check_key(path: Path, request: x509.CertificateSigningRequest) -> None:
    try:
        key = request.public_key()
    except UnsupportedAlgorithm as exc:
        raise InputError(
            f"{path}: unsupported public key ({exc}); make the request with `capc cert request`"
        ) from None
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, _EC_CURVES):
        return
    if isinstance(key, rsa.RSAPublicKey) and key.key_size >= _MIN_RSA_BITS:
        return
    raise InputError(
        f"{path}: the request's key must be ECDSA P-256/P-384 or RSA ≥ {_MIN_RSA_BITS} bits; make the "
        "request with `capc cert request`"
    )


def _requested_names(path: Path, request: x509.CertificateSigningRequest) -> tuple[str, list[str], list[str]]:
    """The request's CN, DNS SANs and IP SANs; anything else in its subject or SANs is refused."""
    attributes = list(request.subject)
    if len(attributes) != 1 or attributes[0].oid != NameOID.COMMON_NAME:
        raise InputError(
            f"{path}: the request's subject must be exactly one common name (the party), got "
            f"{request.subject.rfc4514_string()!r}"
        )
    cn = str(attributes[0].value)
    dns: list[str] = []
    ips: list[str] = []
    for extension in request.extensions:
        if not isinstance(extension.value, x509.SubjectAlternativeName):
            raise InputError(
                f"{path}: the request carries an extension other than subjectAltName "
                f"({extension.oid.dotted_string}); make it with `capc cert request`"
            )
        for name in extension.value:
            if isinstance(name, x509.DNSName):
                dns.append(name.value)
            elif isinstance(name, x509.IPAddress):
                ips.append(str(name.value))
            else:
                raise InputError(f"{path}: only DNS and IP subject alternative names are signed, got {name}")
    return cn, dns, ips


def sign_request(
    csr: str | Path,
    *,
    ca_dir: str | Path,
    federation: FederationConfig,
    fingerprint_read_out: str,
    party: str | None = None,
    out: str | Path | None = None,
    days: int = 365,
) -> SignedCertificate:
    """Check a party's request against what it read out and ``federation.yaml``, and sign it with the CA.

    Args:
        csr: the request file.
        ca_dir: the federation CA (``ca.crt``, ``ca.key``).
        federation: the federation the certificate is for.
        fingerprint_read_out: the request's SHA-256 as the party read it out over another channel (case,
            colons and spaces do not matter); the request is signed only if it is this one.
        party: who the coordinator received the request from, if it wants that checked too; the party is the
            request's subject either way.
        out: the certificate file (default: ``PARTY.crt`` next to the request).
        days: validity in days (1 to :data:`~capc_services.tls.pki.MAX_DAYS`).

    Raises:
        InputError: the fingerprint is not the request's; the request is unreadable, badly signed or of an
            unsupported key; it names a party other than ``party`` or a stranger to the federation; a SAN
            names another party or is a wildcard; ``days`` is out of range.
    """
    path = Path(csr)
    request = _load_request(path)
    if _normalised(fingerprint_read_out) != fingerprint(request):
        raise InputError(
            f"{path} is not the request the party read out (its SHA-256 differs from "
            f"{_normalised(fingerprint_read_out)[:16]}…): do not sign it; ask the party to read its "
            "fingerprint out again (`capc cert request` printed it), and have the file sent again"
        )
    _check_key(path, request)
    cn, dns, ips = _requested_names(path, request)
    try:
        check_party_name(cn)
    except ValueError as exc:
        raise InputError(f"{path}: {exc}") from None
    if party is not None and cn != party:
        raise InputError(
            f"{path} asks for a certificate as {cn!r}, but it came from {party!r}: a party may only "
            "request its own name"
        )
    check_certificate_names(federation, cn, dns)
    dns_names, ip_addresses = party_sans(cn, tuple(dns), tuple(ips))
    cert = party_certificate(
        ca_dir=Path(ca_dir),
        party=cn,
        public_key=request.public_key(),
        dns=dns_names,
        ips=ip_addresses,
        days=days,
    )
    target = Path(out) if out is not None else path.with_name(f"{cn}.crt")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_certificate(target, cert)
    return SignedCertificate(
        party=cn,
        cert=target,
        serial=serial_hex(cert.serial_number),
        not_after=cert.not_valid_after_utc.isoformat(),
        dns_names=dns_names,
        ip_addresses=tuple(str(i) for i in ip_addresses),
        request_fingerprint=fingerprint(request),
    )
