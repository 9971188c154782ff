"""Party entry points with seeded (insecure, test-only) noise: each announces it loudly and never logs the
seed, since anyone reading the log could then regenerate and strip that party's noise."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from capc_services.guardian.app import serve
from capc_services.guardian.settings import GuardianSettings
from capc_services.student.app import run
from capc_services.student.settings import StudentSettings


def _start_and_stop(entry: Callable[..., None], settings: object, caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    stop.set()  # start every server, then shut down at once
    with caplog.at_level(logging.INFO):
        entry(settings, stop=stop)


def _assert_announced_not_logged(caplog: pytest.LogCaptureFixture, seed: str) -> None:
    assert any("INSECURE" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    for record in caplog.records:
        assert seed not in repr(record.__dict__), record.getMessage()


def test_guardian(
    pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seed = "do-not-log-this-seed-7f3a"
    settings = GuardianSettings(
        party="guardian",
        federation=funded_federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "guardian.crt", "key": pki / "guardian.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file},
        grpc={"bind": "127.0.0.1:0"},
        ledger=tmp_path / "ledger.sqlite",
        insecure_noise_seed=seed,
    )
    _start_and_stop(serve, settings, caplog)
    _assert_announced_not_logged(caplog, seed)


def test_student(
    pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seed = "do-not-log-this-student-seed-41c9"
    settings = StudentSettings(
        party="student",
        federation=funded_federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "student.crt", "key": pki / "student.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file},
        grpc={"bind": "127.0.0.1:0"},
        guardian_address="127.0.0.1:1",  # nobody listens: the scheduler gives up at once
        store=tmp_path / "labels.sqlite",
        output_dir=tmp_path / "published",
        connect_timeout_s=0.2,
        insecure_noise_seed=seed,
    )
    _start_and_stop(run, settings, caplog)
    _assert_announced_not_logged(caplog, seed)
