"""``capc teacher preflight`` against a real guardian and student (processes, mTLS on loopback).

A correctly set-up hospital passes every check; each misconfiguration listed in docs/operations.md
("Preflight") is made on a copy of the site and caught by the check the table names, with a fix. The table
and the cases here are kept equal by a test.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID
from live_parties import LiveParties

from capc_common.learn.heads import HeadEnsemble
from capc_services.local.provision import free_port
from capc_services.teacher.preflight import run_preflight
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import party_examples, train_party_heads
from capc_services.tls import init_ca, issue_certificate

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PARTY = "hospital-1"


@pytest.fixture(scope="module")
def site(live_parties: LiveParties) -> Path:
    """hospital-1's site file, with heads trained on its own data (what a hospital has before going live)."""
    path = live_parties.layout.site(PARTY)
    settings = TeacherSettings.load(path)
    train_party_heads(settings)
    # The cases read the same examples from a small file (decompressing Fashion-MNIST takes a second).
    images, labels, _ = party_examples(settings)
    np.savez(live_parties.root / "hospital-1.npz", images=images, labels=labels)
    return path


class Broken:
    """A copy of a party's site file (paths made absolute) that a case breaks in one way."""

    def __init__(self, live: LiveParties, tmp: Path, party: str = PARTY) -> None:
        self.live, self.tmp, self.party = live, tmp, party
        settings = TeacherSettings.load(live.layout.site(party))
        self.data: dict[str, Any] = json.loads(settings.model_dump_json())
        self.data["cap"]["record"] = str(shutil.copy(settings.cap.record, tmp / "cap.jsonl"))
        self.data["data"] = {"dataset": f"npz:{live.root / 'hospital-1.npz'}"}

    def federation(self, change: Callable[[dict[str, Any]], None]) -> None:
        config = yaml.safe_load(self.live.layout.federation.read_text())
        change(config)
        path = self.tmp / "federation.yaml"
        path.write_text(yaml.safe_dump(config))
        self.data["federation"] = str(path)

    def npz(self, images: np.ndarray, labels: np.ndarray) -> None:
        path = self.tmp / "site.npz"
        np.savez(path, images=images, labels=labels)
        self.data["data"] = {"dataset": f"npz:{path}"}

    def write(self) -> Path:
        path = self.tmp / f"{self.party}.yaml"
        path.write_text(yaml.safe_dump(self.data))
        return path


def _copy_key(b: Broken, mode: int) -> None:
    key = b.tmp / "key.pem"
    shutil.copy(b.data["tls"]["key"], key)
    key.chmod(mode)
    b.data["tls"]["key"] = str(key)


def _other_ca(b: Broken) -> None:
    init_ca(b.tmp / "ca", name="elsewhere")
    issued = issue_certificate(b.tmp / "ca", PARTY, out_dir=b.tmp)
    b.data["tls"].update(cert=str(issued.cert), key=str(issued.key))


def _certificate_of(b: Broken, party: str, **kwargs: Any) -> None:
    issued = issue_certificate(b.live.layout.certs, party, out_dir=b.tmp, **kwargs)
    b.data["tls"].update(cert=str(issued.cert), key=str(issued.key))


