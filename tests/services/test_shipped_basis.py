"""``capc federation basis``: the coordinator computes a secagg-dpsgd federation's public basis once, as the
file a party's feature cache reads, and a party whose own cache holds only that file reads it (the teacher's
featurising process and the student alike) instead of computing it, checked against federation.yaml's pin."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sites_harness import federation_dict, teacher_settings

from capc_cli.main import main
from capc_common.errors import IntegrityError
from capc_common.federation import FederationConfig, check_runnable
from capc_common.mechanisms.basis import basis_digest
from capc_common.mechanisms.central import records_digest
from capc_common.models import backbone_sha256
from capc_common.synth import generate
from capc_services.teacher.featurise import Expected, featurise_apart
from capc_services.teacher.train import party_examples

REPO = Path(__file__).resolve().parents[2]
RECORDS = 96
#: A small public basis (64 synthetic images, one per-example pass, 8 directions) on the shipped hybrid
#: backbone: a party that computed it with a feature cache would store their features there.
PROJECTION = {"dim": 8, "images": 64, "generators": ["dead_leaves"], "seed": 7}


def _federation(path: Path, *, sha256: str | None = None, projection: Any = PROJECTION) -> Path:
    """A secagg-dpsgd federation.yaml projecting on ``projection`` (pinned by ``sha256``, if given)."""
    if sha256 is not None:
        projection = {**projection, "sha256": sha256}
    mechanism = {
        "name": "secagg-dpsgd",
        "rounds": 2,
        "noise_multiplier": 2.0,
        "clip": 0.1,
        "projection": projection,
    }
    data = federation_dict(
        mechanism=mechanism,
        budget={"epsilon": 300.0, "delta": 1e-5, "order": 10},
        backbone={"name": "hybrid-28x28x1", "sha256": backbone_sha256("hybrid-28x28x1")},
    )
    FederationConfig.from_dict(data).save(path)
    return path


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The coordinator's run on an unpinned federation (computes, says to pin), then on the pinned one with
    the same directory (reads): both outputs, the pinned federation.yaml and the directory."""
    tmp = tmp_path_factory.mktemp("basis")
    unpinned = _federation(tmp / "unpinned.yaml")
    out = tmp / "coordinator" / "basis"  # created by the command
    first = _basis(unpinned, out)
    pinned = _federation(tmp / "federation.yaml", sha256=first["pin"])
    return {"first": first, "again": _basis(pinned, out), "federation": pinned, "out": out}


def run_capc(*args: str) -> tuple[int, str, str]:
    """``capc ARGS`` through the CLI's entry point, in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), pytest.raises(SystemExit) as exited:
        main(list(args))
    return int(exited.value.code or 0), out.getvalue(), err.getvalue()


def _basis(federation: Path, out: Path) -> Any:
    """``capc federation basis``'s JSON."""
    code, text, err = run_capc(
        "federation", "basis", "--federation", str(federation), "--out", str(out), "--format", "json"
    )
    assert code == 0, err
    return json.loads(text)


