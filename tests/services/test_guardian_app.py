"""The guardian process entry point: seeded (insecure) noise is announced loudly, its seed never logged."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from capc_common.federation import FederationConfig
from capc_services.guardian.app import serve
from capc_services.guardian.settings import GuardianSettings


def test_insecure_noise_is_announced_without_logging_its_seed(
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
    seed = "do-not-log-this-seed-7f3a"
    settings = GuardianSettings(
        party="guardian",
        federation=federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "guardian.crt", "key": pki / "guardian.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file},
        grpc={"bind": "127.0.0.1:0"},
        ledger=tmp_path / "ledger.sqlite",
        insecure_noise_seed=seed,
    )
    stop = threading.Event()
    stop.set()  # start every server, then shut down at once
    with caplog.at_level(logging.INFO):
        serve(settings, stop=stop)
    assert any("INSECURE" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    for record in caplog.records:
        assert seed not in repr(record.__dict__), record.getMessage()
