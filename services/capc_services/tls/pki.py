"""A small federation PKI: one CA, one certificate per party (CN = party name).

Keys are ECDSA P-256 (what gRPC's TLS stack and every browser accept), written with mode 0600 and never
overwritten. Every leaf certificate carries the party name as a DNS SAN besides any host names and IPs, so a
client can pin the peer it expects by name (``grpc.ssl_target_name_override``) while TLS verifies the
chain. In production each party generates its key itself and only the certificate travels; the
``issue_certificate`` helper that writes both is the local/test convenience.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from capc_common.errors import InputError
from capc_common.federation import FederationConfig, check_party_name, serial_hex
from capc_services.tls.names import check_certificate_names

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
MAX_DAYS = 825
"""The longest a party certificate is signed for (about 27 months): certificates are renewed within the CA's
life, and a forgotten one does not stay valid for decades."""


@dataclass(frozen=True)
class IssuedCertificate:
    """Paths and facts of one issued certificate."""

    party: str
    cert: Path
    key: Path
    not_after: dt.datetime
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    serial: str


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 and write ``data``; refuse to overwrite (a key is never replaced)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InputError(
            f"{path} already exists; refusing to overwrite a private key (delete it first)"
        ) from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM (the file's 0600 mode protects it)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def init_ca(directory: str | Path, *, name: str, days: int = 3650) -> tuple[Path, Path]:
    """Create a federation CA (self-signed, path length 0) in ``directory``.

    Args:
        directory: where ``ca.crt`` and ``ca.key`` (0600) are written; created if missing.
        name: the federation name, used as the CA's common name.
        days: validity in days.

    Returns:
        ``(ca_cert_path, ca_key_path)``.

    Raises:
        InputError: ``days`` < 1 or a CA already exists there.
    """
    if days < 1:
        raise InputError(f"CA validity must be at least 1 day, got {days}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() or key_path.exists():
        raise InputError(f"a CA already exists in {directory}; use it, or delete {CA_CERT}/{CA_KEY} first")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} federation CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(key_path, pem_key(key))
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise InputError(f"no CA in {ca_dir} ({exc.filename} missing); run `capc ca init` first") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InputError(f"{ca_dir / CA_KEY} is not an EC private key")
    return cert, key


def party_certificate(
    *,
    ca_dir: Path,
    party: str,
    public_key: CertificatePublicKeyTypes,
    dns: tuple[str, ...],
    ips: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...],
    days: int,
) -> x509.Certificate:
    """A party certificate for ``public_key`` signed by the CA in ``ca_dir`` (client and server use).

    Raises:
        InputError: ``days`` outside 1 to :data:`MAX_DAYS`, or no CA in ``ca_dir``.
    """
    if not 1 <= days <= MAX_DAYS:
        raise InputError(
            f"certificate validity must be 1 to {MAX_DAYS} days, got {days}; renew before it ends instead"
        )
    ca_cert, ca_key = _load_ca(ca_dir)
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, party)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([*(x509.DNSName(d) for d in dns), *(x509.IPAddress(i) for i in ips)]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def party_sans(
    party: str, dns_names: tuple[str, ...], ip_addresses: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]]:
    """Validate a party name and its SANs: the DNS SANs (party name first) and the parsed IP SANs."""
    try:
        check_party_name(party)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    try:
        ips = tuple(ipaddress.ip_address(ip) for ip in ip_addresses)
    except ValueError as exc:
        raise InputError(f"bad IP SAN: {exc}") from None
    return tuple(dict.fromkeys((party, *dns_names))), ips


def write_certificate(path: Path, cert: x509.Certificate) -> None:
    """Write a certificate as PEM (mode 0644, atomically)."""
    _write_public(path, cert.public_bytes(serialization.Encoding.PEM))


def issue_certificate(
    ca_dir: str | Path,
    party: str,
    *,
    out_dir: str | Path,
    dns_names: tuple[str, ...] = ("localhost",),
    ip_addresses: tuple[str, ...] = ("127.0.0.1",),
    days: int = 365,
    federation: FederationConfig | None = None,
) -> IssuedCertificate:
    """Generate a key pair for ``party`` and a certificate for it signed by the CA in ``ca_dir``.

    The local/demo path: the key is made where the CA is. Across organisations a party makes its own key
    and a request (:func:`~capc_services.tls.csr.request_certificate`) and only the certificate travels.
    The certificate is good for both TLS server and client authentication (every party is a client on some
    link and, except teachers, a server on another).

    Args:
        ca_dir: directory holding ``ca.crt`` and ``ca.key``.
        party: the party name; becomes the CN and the first DNS SAN.
        out_dir: where ``PARTY.crt`` and ``PARTY.key`` (0600) are written.
        dns_names: extra DNS SANs (host names the party is reached at).
        ip_addresses: IP SANs.
        days: validity in days.
        federation: when given, ``party`` must be one of its parties and no SAN may name another one.

    Raises:
        InputError: bad name or IP address, a SAN naming another party, ``days`` < 1, the CA is missing
            or the key file already exists.
    """
    dns, ips = party_sans(party, dns_names, ip_addresses)
    if federation is not None:
        check_certificate_names(federation, party, dns)
    out = Path(out_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = party_certificate(
        ca_dir=Path(ca_dir), party=party, public_key=key.public_key(), dns=dns, ips=ips, days=days
    )
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / f"{party}.crt", out / f"{party}.key"
    write_private(key_path, pem_key(key))
    write_certificate(cert_path, cert)
    return IssuedCertificate(
        party=party,
        cert=cert_path,
        key=key_path,
        not_after=cert.not_valid_after_utc,
        dns_names=dns,
        ip_addresses=tuple(str(i) for i in ips),
        serial=serial_hex(cert.serial_number),
    )


@dataclass(frozen=True)
class CertificateInfo:
    """What a party reports about its own certificate (readiness, metrics)."""

    common_name: str
    not_after: dt.datetime
    serial: str = ""
    dns_names: tuple[str, ...] = ()

    def seconds_left(self, *, now: dt.datetime | None = None) -> float:
        """Seconds until expiry (negative once expired)."""
        return (self.not_after - (now or _now())).total_seconds()


def certificate_info(cert_path: str | Path) -> CertificateInfo:
    """Read the CN, expiry, serial and DNS SANs of a PEM certificate.

    Raises:
        InputError: the file is missing or not a PEM certificate.
    """
    path = Path(cert_path)
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        raise InputError(f"certificate {path} does not exist; issue one with `capc cert issue`") from None
    except ValueError as exc:
        raise InputError(f"{path} is not a PEM certificate: {exc}") from None
    return describe_certificate(cert)


def describe_certificate(cert: x509.Certificate) -> CertificateInfo:
    """CN, expiry, serial and DNS SANs of a parsed certificate."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(names[0].value) if names else ""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = ()
    return CertificateInfo(
        common_name=cn,
        not_after=cert.not_valid_after_utc,
        serial=serial_hex(cert.serial_number),
        dns_names=dns,
    )


