"""A release federation's student fails visibly when its work thread does: its progress and readiness say
``failed`` with the reason, and the log has it (it used to catch CapcError alone, so an OSError while it
precomputed the public basis ended the thread and left the student serving as if it waited for teachers)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from sites_harness import federation_dict

from capc_common.federation import FederationConfig
from capc_services.common.party import PartyRuntime
from capc_services.student.accounting import noise_label
from capc_services.student.failure import Failure
from capc_services.student.release_app import run_release_student
from capc_services.student.settings import StudentSettings

#: A secagg-dpsgd federation with a public basis for the student to precompute (the schema's other defaults).
PROJECTED = {
    "name": "secagg-dpsgd",
    "rounds": 5,
    "noise_multiplier": 2.0,
    "sampling_rate": 0.1,  # within the fixture's budget
    "projection": {"dim": 4, "generators": ["dead_leaves"], "images": 40},
}


def test_an_os_error_while_precomputing_the_basis_fails_the_student(
    pki: Path, tmp_path: Path, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    federation = tmp_path / "federation.yaml"
    FederationConfig.from_dict(federation_dict(mechanism=PROJECTED)).save(federation)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the feature cache's parent directory should be")
    settings = StudentSettings(
        party="student", federation=federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "student.crt", "key": pki / "student.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file}, grpc={"bind": "127.0.0.1:0"},
        guardian_address="127.0.0.1:1", store=tmp_path / "labels.sqlite", output_dir=tmp_path / "out",
        feature_cache=blocker / "cache",  # the basis is cached there: mkdir raises an OSError
    )  # fmt: skip
    party = PartyRuntime(settings, role="student")
    stop = threading.Event()
    returned: list[Failure | None] = []
    student = threading.Thread(
        target=lambda: returned.append(
            run_release_student(settings, party, stop=stop, noise=noise_label(party.config))
        ),
        daemon=True,
    )
    caplog.set_level(logging.ERROR, logger="capc_services.student.release_app")
    student.start()
    try:
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        progress: dict = {}
        deadline = time.monotonic() + 30
        while progress.get("state") != "failed":
            assert student.is_alive() and time.monotonic() < deadline, f"never failed: {progress}"
            time.sleep(0.2)
            if not party.admin_port:  # 0 until the admin API listens
                continue
            admin = f"http://127.0.0.1:{party.admin_port}"
            progress = httpx.get(f"{admin}/api/v1/progress", headers=headers, timeout=5).json()
        ready = httpx.get(f"{admin}/readyz", headers=headers, timeout=5)  # the token shows why
    finally:
        stop.set()
        student.join(timeout=30)
    assert not student.is_alive()
    assert progress["error"].startswith(("NotADirectoryError", "FileExistsError")), progress
    assert str(blocker) in progress["error"]
    assert ready.status_code == 503 and "failed" in ready.text
    assert returned == [Failure(progress["error"], 2)]  # what `capc student run` exits with (a bad file)
    failed = [r for r in caplog.records if r.getMessage() == "student failed"]
    assert failed and failed[0].error == progress["error"] and failed[0].exc_info is not None
