"""``capc teacher train`` as a hospital runs it: its own ``.npz`` file, the federation's shared backbone."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from capc_cli.main import main
from capc_common.data import load_dataset
from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import party_examples, site_examples

REPO = Path(__file__).resolve().parents[2]
HEADS = 3


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """hospital-a of the compose federation with 3 heads, its data an .npz of 240 Fashion-MNIST images."""
    config = yaml.safe_load((REPO / "deploy" / "compose" / "federation-confident-gnmax.yaml").read_text())
    config["teachers"] = [{"name": name, "heads": HEADS} for name in ("hospital-a", "hospital-b")]
    FederationConfig.from_dict(config).save(tmp_path / "federation.yaml")
    data = load_dataset("fashion-mnist", split="train")
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "hospital-a.npz", images=data.images[:240], labels=data.labels[:240])
    site = {
        "party": "hospital-a",
        "federation": "federation.yaml",
        "tls": {"ca": "certs/ca.crt", "cert": "certs/hospital-a.crt", "key": "certs/hospital-a.key"},
        "admin": {"bind": "127.0.0.1:0", "token_file": "certs/admin.token"},
        "student_address": "127.0.0.1:1",
        "guardian_address": "127.0.0.1:2",
        "heads": "state/heads.safetensors",
        "cap": {"epsilon": 30.0, "record": "state/cap.jsonl"},
        "data": {"dataset": str(tmp_path / "data" / "hospital-a.npz")},
    }
    path = tmp_path / "hospital-a.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def with_data(site: Path, **fields: str) -> Path:
    """The site file with these keys of its ``data:`` section set (``dataset``, ``sha256``)."""
    data = yaml.safe_load(site.read_text())
    data["data"].update(fields)
    site.write_text(yaml.safe_dump(data))
    return site


def test_train_on_the_sites_npz_file(site: Path, capc_json) -> None:
    # `dataset: /abs/path/hospital-a.npz` (a plain path, as docs/operations.md writes it; npz: works too).
    result = capc_json("teacher", "train", "--site", str(site))
    assert result["party"] == "hospital-a" and result["heads"] == HEADS
    # the site's 240 images less its holdout (the default tenth, by each image's keyed hash)
    assert result["examples"] + result["held_out"] == 240 and 10 < result["held_out"] < 40, result
    assert 0.3 < result["train_accuracy"] <= 1.0, result  # 80 images per head, 10 classes
    heads = load_file(site.parent / "state" / "heads.safetensors")
    assert any(array.shape[0] == HEADS for array in heads.values()), {k: v.shape for k, v in heads.items()}


def test_missing_data_in_an_empty_mount_says_how_to_mount_it(site: Path, tmp_path: Path) -> None:
    empty = tmp_path / "mounted-empty"
    empty.mkdir()
    settings = TeacherSettings.load(with_data(site, dataset=f"npz:{empty / 'hospital-a.npz'}"))
    with pytest.raises(InputError, match=rf"The directory {empty} is empty: .*--mount type=bind"):
        party_examples(settings)
    settings = TeacherSettings.load(with_data(site, dataset=str(tmp_path / "not-mounted" / "hospital-a.npz")))
    with pytest.raises(InputError, match=r"not-mounted does not exist: in a container"):
        party_examples(settings)


def test_a_present_file_gets_no_mount_hint(site: Path, tmp_path: Path) -> None:
    corrupt = tmp_path / "data" / "corrupt.npz"
    corrupt.write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot be read") as raised:
        party_examples(TeacherSettings.load(with_data(site, dataset=str(corrupt))))
    assert "--mount" not in str(raised.value)


def test_images_of_another_size_are_refused_with_preflights_advice(site: Path, tmp_path: Path) -> None:
    """32×32 RGB images for a 28×28×1 federation: train said "pick the backbone for this shape", which
    federation.yaml pins; preflight said to convert the images. Both now say the latter, in the same words."""
    from capc_services.teacher.preflight.model import dataset_checks
    from capc_services.teacher.train import train_party_heads

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(240, 32, 32, 3), dtype=np.uint8)
    np.savez(tmp_path / "data" / "rgb.npz", images=images, labels=np.arange(240) % 10)
    settings = TeacherSettings.load(with_data(site, dataset=str(tmp_path / "data" / "rgb.npz")))
    with pytest.raises(InputError) as raised:
        train_party_heads(settings)
    message = str(raised.value)
    assert "images are 32x32x3, the federation's queries are 28x28x1" in message
    assert "capc data import SOURCE --federation federation.yaml --resize" in message
    assert "pick the backbone" not in message and not settings.heads.exists()
    (check,) = dataset_checks(settings, settings.federation_config, out_dir=tmp_path / "preflight")
    assert check.status == "fail" and message == f"{check.detail}; {check.fix}"


def test_serve_train_missing_under_a_release_mechanism_trains_nothing_and_creates_the_record(
    site: Path, capc
) -> None:
    """Compose's hospitals run `teacher serve --train-missing` whatever the mechanism: under secagg-dpsgd
    (compose's default) there are no heads to train, only the cap record to create — once the party's start-up
    checks pass (without its certificates: exit 2 with the reason, and nothing created)."""
    import subprocess
    import sys
    import time

    from capc_services.tls import init_ca, issue_certificate, write_admin_token

    federation = site.parent / "federation.yaml"
    config = yaml.safe_load(federation.read_text())
    secagg = yaml.safe_load((REPO / "deploy" / "compose" / "federation-secagg-dpsgd.yaml").read_text())
    config.update(mechanism=secagg["mechanism"], budget=secagg["budget"])
    FederationConfig.from_dict(config).save(federation)
    record = site.parent / "state" / "cap.jsonl"
    proc = capc("teacher", "serve", "--site", str(site), "--train-missing", timeout=120)
    assert proc.returncode == 2 and "certs/" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not record.exists()
    certs = site.parent / "certs"
    init_ca(certs, name="test")
    issue_certificate(certs, "hospital-a", out_dir=certs)
    write_admin_token(certs / "admin.token")
    serving = subprocess.Popen(
        [sys.executable, "-m", "capc_cli", "teacher", "serve", "--site", str(site), "--train-missing"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not record.exists() and serving.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        serving.kill()  # the record is durable before the party does anything else
        _, stderr = serving.communicate(timeout=60)
    assert record.exists(), stderr
    assert not (site.parent / "state" / "heads.safetensors").exists()
    assert '"kind": "init"' in record.read_text()


def test_training_with_a_records_cache_keeps_the_records_features_and_the_same_heads(site: Path) -> None:
    """With ``records_cache:`` the party keeps its records' per-example features, sharing the scattering
    with its heads' features: the cache holds exactly what a fresh extraction gives, and the heads are the
    same as without the cache."""
    from capc_common.federation import load_shared_backbone
    from capc_common.learn import BackboneFeaturizer
    from capc_common.mechanisms.central import extract_per_example
    from capc_services.teacher.train import record_features, train_party_heads

    plain = TeacherSettings.load(site)
    train_party_heads(plain)
    heads = load_file(plain.heads)
    data = yaml.safe_load(site.read_text())
    data["records_cache"] = "state/records"
    site.write_text(yaml.safe_dump(data))
    settings = TeacherSettings.load(site)
    assert settings.records_cache is not None and not settings.records_cache.exists()
    train_party_heads(settings)
    again = load_file(settings.heads)
    assert again.keys() == heads.keys() and all(np.array_equal(again[k], heads[k]) for k in heads)
    (cached,) = settings.records_cache.iterdir()
    images, _, _ = party_examples(settings)
    backbone = load_shared_backbone(settings.federation_config)
    fresh = extract_per_example(BackboneFeaturizer(backbone), images)
    np.testing.assert_array_equal(np.load(cached), fresh)
    np.testing.assert_array_equal(record_features(settings, backbone, images), fresh)


# --------------------------------------------------------------- the data file pinned by its checksum
def test_the_teacher_refuses_a_data_file_other_than_the_one_its_site_pins(site: Path, capc) -> None:
    npz = Path(yaml.safe_load(site.read_text())["data"]["dataset"])
    pinned = hashlib.sha256(npz.read_bytes()).hexdigest()
    with_data(site, sha256=pinned.upper())  # as some tools print it
    found = site_examples(TeacherSettings.load(site))
    assert len(found.labels) + len(found.holdout_labels) == 240  # the training part and the holdout
    # A copy cut short is still a readable .npz of fewer images: refused before anything is trained.
    whole = npz.read_bytes()
    np.savez(
        npz,
        images=np.load(io.BytesIO(whole))["images"][:100],
        labels=np.load(io.BytesIO(whole))["labels"][:100],
    )
    proc = capc("teacher", "train", "--site", str(site))
    assert proc.returncode == 5, proc.stderr
    assert f"data file {npz} has SHA-256" in proc.stderr and f"data.sha256 is {pinned}" in proc.stderr
    assert "the copy is incomplete or another file" in proc.stderr and "Traceback" not in proc.stderr
    assert not (site.parent / "state" / "heads.safetensors").exists()


def test_a_checksum_pins_one_file_only(site: Path) -> None:
    with_data(site, dataset="folder:/data/xrays", sha256="ab" * 32)
    with pytest.raises(InputError, match=r"data.sha256 pins one file, but dataset 'folder:/data/xrays'"):
        TeacherSettings.load(site)
    with_data(site, dataset="/data/x.npz", sha256="not-a-digest")
    with pytest.raises(InputError, match=r"data.sha256: String should match pattern"):
        TeacherSettings.load(site)


def _verify(site: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`capc data verify --site SITE ARGS` through the CLI's entry point: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exited:
        main(["data", "verify", "--site", str(site), *args])
    out = capsys.readouterr()
    return int(exited.value.code or 0), out.out, out.err


def test_data_verify_checks_the_file_against_the_site(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`capc data verify`, the Kubernetes teacher's init container: exit 0, 2, 4 or 5 with the reason."""
    npz = Path(yaml.safe_load(site.read_text())["data"]["dataset"])
    code, _, err = _verify(site, capsys)
    assert code == 2 and "pins no data.sha256" in err and "sha256sum FILE" in err
    with_data(site, sha256=hashlib.sha256(npz.read_bytes()).hexdigest())
    code, out, err = _verify(site, capsys, "--wait")
    assert code == 0 and out.startswith(f"ok: {npz} has the SHA-256"), err
    npz.write_bytes(npz.read_bytes()[:-1])
    code, _, err = _verify(site, capsys)
    assert code == 5 and "the copy is incomplete" in err
    npz.unlink()
    code, _, err = _verify(site, capsys, "--wait", "--timeout", "0.2")
    assert code == 4 and f"gave up after 0.2 s: waiting for {npz}" in err
