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


def test_progress_publishes_the_guarantee_beside_the_spend() -> None:
    """``/api/v1/progress``'s ``epsilon`` is the plan's guarantee — every planned release's charge — whatever
    was spent so far: before the guardian first answered (the plan's own figure), and after, the figure its
    ledger reports; the realised spend travels beside it as ``epsilon_spent``."""
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry

    from capc_common.federation.releases import planned_figures, protocol_for
    from capc_common.privacy.analysis import epsilon_at_order
    from capc_services.common.admin import build_admin_app
    from capc_services.student.release_app import progress_router
    from capc_services.student.releases import ReleaseProgress, release_privacy

    budget = {"epsilon": 8.0, "delta": 1e-5, "order": 10}
    config = FederationConfig.from_dict(
        federation_dict(mechanism={**PROJECTED, "projection": None}, budget=budget)
    )
    protocol = protocol_for(config, dim=4)
    progress = ReleaseProgress(rounds=protocol.rounds)
    token = "t" * 32
    router = progress_router(
        progress, noise="SystemNoise", privacy=lambda: release_privacy(config, protocol, progress)
    )
    app = build_admin_app(
        title="student", token=token, readiness=dict, registry=CollectorRegistry(), routers=[router]
    )
    client = TestClient(app, base_url="http://localhost")

    def read() -> dict:
        return client.get("/api/v1/progress", headers={"Authorization": f"Bearer {token}"}).json()

    planned = protocol.rounds * protocol.release_rdp(10)
    guarantee = float(epsilon_at_order(10, planned, delta=1e-5))  # computed apart from the code under test
    before = read()
    assert before["epsilon"] == pytest.approx(guarantee, rel=1e-12) and before["epsilon_spent"] == 0.0
    # Two of the planned releases charged, as the guardian's ledger reports them.
    spent = float(epsilon_at_order(10, 2 * protocol.release_rdp(10), delta=1e-5))
    progress.ledger = {**planned_figures(protocol, config.budget), "releases": 2, "epsilon_spent": spent,
                       "rdp_spent": 2 * protocol.release_rdp(10), "head": "0" * 64, "entries": 6}  # fmt: skip
    progress.rounds_done = 2
    after = read()
    assert after["epsilon"] == pytest.approx(guarantee, rel=1e-12)
    assert after["epsilon_spent"] == pytest.approx(spent, rel=1e-12) and 0 < spent < guarantee
    assert "guarantee" in after["epsilon_note"] and after["rounds_done"] == 2
