"""The federation PKI: CA, party certificates, key modes, SANs, refusals."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from capc_common.errors import InputError
from capc_services.tls import bootstrap, certificate_info, init_ca, issue_certificate


def test_issue_writes_private_key_0600_and_sans(tmp_path: Path) -> None:
    # Prepare
    init_ca(tmp_path, name="fed")
    # Execute
    issued = issue_certificate(
        tmp_path, "hospital-a", out_dir=tmp_path / "a", dns_names=("a.example",), ip_addresses=("10.1.2.3",)
    )
    # Assert
    assert stat.S_IMODE(issued.key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(issued.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["hospital-a", "a.example"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    info = certificate_info(issued.cert)
    assert info.common_name == "hospital-a"
    assert 364 * 86400 < info.seconds_left() <= 365 * 86400


def test_refuses_to_overwrite_keys_and_ca(tmp_path: Path) -> None:
    init_ca(tmp_path, name="fed")
    issue_certificate(tmp_path, "student", out_dir=tmp_path)
    with pytest.raises(InputError, match="already exists"):
        init_ca(tmp_path, name="fed")
    with pytest.raises(InputError, match=r"student\.key already exists"):
        issue_certificate(tmp_path, "student", out_dir=tmp_path)


@pytest.mark.parametrize("party", ["Hospital_A", "-x", "a" * 64, ""])
def test_refuses_party_names_that_are_not_dns_labels(tmp_path: Path, party: str) -> None:
    init_ca(tmp_path, name="fed")
    with pytest.raises(InputError, match="DNS label"):
        issue_certificate(tmp_path, party, out_dir=tmp_path)
    assert not list(tmp_path.glob("*.key"))[1:], "no key may be left behind"


def test_bootstrap_refuses_a_dns_name_that_is_a_partys(tmp_path: Path) -> None:
    """``--dns`` goes on every certificate: the guardian's name there would let the student pass as it."""
    with pytest.raises(InputError, match=r"--dns \['Guardian.'\] is the name of a party being certified"):
        bootstrap(tmp_path / "certs", name="x", parties=("guardian", "student"), dns_names=("Guardian.",))
    assert not (tmp_path / "certs").exists()
    made = bootstrap(
        tmp_path / "certs", name="x", parties=("guardian",), dns_names=("capc-guardian",),
        admin_tokens=(tmp_path / "guardian.token", tmp_path / "student.token"),
    )  # fmt: skip
    assert made["admin_tokens"] == [str(tmp_path / "guardian.token"), str(tmp_path / "student.token")]
    assert (tmp_path / "guardian.token").read_text() != (tmp_path / "student.token").read_text()


def test_bad_ip_and_missing_ca_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="capc ca init"):
        issue_certificate(tmp_path, "student", out_dir=tmp_path)
    init_ca(tmp_path, name="fed")
    with pytest.raises(InputError, match="bad IP SAN"):
        issue_certificate(tmp_path, "student", out_dir=tmp_path, ip_addresses=("999.1.1.1",))


def test_cli_issue_and_show(tmp_path: Path, capc_json) -> None:
    capc_json("ca", "init", "--dir", str(tmp_path), "--name", "fed")
    issued = capc_json("cert", "issue", "guardian", "--ca-dir", str(tmp_path), "--dns", "g.example")
    assert issued["dns_names"] == ["guardian", "g.example"]
    shown = capc_json("cert", "show", issued["cert"])
    assert shown["common_name"] == "guardian"
    assert shown["expired"] is False
