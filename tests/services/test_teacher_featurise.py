"""A release party's backbone work in a child process: the serving process gets the same features and basis
it computed itself before, and the child's refusals as the same errors."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from sites_harness import federation_dict, teacher_settings

from capc_common.errors import InputError
from capc_common.federation import FederationConfig, check_runnable
from capc_common.models import backbone_sha256
from capc_common.synth import generate
from capc_services.teacher.featurise import featurise_apart
from capc_services.teacher.train import party_examples, record_features

RECORDS = 150


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A secure-aggregation DP-SGD federation on the shipped hybrid backbone (a small public basis, computed
    once into the site's shared cache) and a hospital's 150 labelled images."""
    tmp = tmp_path_factory.mktemp("featurise")
    mechanism = {
        "name": "secagg-dpsgd", "rounds": 2, "noise_multiplier": 2.0, "clip": 0.1,
        "projection": {"dim": 8, "images": 32, "generators": ["dead_leaves"], "seed": 7},
    }  # fmt: skip
    data = federation_dict(
        mechanism=mechanism,
        budget={"epsilon": 300.0, "delta": 1e-5, "order": 10},
        backbone={"name": "hybrid-28x28x1", "sha256": backbone_sha256("hybrid-28x28x1")},
    )
    FederationConfig.from_dict(data).save(tmp / "federation.yaml")
    images = generate("dead_leaves", seed=4, start=0, count=RECORDS, height=28, width=28, channels=1)
    np.savez(tmp / "site.npz", images=images, labels=np.arange(RECORDS) % 10)
    return tmp


def _settings(site: Path, data: Path, **fields: Any) -> Any:
    return teacher_settings(
        site, site / "federation.yaml", {"dataset": f"npz:{data}"}, torch_threads=1,
        feature_cache=site / "public", **fields,
    )  # fmt: skip


def test_the_child_computes_what_the_party_computed_itself(site: Path, tmp_path: Path) -> None:
    """The features bit for bit those of the in-process featurisation, the basis the one the protocol computes
    itself; without a records cache, and with one: written there once, then read back."""
    settings = _settings(site, site / "site.npz")
    config = settings.federation_config
    itself = check_runnable(config, model=True, cache=settings.feature_cache)
    images, _, _ = party_examples(settings)
    expected = record_features(settings, itself.backbone, images)
    basis = itself.release_protocol().precomputed()["basis"]
    written = None
    for records in (None, tmp_path / "records", tmp_path / "records"):
        serving = check_runnable(config, model=False).release_protocol()
        features = featurise_apart(settings.model_copy(update={"records_cache": records}), serving)
        assert features.dtype == np.float32 and features.tobytes() == expected.tobytes()
        assert serving.precomputed()["basis"].tobytes() == basis.tobytes()
        if records is not None:
            (stored,) = records.glob("records-*.npy")
            assert np.load(stored).tobytes() == expected.tobytes()
            assert written in (None, stored.stat().st_mtime_ns)  # the second run read it, wrote nothing
            written = stored.stat().st_mtime_ns


def test_a_refusal_in_the_child_is_the_same_error_in_the_party(site: Path, tmp_path: Path) -> None:
    """What the child refuses (here: a data section naming no file) reaches the serving process as the same
    error and message, not a traceback or a bare exit status."""
    settings = _settings(site, tmp_path / "gone.npz")
    with pytest.raises(InputError) as direct:
        party_examples(settings)
    protocol = check_runnable(settings.federation_config, model=False).release_protocol()
    with pytest.raises(InputError) as apart:
        featurise_apart(settings, protocol)
    assert str(apart.value) == str(direct.value)


def test_the_child_ends_with_its_party_and_leaves_nothing_behind(site: Path, tmp_path: Path) -> None:
    """A party killed (SIGKILL: no clean-up of its own) while its child featurises: the child ends within
    seconds instead of running its work to the end, and the directory it was writing to is gone."""
    settings = _settings(site, site / "site.npz")
    (tmp_path / "settings.json").write_text(settings.model_dump_json())
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "settings.json")], cwd=tmp_path, start_new_session=True
    )
    try:
        child = None
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline and parent.poll() is None:
            found = [
                c
                for c in psutil.Process(parent.pid).children()
                if "teacher.featurise" in " ".join(c.cmdline())
            ]
            child = found[0] if found else None
            time.sleep(0.02)
        assert child is not None, "the party never started its featurising process"
        out = Path(child.cmdline()[-2])
        assert out.is_dir()
        parent.kill()
        parent.wait()
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert gone and not alive, "the featurising process outlived its party by 10 s"
        assert not out.exists()
    finally:
        if parent.poll() is None:
            parent.kill()


#: A party that featurises its site apart (its settings file as argument).
PARENT = """
import sys
from pathlib import Path
from capc_common.federation import check_runnable
from capc_services.teacher.featurise import featurise_apart
from capc_services.teacher.settings import TeacherSettings
settings = TeacherSettings.model_validate_json(Path(sys.argv[1]).read_text())
featurise_apart(settings, check_runnable(settings.federation_config, model=False).release_protocol())
"""
