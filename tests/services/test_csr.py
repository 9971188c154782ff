"""Certificates across organisations: the party's key stays on its machine; the coordinator checks names.

The request/sign flow end to end (library and CLI), each refusal of ``capc cert sign`` (a fingerprint other
than the one read out, another party's name, a SAN equal to another party's name, a stranger, a wildcard, a
forged request, a validity past the cap) with nothing written, and why the SAN rule matters: a certificate
carrying another party's name passes a client's name pin.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_common.wire import rpc
from capc_services.common.runtime import start_grpc_server
from capc_services.tls import TlsFiles, init_ca, issue_certificate, request_certificate, sign_request
from capc_services.tls.csr import fingerprint


def _read_out(csr: Path) -> str:
    """The request's fingerprint, as its party reads it out to the coordinator."""
    return fingerprint(x509.load_pem_x509_csr(csr.read_bytes()))


@pytest.fixture
def coordinator(tmp_path: Path, federation_dict) -> tuple[Path, FederationConfig]:
    """A federation CA and the federation.yaml of guardian, student, hospital-a and hospital-b."""
    ca = tmp_path / "ca"
    init_ca(ca, name="test")
    return ca, FederationConfig.from_dict(federation_dict())


def _csr(
    path: Path, cn: str, *, dns: tuple[str, ...] = (), subject: x509.Name | None = None
) -> tuple[Path, ec.EllipticCurvePrivateKey]:
    """A request made by hand (what a party that does not use ``capc cert request`` might send)."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        subject or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    )
    if dns:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False
        )
    path.write_bytes(builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return path, key


def test_request_and_sign_keep_the_key_at_the_party(tmp_path: Path, coordinator) -> None:
    # Prepare: the hospital makes its key and request on its own machine
    ca, config = coordinator
    site, inbox = tmp_path / "hospital-a", tmp_path / "inbox"
    made = request_certificate("hospital-a", out_dir=site, dns_names=("teacher.a.example",))
    inbox.mkdir()
    (inbox / "hospital-a.csr").write_bytes(made.csr.read_bytes())
    # Execute: the coordinator signs what it received
    signed = sign_request(
        inbox / "hospital-a.csr", ca_dir=ca, federation=config, fingerprint_read_out=made.fingerprint
    )
    # Assert
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    assert signed.cert == inbox / "hospital-a.crt" and signed.request_fingerprint == made.fingerprint
    assert not list(inbox.glob("*.key")) and not list(ca.glob("hospital-a*")), "no key at the coordinator"
    cert = x509.load_pem_x509_certificate(signed.cert.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate((ca / "ca.crt").read_bytes()))
    key = serialization.load_pem_private_key(made.key.read_bytes(), password=None)
    assert cert.public_key() == key.public_key()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["hospital-a", "teacher.a.example"]
    assert signed.serial == format(cert.serial_number, "x")


@pytest.mark.parametrize(
    ("cn", "dns", "sender", "match"),
    [
        (
            "guardian",
            (),
            "hospital-a",
            r"asks for a certificate as 'guardian', but it came from 'hospital-a'",
        ),
        ("hospital-a", ("student",), "hospital-a", r"may not carry the name\(s\) \['student'\]"),
        ("hospital-a", ("Hospital-B.",), "hospital-a", r"name\(s\) \['Hospital-B.'\] of another party"),
        ("hospital-z", (), "hospital-z", r"'hospital-z' is not a party of federation 'test'"),
        ("hospital-a", ("*.example",), "hospital-a", "wildcard"),
        ("Hospital_A", (), "Hospital_A", "DNS label"),
    ],
)
def test_sign_refuses_names_the_sender_does_not_own(
    tmp_path: Path, coordinator, cn: str, dns: tuple[str, ...], sender: str, match: str
) -> None:
    ca, config = coordinator
    csr, _ = _csr(tmp_path / f"{sender}.csr", cn, dns=dns)
    with pytest.raises(InputError, match=match):
        sign_request(csr, ca_dir=ca, federation=config, fingerprint_read_out=_read_out(csr), party=sender)
    assert not list(tmp_path.glob("*.crt")), "a refused request leaves no certificate"


def test_sign_refuses_forged_and_malformed_requests(tmp_path: Path, coordinator) -> None:
    ca, config = coordinator
    good, _ = _csr(tmp_path / "hospital-a.csr", "hospital-a")
    # a request whose signature does not match its content (a byte of the signature flipped)
    der = bytearray(x509.load_pem_x509_csr(good.read_bytes()).public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0x01
    forged = tmp_path / "forged" / "hospital-a.csr"
    forged.parent.mkdir()
    forged.write_bytes(x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(InputError, match="signature does not verify"):
        sign_request(forged, ca_dir=ca, federation=config, fingerprint_read_out=_read_out(good))
    with pytest.raises(InputError, match="not a PEM certificate signing request"):
        (tmp_path / "junk.csr").write_text("hello")
        sign_request(tmp_path / "junk.csr", ca_dir=ca, federation=config, fingerprint_read_out="00")
    extra = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "acme"),
            x509.NameAttribute(NameOID.COMMON_NAME, "hospital-a"),
        ]
    )
    (tmp_path / "odd").mkdir()
    odd, _ = _csr(tmp_path / "odd" / "hospital-a.csr", "hospital-a", subject=extra)
    with pytest.raises(InputError, match="exactly one common name"):
        sign_request(odd, ca_dir=ca, federation=config, fingerprint_read_out=_read_out(odd))
    with pytest.raises(InputError, match="capc ca init"):
        sign_request(good, ca_dir=tmp_path / "no-ca", federation=config, fingerprint_read_out=_read_out(good))
    assert [p.name for p in tmp_path.rglob("*.crt")] == ["ca.crt"]


def test_sign_takes_the_party_from_the_request_and_signs_only_what_was_read_out(
    tmp_path: Path, coordinator
) -> None:
    """A request swapped on the way (another key, whatever the file's name) is not the one the party read out;
    the party is the request's subject, never the file name; no certificate outlives the cap."""
    ca, config = coordinator
    made = request_certificate("hospital-a", out_dir=tmp_path / "site")
    (tmp_path / "inbox").mkdir()
    swapped, _ = _csr(tmp_path / "inbox" / "hospital-a.csr", "hospital-a")
    with pytest.raises(InputError, match="is not the request the party read out"):
        sign_request(swapped, ca_dir=ca, federation=config, fingerprint_read_out=made.fingerprint)
    named_otherwise = tmp_path / "inbox" / "from-the-mail.csr"
    named_otherwise.write_bytes(made.csr.read_bytes())
    spoken = ":".join(made.fingerprint[i : i + 2] for i in range(0, 64, 2)).upper()  # as read aloud
    signed = sign_request(named_otherwise, ca_dir=ca, federation=config, fingerprint_read_out=spoken)
    assert signed.party == "hospital-a" and signed.cert.name == "hospital-a.crt"
    with pytest.raises(InputError, match="must be 1 to 825 days"):
        sign_request(named_otherwise, ca_dir=ca, federation=config, fingerprint_read_out=spoken, days=3650)
    assert sorted(p.name for p in tmp_path.rglob("*.crt")) == ["ca.crt", "hospital-a.crt"]


def test_issue_with_a_federation_refuses_another_partys_name(tmp_path: Path, coordinator) -> None:
    ca, config = coordinator
    with pytest.raises(InputError, match=r"name\(s\) \['guardian'\]"):
        issue_certificate(
            ca, "hospital-a", out_dir=tmp_path / "a", dns_names=("guardian",), federation=config
        )
    assert not (tmp_path / "a" / "hospital-a.key").exists()


def test_a_san_naming_another_party_passes_a_clients_name_pin(tmp_path: Path, coordinator) -> None:
    """Why sign refuses such SANs: without the rule, hospital-a's certificate can serve as the guardian."""
    ca, _ = coordinator
    rogue = issue_certificate(ca, "hospital-a", out_dir=tmp_path / "rogue", dns_names=("guardian",))
    issue_certificate(ca, "hospital-b", out_dir=tmp_path / "b")
    server = start_grpc_server(
        bind="127.0.0.1:0",
        tls=TlsFiles(ca=ca / "ca.crt", cert=rogue.cert, key=rogue.key),
        register=[],
        services=[rpc.GUARDIAN_SERVICE],
        interceptors=[],
        max_workers=2,
    )
    victim = TlsFiles(
        ca=ca / "ca.crt", cert=tmp_path / "b" / "hospital-b.crt", key=tmp_path / "b" / "hospital-b.key"
    )
    channel = victim.channel(f"127.0.0.1:{server.port}", peer="guardian")
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert (
            reply.status == health_pb2.HealthCheckResponse.SERVING
        )  # hospital-b believes it reached the guardian
    finally:
        channel.close()
        server.stop(0)


def test_cli_request_sign_and_refusal(tmp_path: Path, capc, capc_json, federation_dict) -> None:
    config = FederationConfig.from_dict(federation_dict())
    config.save(tmp_path / "federation.yaml")
    capc_json("ca", "init", "--dir", str(tmp_path / "ca"), "--name", "test")
    made = capc_json("cert", "request", "hospital-b", "--out-dir", str(tmp_path / "site"))
    assert Path(made["key"]).exists() and len(made["fingerprint"]) == 64
    unconfirmed = capc(
        "cert", "sign", made["csr"], "--ca-dir", str(tmp_path / "ca"),
        "--federation", str(tmp_path / "federation.yaml"), "--fingerprint", "ab" * 32,
    )  # fmt: skip
    assert unconfirmed.returncode == 2 and "is not the request the party read out" in unconfirmed.stderr
    signed = capc_json(
        "cert",
        "sign",
        made["csr"],
        "--ca-dir",
        str(tmp_path / "ca"),
        "--federation",
        str(tmp_path / "federation.yaml"),
        "--fingerprint",
        made["fingerprint"],
    )
    assert signed["party"] == "hospital-b" and signed["request_fingerprint"] == made["fingerprint"]
    shown = capc_json("cert", "show", signed["cert"])
    assert shown["serial"] == signed["serial"] and shown["dns_names"] == ["hospital-b"]
    refused = capc(
        "cert",
        "sign",
        made["csr"],
        "--fingerprint",
        made["fingerprint"],
        "--party",
        "hospital-a",
        "--ca-dir",
        str(tmp_path / "ca"),
        "--federation",
        str(tmp_path / "federation.yaml"),
    )
    assert refused.returncode == 2, refused.stderr
    assert "came from 'hospital-a'" in refused.stderr and "Traceback" not in refused.stderr
