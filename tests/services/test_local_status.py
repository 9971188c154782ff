"""`capc local status` calls a party running only when its process lives and it reports ready."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sites_harness import funded_config

from capc_cli.commands.local import _status_text
from capc_common.aggregation import party_noise
from capc_services.common.admin import Readiness, build_admin_app
from capc_services.common.metrics import PartyMetrics
from capc_services.common.runtime import AdminServer
from capc_services.local.federation import party_state
from capc_services.local.processes import PartyProcess, pid_alive
from capc_services.student.app import _labelling_check, waiting_text
from capc_services.student.guardian_client import GuardianClient
from capc_services.student.links import TeacherRegistry
from capc_services.student.scheduler import Progress, Scheduler
from capc_services.student.store import LabelStore
from capc_services.tls import TlsFiles, certificate_info


@pytest.fixture
def student_process() -> Iterator[int]:
    """A live process whose command line looks like the student's (what `capc local up` checks)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "capc_cli", "student.yaml"]
    )
    yield proc.pid
    proc.kill()
    proc.wait()


def _admin(progress: Progress) -> tuple[AdminServer, int]:
    app = build_admin_app(
        title="student",
        token="t" * 40,
        readiness=lambda: Readiness({"labelling": _labelling_check(progress, guardian="127.0.0.1:1")}),
        registry=CollectorRegistry(),
    )
    server = AdminServer(app, bind="127.0.0.1:0")
    return server, server.start()


@pytest.mark.parametrize(
    ("state", "expected"),
    [("labelling", "running"), ("reconnecting", "not ready"), ("failed", "failed"), ("published", "running")],
)
def test_the_status_follows_readiness(student_process: int, state: str, expected: str) -> None:
    progress = Progress(
        state=state, error="guardian: connection refused [UNAVAILABLE]" if state != "labelling" else ""
    )
    server, port = _admin(progress)
    try:
        entry: dict[str, Any] = party_state(
            PartyProcess(
                party="student", role="student", pid=student_process, admin_url=f"http://127.0.0.1:{port}"
            ),
            "t" * 40,
        )
    finally:
        server.stop()
    assert entry["state"] == expected and entry["running"] == (expected == "running")
    assert entry["process"] == "alive"
    if expected != "running":
        assert entry["failing"]["labelling"]["state"] == state


def test_a_gone_process_is_not_running() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    entry = party_state(
        PartyProcess(party="student", role="student", pid=gone.pid, admin_url="http://127.0.0.1:1"), "t" * 40
    )
    assert (entry["state"], entry["running"], entry["process"]) == ("not running", False, "not running")


def test_a_student_waiting_for_its_quorum_says_so(pki: Path, tmp_path: Path) -> None:
    """Before the teachers connect the student neither fails nor labels: its progress says what it waits
    for, and `capc local status` prints that instead of nothing (or an error of a past start-up race)."""
    config = funded_config()
    scheduler = Scheduler(
        config=config,
        store=LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash()),
        registry=TeacherRegistry(),
        guardian=GuardianClient(  # never called: no batch opens without the quorum
            config=config,
            tls=TlsFiles(ca=pki / "ca.crt", cert=pki / "student.crt", key=pki / "student.key"),
            address="127.0.0.1:1",
            noise=party_noise("student", seed="waiting"),
        ),
        metrics=PartyMetrics(
            party="student",
            role="student",
            config_hash=config.config_hash(),
            certificate=certificate_info(pki / "student.crt"),
        ),
        connect_timeout=60,
    )
    worker = threading.Thread(target=scheduler.run, daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while scheduler.progress.waiting_for == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        quorum = config.quorum.min_parties
        assert scheduler.progress.waiting_for == quorum and scheduler.progress.state == "labelling"
        waiting = waiting_text(quorum, connected=[], parties=len(config.teachers))
        assert (
            waiting
            == f"for teacher parties: 0 of the {quorum} needed connected (none yet; 2 in the federation)"
        )
        assert waiting_text(quorum, connected=["hospital-a", "hospital-b"][:quorum], parties=2) == ""
        text = _status_text(
            {
                "state_dir": "/x",
                "parties": {},
                "progress": {"state": "labelling", "waiting": waiting, "error": ""},
            }
        )
        assert f"student: labelling, 0 queries asked, 0 answered; waiting {waiting}" in text
    finally:
        scheduler.stop()
        worker.join(timeout=30)
    assert not worker.is_alive() and scheduler.progress.waiting_for == 0


def test_an_exited_process_another_process_has_not_reaped_yet_is_not_running() -> None:
    # The parent starts a child, prints its pid and never waits for it: once killed, the child is a zombie
    # of that parent (what a chaos campaign attached to someone else's federation sees after a kill -9).
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
            "time.sleep(120)']); print(c.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert pid_alive(child)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(child)
        assert Path(f"/proc/{child}").exists()  # still there, unreaped: a zombie, not a live party
    finally:
        parent.kill()
        parent.wait()