def write_admin_token(path: str | Path) -> bool:
    """Write a fresh 256-bit admin bearer token to ``path`` (mode 0600) unless one exists.

    Returns:
        True if a token was written.
    """
    path = Path(path)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, (secrets.token_urlsafe(32) + "\n").encode())
    return True


def bootstrap(
    directory: str | Path,
    *,
    name: str,
    parties: tuple[str, ...],
    dns_names: tuple[str, ...] = (),
    admin_tokens: tuple[str | Path, ...] = (),
) -> dict[str, object]:
    """Create the CA if it is missing, a certificate for every party without one, and a fresh admin token in
    each of ``admin_tokens`` that does not exist yet (idempotent; one token file per role).

    ``dns_names`` go on every party's certificate, so none may be a party's name.

    Returns:
        What was created: ``{"ca": bool, "issued": [...], "kept": [...], "admin_tokens": [paths written]}``.

    Raises:
        InputError: a ``dns_names`` entry is one of ``parties``.
    """
    directory = Path(directory)
    claimed = sorted({d for d in dns_names if d.lower().rstrip(".") in set(parties)})
    if claimed:
        raise InputError(
            f"--dns {claimed} is the name of a party being certified: every other party's certificate would "
            "carry it and could pass as that party to anyone who dials it; give host names only"
        )
    created_ca = not (directory / CA_CERT).exists()
    if created_ca:
        init_ca(directory, name=name)
    issued, kept = [], []
    for party in parties:
        if (directory / f"{party}.crt").exists() and (directory / f"{party}.key").exists():
            kept.append(party)
            continue
        issue_certificate(directory, party, out_dir=directory, dns_names=("localhost", *dns_names))
        issued.append(party)
    written = [str(path) for path in admin_tokens if write_admin_token(path)]
    return {"ca": created_ca, "issued": issued, "kept": kept, "admin_tokens": written}
