"""A configuration that could never run is refused at start by every party, with the field to fix, before
anything is created (the campaign's guardian created a ledger on a backbone sha of all zeros)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from sites_harness import SCATTER_28_SHA256, funded_config, guardian_settings

from capc_common.errors import CapcError, InputError
from capc_common.federation import FederationConfig, check_runnable
from capc_common.models import load_backbone
from capc_services.guardian.app import serve as serve_guardian
from capc_services.student.app import run as run_student
from capc_services.student.settings import StudentSettings
from capc_services.teacher.app import serve as serve_teacher
from capc_services.teacher.settings import TeacherSettings

QUERIES = funded_config().queries.model_dump()
ZEROS = {"name": "scatter-28x28x1", "sha256": "0" * 64}
BAD = {
    "backbone sha of all zeros": ({"backbone": ZEROS}, r"backbone.*SHA-256"),
    "unknown backbone": ({"backbone": {**ZEROS, "name": "resnet-none"}}, r"no backbone 'resnet-none'"),
    "unknown generator": ({"queries": {**QUERIES, "generator": "fractals"}}, r"unknown generator 'fractals'"),
    "3 channels for 28x28x1": ({"queries": {**QUERIES, "channels": 3}}, r"takes 28x28x1 images.*28x28x3"),
    "fewer queries than one chunk": ({"queries": {**QUERIES, "total": 8}}, r"queries\.total 8 is below"),
}  # fmt: skip


def _federation(tmp_path: Path, change: dict[str, Any]) -> Path:
    data = funded_config().model_dump(mode="json")
    data.update(change)
    path = tmp_path / "federation.yaml"
    FederationConfig.from_dict(data).save(path)  # each field is valid on its own
    return path


def test_the_test_federation_pins_the_shipped_backbone() -> None:
    assert load_backbone("scatter-28x28x1").sha256 == SCATTER_28_SHA256
    runnable = check_runnable(funded_config())
    assert runnable.backbone.sha256 == SCATTER_28_SHA256 and runnable.protocol is None
    with pytest.raises(InputError, match="query batches, not a release protocol"):
        runnable.release_protocol()


def test_the_start_up_check_hands_over_the_release_protocol_it_built(
    pki: Path, tmp_path: Path, token_file: Path
) -> None:
    """Building DPPL-Public's protocol featurises its whole public pool: the check's protocol is the one the
    guardian runs (before, every party built it twice)."""
    from capc_common.aggregation import party_noise
    from capc_services.common.party import PartyRuntime
    from capc_services.guardian.app import _core, open_ledger

    data = funded_config().model_dump(mode="json")
    data["mechanism"] = {"name": "dppl-public", "rho": 0.2, "pool_size": 8, "per_class": 2}
    federation = tmp_path / "federation.yaml"
    FederationConfig.from_dict(data).save(federation)
    settings = guardian_settings(pki, tmp_path, token_file, federation)
    party = PartyRuntime(settings, role="guardian")
    protocol = party.runnable.release_protocol()
    assert protocol.rounds == 1 and protocol.length == party.config.classes * 8
    with open_ledger(settings) as ledger:
        core, _, _ = _core(party, ledger, party_noise("guardian", seed=None))
        assert core.protocol is protocol


@pytest.mark.parametrize("role", ["guardian", "student", "teacher"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_every_party_refuses_a_federation_that_cannot_run(
    pki: Path, tmp_path: Path, token_file: Path, role: str, case: str
) -> None:
    change, message = BAD[case]
    federation = _federation(tmp_path, change)
    tls = {"ca": pki / "ca.crt", "cert": pki / f"{role}.crt", "key": pki / f"{role}.key"}
    admin = {"bind": "127.0.0.1:0", "token_file": token_file}
    if role == "guardian":
        entry, settings = serve_guardian, guardian_settings(pki, tmp_path, token_file, federation)
    elif role == "student":
        entry, settings = run_student, StudentSettings(
            party="student", federation=federation, tls=tls, admin=admin, grpc={"bind": "127.0.0.1:0"},
            guardian_address="127.0.0.1:1", store=tmp_path / "labels.sqlite", output_dir=tmp_path / "out",
        )  # fmt: skip
    else:
        tls = {"ca": pki / "ca.crt", "cert": pki / "hospital-a.crt", "key": pki / "hospital-a.key"}
        entry, settings = serve_teacher, TeacherSettings(
            party="hospital-a", federation=federation, tls=tls, admin=admin, student_address="127.0.0.1:1",
            guardian_address="127.0.0.1:1", heads=tmp_path / "heads.safetensors",
            cap={"epsilon": 30.0, "record": tmp_path / "cap.jsonl"},
        )  # fmt: skip
    with pytest.raises(CapcError, match=message):
        entry(settings, stop=threading.Event())
    created = {p.name for p in tmp_path.iterdir()} - {"federation.yaml", token_file.name}
    assert not created  # no ledger, label store or cap record


THREADS = """
import torch
from threadpoolctl import threadpool_info, threadpool_limits
from capc_services.common.party import apply_threads