def _stored(directory: Path) -> list[str]:
    """The files of a feature cache, its lock files left out."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_the_coordinator_computes_the_basis_once_as_a_cache_file(shipped: dict[str, Any]) -> None:
    first, again, out = shipped["first"], shipped["again"], shipped["out"]
    assert first["computed"] is True and first["pinned"] is False
    assert "pin it first" in first["next"][0] and first["pin"] in first["next"][0]
    # The directory holds the basis alone (not the synthetic images' features it was made from).
    path = Path(first["file"])
    assert _stored(out) == [path.name] and path.name.startswith("array-")
    assert first["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    basis = np.load(path, allow_pickle=False)
    assert basis.dtype == np.float32 and basis.shape[1] == PROJECTION["dim"]
    assert basis_digest(basis) == first["pin"]
    # Pinned, the same directory: read there, not computed again; the same file and figures.
    assert again["computed"] is False and again["pinned"] is True
    assert {k: again[k] for k in ("file", "file_sha256", "pin")} == {
        k: first[k] for k in ("file", "file_sha256", "pin")
    }
    assert any("feature_cache" in step and path.name in step for step in again["next"])


def test_no_projection_or_another_mechanism_is_refused(tmp_path: Path) -> None:
    """Nothing to ship: exit 2 and why, before any basis is computed."""
    plain = _federation(tmp_path / "plain.yaml", projection=None)
    gnmax = REPO / "deploy" / "compose" / "federation-confident-gnmax.yaml"
    for federation, message in ((plain, "no mechanism.projection"), (gnmax, "only secagg-dpsgd")):
        code, _, err = run_capc(
            "federation", "basis", "--federation", str(federation), "--out", str(tmp_path / "o")
        )
        assert code == 2 and err.startswith("error: ") and message in err and "Traceback" not in err
        assert not (tmp_path / "o").exists()


def test_a_basis_not_the_pinned_one_is_refused_and_not_left(tmp_path: Path, shipped: dict[str, Any]) -> None:
    """Another pin: computed into an empty directory and refused (exit 5, an integrity check), the file not
    left for anyone to ship; found in a directory: refused the same way, naming it."""
    wrong = _federation(tmp_path / "wrong.yaml", sha256="0" * 64)
    out = tmp_path / "basis"
    code, _, err = run_capc("federation", "basis", "--federation", str(wrong), "--out", str(out))
    assert code == 5 and "0" * 64 in err and shipped["first"]["pin"] in err and "Traceback" not in err
    assert _stored(out) == []
    code, _, err = run_capc("federation", "basis", "--federation", str(wrong), "--out", str(shipped["out"]))
    assert code == 5 and f"stored in {shipped['out']}" in err and "Traceback" not in err
    assert _stored(shipped["out"]) == [Path(shipped["first"]["file"]).name]  # a file found is not removed


def test_an_unusable_out_directory_is_refused_with_why(tmp_path: Path, shipped: dict[str, Any]) -> None:
    """An --out below a file: exit 2 naming it, no traceback. A federation that pins nothing with an --out
    that already holds array files: refused (exit 2), since the pin to add must come from a basis computed
    here, not from a file found there."""
    (tmp_path / "afile").write_text("x")
    unpinned = _federation(tmp_path / "unpinned.yaml")
    code, _, err = run_capc(
        "federation", "basis", "--federation", str(unpinned), "--out", str(tmp_path / "afile" / "o")
    )
    assert code == 2 and "give a directory path" in err and "Traceback" not in err
    code, _, err = run_capc(
        "federation", "basis", "--federation", str(unpinned), "--out", str(shipped["out"])
    )
    assert code == 2 and "pins no basis" in err and "empty --out" in err and "Traceback" not in err


def _own_cache(tmp_path: Path, shipped: dict[str, Any], name: str) -> Path:
    """A party's own feature cache seeded with the coordinator's file alone (as a hospital copies it)."""
    own = tmp_path / name
    own.mkdir()
    file = Path(shipped["first"]["file"])
    (own / file.name).write_bytes(file.read_bytes())
    return own


def test_a_teacher_with_only_the_shipped_file_reads_it(tmp_path: Path, shipped: dict[str, Any]) -> None:
    """The teacher's featurising process, with the shipped file alone in its own cache: the basis is the
    pinned one, and its cache afterwards holds that file alone: the basis's 64 synthetic images were never
    featurised there (a party that computes the basis with a cache stores their features beside it)."""
    images = generate("dead_leaves", seed=4, start=0, count=RECORDS, height=28, width=28, channels=1)
    np.savez(tmp_path / "site.npz", images=images, labels=np.arange(RECORDS) % 10)
    own = _own_cache(tmp_path, shipped, "teacher-cache")
    settings = teacher_settings(
        tmp_path, shipped["federation"], {"dataset": f"npz:{tmp_path / 'site.npz'}"}, torch_threads=1,
        feature_cache=own,
    )  # fmt: skip
    config = settings.federation_config
    runnable = check_runnable(config, model=False)
    serving = runnable.release_protocol()
    at_start = Expected(
        config.config_hash(), records_digest(party_examples(settings)[0]), runnable.feature_dim
    )
    features = featurise_apart(settings, serving, expected=at_start, stop=threading.Event())
    assert features is not None and 0 < len(features) <= RECORDS  # those the holdout leaves to the federation
    assert basis_digest(serving.precomputed()["basis"]) == shipped["first"]["pin"]
    assert _stored(own) == [Path(shipped["first"]["file"]).name]


def test_the_student_with_only_the_shipped_file_reads_it(tmp_path: Path, shipped: dict[str, Any]) -> None:
    """The student's protocol (as its party builds it: the model not loaded, its site's feature cache)
    precomputes the basis from the shipped file alone; an altered copy is refused, not used."""
    config = FederationConfig.load(shipped["federation"])
    own = _own_cache(tmp_path, shipped, "student-cache")
    protocol = check_runnable(config, model=False, cache=own).release_protocol()
    protocol.precompute()
    assert basis_digest(protocol.precomputed()["basis"]) == shipped["first"]["pin"]
    assert _stored(own) == [Path(shipped["first"]["file"]).name]
    # Another orthonormal basis under the shipped name (a column's sign flipped): refused by its pin.
    altered = tmp_path / "altered"
    altered.mkdir()
    basis = np.load(shipped["first"]["file"], allow_pickle=False).copy()
    basis[:, 0] *= -1
    np.save(altered / Path(shipped["first"]["file"]).name, basis)
    with pytest.raises(IntegrityError, match=shipped["first"]["pin"]):
        check_runnable(config, model=False, cache=altered).release_protocol().precompute()
