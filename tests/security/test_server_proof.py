"""The server's proof of its certificate (``capc_services.tls.proof``), known answers and misuse: what a
client accepts is exactly a signature over its own nonce and name, by the key of a current certificate of the
party it dialled, issued by the federation CA."""

from __future__ import annotations

from pathlib import Path

import pytest
from doors_harness import OPTIONS

from capc_common.errors import ProtocolError
from capc_common.federation import FederationConfig
from capc_services.local.provision import federation_dict
from capc_services.tls import (
    ServerCheck,
    ServerIdentity,
    TlsFiles,
    certificate_info,
    init_ca,
    issue_certificate,
)
from capc_services.tls.proof import CERTIFICATE_HEADER, NONCE_BYTES, PROOF_HEADER


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("proof-pki")
    init_ca(root, name="proof")
    for party in ("guardian", "student", "hospital-1"):
        issue_certificate(root, party, out_dir=root)
    issue_certificate(root, "guardian", out_dir=root / "old")
    init_ca(root / "foreign", name="foreign")
    issue_certificate(root / "foreign", "guardian", out_dir=root / "foreign")
    return root


def _files(pki: Path, party: str, where: Path | None = None) -> TlsFiles:
    where = where or pki
    return TlsFiles(ca=pki / "ca.crt", cert=where / f"{party}.crt", key=where / f"{party}.key")


def _config(*revoked: str) -> FederationConfig:
    data = federation_dict(OPTIONS)
    data["revoked"] = [{"serial": serial} for serial in revoked]
    return FederationConfig.from_dict(data)


def _check(pki: Path, config: FederationConfig, *, client: str = "hospital-1") -> ServerCheck:
    return ServerCheck.load(_files(pki, client), config=config, peer="guardian")


def test_the_server_answers_its_clients_nonce_and_name(pki: Path) -> None:
    config = _config()
    check = _check(pki, config)
    guardian = ServerIdentity.load(_files(pki, "guardian"))
    nonce = check.nonce()
    assert len(nonce) == NONCE_BYTES and nonce != check.nonce()
    check.verify(dict(guardian.answer(nonce, client="hospital-1")), nonce=nonce)
    assert guardian.answer(b"short", client="hospital-1") == ()  # no signature over anything but a nonce


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("another client's name", "without proof of holding its key"),
        ("a replayed answer", "without proof of holding its key"),
        ("no proof", "did not prove which certificate it holds"),
        ("another party's certificate", "presented the certificate of 'student', not of 'guardian'"),
        ("another CA's certificate", "a certificate the federation CA did not issue"),
        ("a revoked certificate", r"certificate serial [0-9a-f]+ of 'guardian' is revoked"),
    ],
)
def test_a_client_refuses_every_other_answer(pki: Path, case: str, match: str) -> None:
    old = ServerIdentity.load(_files(pki, "guardian", pki / "old"))
    config = _config(certificate_info(pki / "old" / "guardian.crt").serial)
    check = _check(pki, config)
    nonce = check.nonce()
    guardian = ServerIdentity.load(_files(pki, "guardian"))
    student = ServerIdentity.load(_files(pki, "student"))
    foreign = ServerIdentity.load(_files(pki, "guardian", pki / "foreign"))
    answers = {
        "another client's name": guardian.answer(nonce, client="student"),
        "a replayed answer": guardian.answer(check.nonce(), client="hospital-1"),
        "no proof": (),
        "another party's certificate": student.answer(nonce, client="hospital-1"),
        "another CA's certificate": foreign.answer(nonce, client="hospital-1"),
        "a revoked certificate": old.answer(nonce, client="hospital-1"),
    }
    with pytest.raises(ProtocolError, match=match):
        check.verify(dict(answers[case]), nonce=nonce)
    # a current certificate's bytes with the revoked key's signature: the key must be the certificate's
    current = dict(guardian.answer(nonce, client="hospital-1"))
    forged = {**current, PROOF_HEADER: dict(old.answer(nonce, client="hospital-1"))[PROOF_HEADER]}
    with pytest.raises(ProtocolError, match="without proof of holding its key"):
        check.verify(forged, nonce=nonce)
    assert CERTIFICATE_HEADER in current