def limits():
    blas = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
    return torch.get_num_threads(), sorted(blas)

torch.set_num_threads(3)  # not 1 to start with, whatever the cores and the environment
threadpool_limits(limits=3, user_api="blas")
before = limits()
apply_threads(1)
print(before, limits())
"""


def test_torch_threads_caps_numpy_blas_too() -> None:
    """Parties on one machine set ``torch_threads``: numpy's BLAS (a release party's projections, the public
    basis's eigenvectors) keeps to it as well, or its idle threads spin against the other parties. The
    process raises both to 3 threads first: on one core, or with OMP_NUM_THREADS or OPENBLAS_NUM_THREADS=1
    in the environment, a cap that did nothing would read as one thread too."""
    # Its own environment too: no thread variable of this one's.
    env = {k: v for k, v in os.environ.items() if not (k.endswith("_NUM_THREADS") or k.startswith("OMP_"))}
    out = subprocess.run(
        [sys.executable, "-c", THREADS], capture_output=True, text=True, timeout=120, check=True, env=env
    )
    assert out.stdout == "(3, [3]) (1, [1])\n", out


LAZY = """
import sys
from capc_common.federation import FederationConfig, check_runnable
from capc_common.models import backbone_sha256

data = FederationConfig.from_dict(dict(DATA)).model_dump(mode="json")
data["mechanism"] = {"name": "secagg-dpsgd", "rounds": 2, "noise_multiplier": 2.0, "clip": 0.1,
                     "projection": {"dim": 8, "images": 16, "generators": ["dead_leaves"]}}
data["budget"]["epsilon"] = 300.0
data["backbone"] = {"name": "hybrid-28x28x1", "sha256": backbone_sha256("hybrid-28x28x1")}
config = FederationConfig.from_dict(data)
guardian = check_runnable(config, model=False)
print("torch" in sys.modules, guardian.release_protocol().length)
first = guardian.backbone  # loaded on first use, once
print("torch" in sys.modules, first is guardian.backbone, first.sha256 == config.backbone.sha256)
print(check_runnable(config, model=True).release_protocol().length)
"""


def test_a_release_guardian_checks_the_backbone_without_loading_it() -> None:
    """The guardian of a secure-aggregation DP-SGD federation never featurises (the parties and the student
    compute the public basis): its start-up check reads the backbone's file, not the model, so it never
    imports torch (230 MB resident); a party that asks for the model loads it then, once."""
    code = LAZY.replace("dict(DATA)", repr(funded_config().model_dump(mode="json")))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    no_torch, loaded, length = out.stdout.splitlines()
    assert no_torch == f"False {10 * 9}"  # 10 classes x (8 coordinates + bias)
    assert loaded == "True True True" and length == "90"


def test_only_a_guardian_that_garbles_keeps_freed_memory(
    pki: Path, tmp_path: Path, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allocator policy pays on the 2PC (capc_common.memory): a guardian of a selection federation sets
    it before its gRPC threads start; one of a release federation (no garbling) hands freed memory back."""
    from capc_common.aggregation import party_noise
    from capc_services.common.party import PartyRuntime
    from capc_services.guardian import app

    calls: list[str] = []
    monkeypatch.setattr(app, "keep_freed_memory", lambda: calls.append("set"))
    for mechanism, expected in (
        ({"name": "dppl", "rho": 0.2}, []),
        ({"threshold": 3, "sigma1": 2.0, "sigma2": 1.5}, ["set"]),
    ):
        calls.clear()
        data = funded_config().model_dump(mode="json")
        data["mechanism"] = mechanism
        federation = tmp_path / f"{len(expected)}-federation.yaml"
        FederationConfig.from_dict(data).save(federation)
        settings = guardian_settings(pki, tmp_path / str(len(expected)), token_file, federation)
        (tmp_path / str(len(expected))).mkdir()
        party = PartyRuntime(settings, role="guardian")
        with app.open_ledger(settings) as ledger:
            app._core(party, ledger, party_noise("guardian", seed=None))
        assert calls == expected, mechanism