def _expired(b: Broken) -> None:
    certs = b.live.layout.certs
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), password=None)
    mine = x509.load_pem_x509_certificate(Path(b.data["tls"]["cert"]).read_bytes())
    key = serialization.load_pem_private_key(Path(b.data["tls"]["key"]).read_bytes(), password=None)
    now = dt.datetime.now(dt.UTC)
    old = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, PARTY)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())  # type: ignore[union-attr]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=400))
        .not_valid_after(now - dt.timedelta(days=35))
        .add_extension(
            mine.extensions.get_extension_for_class(x509.SubjectAlternativeName).value, critical=False
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    path = b.tmp / "expired.crt"
    path.write_bytes(old.public_bytes(serialization.Encoding.PEM))
    b.data["tls"]["cert"] = str(path)


def _revoked(b: Broken) -> None:
    b.data["tls"].update(cert=str(b.live.revoked.cert), key=str(b.live.revoked.key))


def _token(b: Broken, text: str) -> None:
    path = b.tmp / "admin.token"
    path.write_text(text)
    path.chmod(0o600)
    b.data["admin"]["token_file"] = str(path)


def _heads(b: Broken, count: int) -> None:
    full = HeadEnsemble.load(b.data["heads"])
    part = HeadEnsemble(full.kind, {k: v[:count].clone() for k, v in full.params.items()}, full.classes)
    part.save(b.tmp / "heads.safetensors")
    b.data["heads"] = str(b.tmp / "heads.safetensors")


def _heads_over_features(b: Broken, dim: int) -> None:
    """Heads of the right count and classes whose first layer takes ``dim`` features (another backbone's)."""
    full = HeadEnsemble.load(b.data["heads"])
    first = "w_in" if full.kind == "mlp" else "w_out"
    params = {k: v.clone() for k, v in full.params.items()}
    params[first] = params[first][..., :dim].clone()
    HeadEnsemble(full.kind, params, full.classes).save(b.tmp / "heads.safetensors")
    b.data["heads"] = str(b.tmp / "heads.safetensors")


def _cap_of_another_federation(b: Broken) -> None:
    record = {
        "batch_id": "q0+32",
        "attempt": 0,
        "count": 32,
        "rdp": 1.0,
        "time": 0.0,
        "config_hash": "f" * 64,
    }
    Path(b.data["cap"]["record"]).write_text(json.dumps(record) + "\n")


def _small_lifetime(b: Broken) -> None:
    """A site ledger whose lifetime limit holds less than the worst case of this federation's plan."""
    from capc_services.teacher.site_ledger import SiteLedger

    ledger = SiteLedger.init(b.tmp / "site-ledger.jsonl", epsilon=20.0, delta=1e-5, order=3.0)
    b.data["lifetime"] = {"epsilon": 20.0, "ledger": str(ledger)}


def _first_examples(broken: Broken, count: int) -> None:
    """The site's own data cut to its first ``count`` examples."""
    with np.load(broken.live.root / "hospital-1.npz") as data:
        broken.npz(data["images"][:count], data["labels"][:count])


_rng = np.random.default_rng(0)
_labels = np.arange(200) % 10
# misconfiguration (as in docs/operations.md) -> how to make it, the check that catches it, its status, and
# what its detail must say
CASES: dict[str, tuple[Callable[[Broken], None], str, str, str]] = {
    "site file names a party that is not a teacher of federation.yaml": (
        lambda b: b.data.update(party="student"),
        "site",
        "fail",
        "'student' is a student in federation 'capc-local'",
    ),
    "certificate from another CA": (
        _other_ca,
        "certificate.chain",
        "fail",
        "is not signed by the federation CA",
    ),
    "another party's certificate and key": (
        lambda b: _certificate_of(b, "hospital-2"),
        "certificate.name",
        "fail",
        "is for 'hospital-2', but this site is party 'hospital-1'",
    ),
    "certificate that also names another party": (
        lambda b: _certificate_of(b, PARTY, dns_names=("guardian",)),
        "certificate.name",
        "fail",
        r"name\(s\) \['guardian'\] of another party",
    ),
    "revoked certificate": (
        _revoked,
        "certificate.revoked",
        "fail",
        r"revoked in federation.yaml \(key on a lost",
    ),
    "expired certificate": (_expired, "certificate.expiry", "fail", "expired on"),
    "certificate expiring within 14 days": (
        lambda b: _certificate_of(b, PARTY, days=5),
        "certificate.expiry",
        "warn",
        r"expires in [45]\.\d days",
    ),
    "private key readable by others": (
        lambda b: _copy_key(b, 0o644),
        "key.permissions",
        "fail",
        r"readable by others \(mode 644\)",
    ),
    "key that is not the certificate's": (
        lambda b: b.data["tls"].update(key=str(b.live.layout.certs / "hospital-2.key")),
        "key.match",
        "fail",
        "their public keys differ",
    ),
    "default or short admin token": (
        lambda b: _token(b, "changeme"),
        "admin.token",
        "fail",
        "default or shorter than 32",
    ),
    "backbone that is not the pinned one": (
        lambda b: b.federation(lambda c: c["backbone"].update(sha256="0" * 64)),
        "backbone",
        "fail",
        "but 0{64} was expected",
    ),
    "dataset missing": (
        lambda b: b.data.update(data={"dataset": f"npz:{b.tmp}/nowhere.npz"}),
        "dataset",
        "fail",
        "nowhere.npz does not exist",
    ),
    "data file other than the one `data.sha256` pins": (
        lambda b: b.data["data"].update(sha256="0" * 64),
        "dataset",
        "fail",
        "the copy is incomplete or another file",
    ),
    "images of another size": (
        lambda b: b.npz(np.zeros((200, 32, 32, 3), np.uint8), _labels),
        "dataset",
        "fail",
        "images are 32x32x3, the federation's queries are 28x28x1",
    ),
    "labels beyond the federation's classes": (
        lambda b: b.npz(_rng.integers(0, 255, (200, 28, 28, 1), dtype=np.uint8), np.arange(200) % 12),
        "dataset",
        "fail",
        "labels up to 11; the federation has 10 classes",
    ),
    "fewer examples than teacher heads": (
        lambda b: b.data["data"].update(fraction=0.005, seed=1),
        "dataset",
        "fail",
        r"has \d examples for 2 teacher heads",
    ),
    "a class with no example": (
        lambda b: b.npz(_rng.integers(0, 255, (200, 28, 28, 1), dtype=np.uint8), np.arange(200) % 9),
        "dataset",
        "warn",
        r"no example of class\(es\) \[9\]",
    ),
    "too few examples for each head to hold one BatchNorm chunk": (
        lambda b: _first_examples(b, 40),  # 2 heads of about 20 examples each, chunks of 32: all abstain
        "spending",
        "fail",
        r"hospital-1: 2 heads over 40 examples is about 20 per head.*they all abstain with probability ≥ 99",
    ),
    "blank images": (
        lambda b: b.npz(np.full((200, 28, 28, 1), 7, np.uint8), _labels),
        "dataset.images",
        "fail",
        "100 % of the images are blank",
    ),
    "scrambled images (noise)": (
        lambda b: b.npz(_rng.integers(0, 255, (200, 28, 28, 1), dtype=np.uint8), _labels),
        "dataset.images",
        "warn",
        "adjacent pixels correlate only -?0.0",
    ),
    "heads not trained": (
        lambda b: b.data.update(heads=str(b.tmp / "none.safetensors")),
        "heads",
        "fail",
        "no heads file",
    ),
    "heads for another head count": (
        lambda b: _heads(b, 1),
        "heads",
        "fail",
        "holds 1 heads over 10 classes; federation.yaml gives hospital-1 2 heads",
    ),
    "heads for another backbone's feature size": (
        lambda b: _heads_over_features(b, 7),
        "heads",
        "fail",
        r"heads over 7-d features, but the backbone '[^']+' gives \d+-d features",
    ),
    "guardian unreachable": (
        lambda b: b.data.update(guardian_address=f"127.0.0.1:{free_port()}"),
        "guardian",
        "fail",
        "cannot reach guardian at 127.0.0.1:\\d+ over mutual TLS",
    ),
    "student address that reaches another party": (
        lambda b: b.data.update(student_address=b.live.guardian_address),
        "student",
        "fail",
        "Hostname Verification Check failed",
    ),
    "federation.yaml that differs from the guardian's and student's": (
        lambda b: b.federation(lambda c: c["quorum"].update(vote_deadline_s=99)),
        "guardian",
        "fail",
        "runs federation config [0-9a-f]{16}…, this site has [0-9a-f]{16}…",
    ),
    "local ε cap that cannot be met at the federation's δ and the record's order": (
        lambda b: b.data["cap"].update(epsilon=0.5),
        "local_cap",
        "fail",
        r"cannot be met at order 1\.65",
    ),
    "local ε cap below one batch": (
        lambda b: b.data["cap"].update(epsilon=20.0),
        "local_cap",
        "fail",
        "not even one more fits",
    ),
    "local ε cap below the federation's plan": (
        lambda b: b.data["cap"].update(epsilon=40.0),
        "local_cap",
        "fail",
        "stops this party after 2 of those 4 batches .* covering this federation takes a cap of ε 57.33",
    ),
    "local ε cap below the one federation.yaml declares for the party": (
        lambda b: b.data["cap"].update(epsilon=57.0),
        "local_cap",
        "fail",
        "stops this party after 3 of those 4 batches",
    ),
    "cap record of another federation": (
        _cap_of_another_federation,
        "local_cap",
        "fail",
        "written under another federation config",
    ),
    "no cap record": (
        lambda b: Path(b.data["cap"]["record"]).unlink(),
        "local_cap",
        "fail",
        "does not exist",
    ),
    "lifetime budget that cannot take the federation's plan": (
        _small_lifetime,
        "lifetime",
        "fail",
        "this federation's plan may charge up to .* it does not fit the limit's RDP",
    ),
}


# cases that more checks than the table's must catch: case -> [(check, status, what its detail must say)]
ALSO_CAUGHT_BY: dict[str, list[tuple[str, str, str]]] = {
    "federation.yaml that differs from the guardian's and student's": [
        ("student", "fail", "runs federation config [0-9a-f]{16}…, this site has [0-9a-f]{16}…"),
    ],
    "heads for another backbone's feature size": [
        ("heads", "fail", "retrain them on this federation's backbone")
    ],
}


def test_a_correct_site_passes_every_check(site: Path, tmp_path: Path) -> None:
    report = run_preflight(site, out_dir=tmp_path)
    assert report.ok, report.text()
    assert {c.status for c in report.checks} == {"ok"}, report.text()
    names = [c.name for c in report.checks]
    assert set(names) >= {
        "certificate.chain",
        "key.permissions",
        "backbone",
        "heads",
        "guardian",
        "local_cap",
    }
    grid = tmp_path / f"{PARTY}-dataset.png"
    assert grid.stat().st_size > 1000
    labels = party_examples(TeacherSettings.load(site))[1]
    assert (
        next(c for c in report.checks if c.name == "dataset").data["per_class"]
        == np.bincount(labels, minlength=10).tolist()
    )
    assert "ready to go live" in report.text() and "FAIL" not in report.text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_documented_misconfiguration_is_caught(
    site: Path, live_parties, tmp_path: Path, case: str
) -> None:
    # Prepare
    make, name, status, says = CASES[case]
    broken = Broken(live_parties, tmp_path, party="hospital-2" if case == "revoked certificate" else PARTY)
    make(broken)
    # Execute
    report = run_preflight(broken.write(), out_dir=tmp_path / "out", timeout=5)
    # Assert
    check = next((c for c in report.checks if c.name == name), None)
    assert check is not None and check.status == status, report.text()
    assert re.search(says, check.detail), check.detail
    assert check.fix, f"{name} says what is wrong but not how to fix it"
    assert report.ok is (status == "warn" and not report.failed), report.text()
    for other, other_status, other_says in ALSO_CAUGHT_BY.get(case, []):
        also = next((c for c in report.checks if c.name == other), None)
        assert also is not None and also.status == other_status, report.text()
        assert re.search(other_says, f"{also.detail} fix: {also.fix}"), (also.detail, also.fix)


def test_the_documented_table_lists_exactly_the_tested_cases() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("## Preflight", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    documented = {cells[1].strip(): (cells[2].strip().strip("`"), cells[3].strip()) for cells in rows[1:]}
    assert documented == {case: (name, status) for case, (_, name, status, _) in CASES.items()}


def test_cli_reports_failures_with_exit_2(site: Path, capc, tmp_path: Path) -> None:
    broken = yaml.safe_load(site.read_text())
    broken["guardian_address"] = f"127.0.0.1:{free_port()}"
    path = site.with_name("hospital-1-broken.yaml")
    path.write_text(yaml.safe_dump(broken))
    args = ("teacher", "preflight", "--site", str(path), "--out", str(tmp_path), "--timeout", "2")
    bad = capc(*args, "--format", "json", timeout=120)
    assert bad.returncode == 2
    report = json.loads(bad.stdout)
    assert report["ok"] is False and report["counts"]["fail"] == 1
    failed = next(c for c in report["checks"] if c["status"] == "fail")
    assert failed["name"] == "guardian" and failed["fix"].startswith("check guardian_address")
    assert "error: preflight: 1 check(s) failed: guardian" in bad.stderr and "Traceback" not in bad.stderr
