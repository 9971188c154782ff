"""A client's check of the server's certificate serial: the server proves, on every call, which certificate it
holds.

gRPC's Python API shows a server its client's certificate (``auth_context``) but shows a client nothing of its
server's: TLS has checked that the server's certificate chains to the federation CA and names the expected
party, and a client could not tell a revoked certificate of that party from a current one. So a stolen
guardian or student key, once revoked, would still pass as that party to every teacher.

The fix is the two-pass unilateral authentication of ISO/IEC 9798-3 (§5.1.2), carried in call metadata: the
client sends a fresh 16-byte nonce with each call; the server answers, in its initial metadata, with its
certificate and its signature (the key of its TLS certificate) over a fixed context string, the nonce and the
*client's* certificate name — which the server takes from the client's verified TLS certificate, never from
the request. The client checks that the certificate is the federation CA's, names the party it dialled,
is within its validity and is not revoked by ``federation.yaml``, and that the signature verifies. Someone
holding only a revoked key cannot answer, and cannot have a current server answer for them either: a current
server signs only the name of the client whose TLS certificate it verified, and that is not theirs.

What the check does not cover: a unary request is sent before its reply (and its proof) arrives, so a server
holding a revoked key receives the one request of a refused call; streams (the teachers' work stream, the
Compute stream) carry nothing secret before the reply. The services' unary requests carry either public values
or one half of a party's secret-shared contribution (docs/threat-model.md).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from capc_common.errors import InputError, ProtocolError
from capc_common.federation import FederationConfig, serial_hex
from capc_services.tls.credentials import TlsFiles
from capc_services.tls.names import refusal
from capc_services.tls.pki import describe_certificate

CONTEXT = b"capc server proof v1\x00"
"""Domain separation: what the server signs can never be read as another protocol's signed message."""
NONCE_HEADER = "capc-nonce-bin"
CERTIFICATE_HEADER = "capc-server-certificate-bin"
PROOF_HEADER = "capc-server-proof-bin"
NONCE_BYTES = 16


def _message(nonce: bytes, client: str) -> bytes:
    return CONTEXT + nonce + client.encode()


_PSS = padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.MAX_LENGTH)


def _sign(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, message: bytes) -> bytes:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(message, ec.ECDSA(hashes.SHA256()))
    return key.sign(message, _PSS, hashes.SHA256())


def _verify(public: object, signature: bytes, message: bytes) -> bool:
    try:
        if isinstance(public, ec.EllipticCurvePublicKey):
            public.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public, rsa.RSAPublicKey):
            public.verify(signature, message, _PSS, hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True)
class ServerIdentity:
    """A server's own certificate and key, to answer a client's nonce (see the module docstring).

    Attributes:
        certificate: the server's certificate, DER.
        key: its private key (the one its TLS credentials use).
    """

    certificate: bytes
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

    @classmethod
    def load(cls, tls: TlsFiles) -> ServerIdentity:
        """The identity of the party whose TLS files these are.

        Raises:
            InputError: the files are missing, the key is readable by others, or is not an EC or RSA key.
        """
        tls.check_key()
        certificate = x509.load_pem_x509_certificate(tls.cert.read_bytes())
        key = serialization.load_pem_private_key(tls.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise InputError(f"{tls.key} is neither an EC nor an RSA private key")
        return cls(certificate=certificate.public_bytes(serialization.Encoding.DER), key=key)

    def answer(self, nonce: bytes, *, client: str) -> tuple[tuple[str, bytes], ...]:
        """The metadata that proves this server's certificate to ``client`` (the CN of the caller's verified
        TLS certificate) for ``nonce``; nothing for a nonce of another length.
        """
        if len(nonce) != NONCE_BYTES:
            return ()
        return (
            (CERTIFICATE_HEADER, self.certificate),
            (PROOF_HEADER, _sign(self.key, _message(nonce, client))),
        )


class ServerCheck:
    """What a client checks of the server it dialled (see the module docstring).

    Args:
        ca: the federation CA certificate (PEM).
        config: the federation (its revoked serials).
        client: this party's name (its certificate's CN): what the server must have signed.
        peer: the party the client dialled.
    """

    def __init__(self, *, ca: bytes, config: FederationConfig, client: str, peer: str) -> None:
        self._ca = x509.load_pem_x509_certificate(ca)
        self._config = config
        self._client = client
        self._peer = peer
        # A server presents the same certificate on every call: parse and judge each one once.
        self._judged = lru_cache(maxsize=16)(self._judge)

    @classmethod
    def load(cls, tls: TlsFiles, *, config: FederationConfig, peer: str) -> ServerCheck:
        """The check a client with these TLS files makes of ``peer``.

        Raises:
            InputError: a TLS file is missing or unreadable.
        """
        tls.check_key()
        own = describe_certificate(x509.load_pem_x509_certificate(tls.cert.read_bytes()))
        return cls(ca=tls.ca.read_bytes(), config=config, client=own.common_name, peer=peer)

    @staticmethod
    def nonce() -> bytes:
        """A fresh nonce for one call."""
        return secrets.token_bytes(NONCE_BYTES)

    def _judge(self, der: bytes) -> tuple[x509.Certificate | None, str | None]:
        """The certificate, and why it is refused whenever it is presented (None: it may be accepted)."""
        try:
            certificate = x509.load_der_x509_certificate(der)
            certificate.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature) as exc:
            return None, f"it presented a certificate the federation CA did not issue ({type(exc).__name__})"
        info = describe_certificate(certificate)
        if info.common_name != self._peer:
            return None, f"it presented the certificate of {info.common_name!r}, not of {self._peer!r}"
        refused = refusal(
            self._config, common_name=info.common_name, serial=info.serial, dns_names=info.dns_names
        )
        return certificate, refused

    def verify(self, metadata: Mapping[str, object], *, nonce: bytes) -> None:
        """Check the server's answer to ``nonce`` in its reply's initial metadata.

        Raises:
            ProtocolError: no proof, a certificate the federation refuses, or a signature that fails: the
                server may hold a stolen, revoked key.
        """
        der, signature = metadata.get(CERTIFICATE_HEADER), metadata.get(PROOF_HEADER)
        if not isinstance(der, bytes) or not isinstance(signature, bytes):
            raise ProtocolError(
                f"the server that answered as {self._peer} did not prove which certificate it holds: it does "
                "not run this federation's software, or is not the party this one dialled"
            )
        certificate, refused = self._judged(der)
        now = dt.datetime.now(dt.UTC)
        if certificate is not None and not (
            certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc
        ):
            serial = serial_hex(certificate.serial_number)
            refused = f"its certificate (serial {serial}) is outside its validity"
        if certificate is None or refused is not None:
            raise ProtocolError(
                f"refusing the server that answered as {self._peer}: {refused} (whoever answers may hold a "
                "stolen key; check the address, and that this party runs the coordinator's federation.yaml)"
            )
        if not _verify(certificate.public_key(), signature, _message(nonce, self._client)):
            raise ProtocolError(
                f"the server that answered as {self._peer} presented a certificate without proof of holding "
                "its key: refusing it"
            )
