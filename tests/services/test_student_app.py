"""The student process entry point: seeded (insecure) threshold noise is announced, its seed never logged."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from capc_common.federation import FederationConfig
from capc_services.student.app import run
from capc_services.student.settings import StudentSettings


def test_insecure_student_noise_is_announced_without_logging_its_seed(
    pki: Path, tmp_path: Path, token_file: Path, federation_dict, caplog: pytest.LogCaptureFixture
) -> None:
    config = FederationConfig.from_dict(
        federation_dict(
            mechanism={"threshold": 3, "sigma1": 2.0, "sigma2": 1.5},
            budget={"epsilon": 300.0, "delta": 1e-5, "order": 10},
        )
    )
    federation = tmp_path / "federation.yaml"
    config.save(federation)
    seed = "do-not-log-this-student-seed-41c9"
    settings = StudentSettings(
        party="student",
        federation=federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "student.crt", "key": pki / "student.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file},
        grpc={"bind": "127.0.0.1:0"},
        guardian_address="127.0.0.1:1",  # nobody listens: the scheduler gives up at once
        store=tmp_path / "labels.sqlite",
        output_dir=tmp_path / "published",
        connect_timeout_s=0.2,
        insecure_noise_seed=seed,
    )
    stop = threading.Event()
    stop.set()  # start every server, then shut down at once
    with caplog.at_level(logging.INFO):
        run(settings, stop=stop)
    assert any("INSECURE" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    for record in caplog.records:
        assert seed not in repr(record.__dict__), record.getMessage()
