"""Seeded (insecure, test-only) noise is a federation parameter every party sees: in the config hash,
refused by teachers unless their site opts in, loopback-only, and reported on readiness, metrics, the budget
and the model card — and the seed itself is never logged (it would let a reader strip the noise)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from sites_harness import funded_config, guardian_settings

from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_services.common.party import PartyRuntime
from capc_services.guardian.api import router
from capc_services.guardian.app import open_ledger, serve
from capc_services.guardian.core import Guardian
from capc_services.student.app import run
from capc_services.student.settings import StudentSettings
from capc_services.teacher.app import serve as serve_teacher
from capc_services.teacher.settings import TeacherSettings

SEED = "do-not-log-this-seed-7f3a"


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    path = tmp_path / "federation.yaml"
    funded_config(insecure_noise_seed=SEED).save(path)
    return path


def test_the_seed_is_part_of_the_config_hash(seeded: Path) -> None:
    private, test_only = funded_config(), FederationConfig.load(seeded)
    assert test_only.insecure_noise and not private.insecure_noise
    assert test_only.config_hash() != private.config_hash()
    assert "insecure_noise_seed" not in private.canonical_json()  # an unset seed leaves the hash as it was


def _start_and_stop(entry: Callable[..., None], settings: object, caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    stop.set()  # start every server, then shut down at once
    with caplog.at_level(logging.INFO):
        entry(settings, stop=stop)


def _assert_announced_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert any("INSECURE" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    for record in caplog.records:
        assert SEED not in repr(record.__dict__), record.getMessage()


def test_guardian(
    pki: Path, tmp_path: Path, token_file: Path, seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _start_and_stop(serve, guardian_settings(pki, tmp_path, token_file, seeded), caplog)
    _assert_announced_not_logged(caplog)


def test_student(
    pki: Path, tmp_path: Path, token_file: Path, seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = StudentSettings(
        party="student",
        federation=seeded,
        tls={"ca": pki / "ca.crt", "cert": pki / "student.crt", "key": pki / "student.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file},
        grpc={"bind": "127.0.0.1:0"},
        guardian_address="127.0.0.1:1",  # nobody listens: the scheduler gives up at once
        store=tmp_path / "labels.sqlite",
        output_dir=tmp_path / "published",
        connect_timeout_s=0.2,
    )
    _start_and_stop(run, settings, caplog)
    _assert_announced_not_logged(caplog)


def test_a_teacher_refuses_unless_its_site_opts_in(
    pki: Path, tmp_path: Path, token_file: Path, seeded: Path
) -> None:
    site = {
        "party": "hospital-a",
        "federation": seeded,
        "tls": {"ca": pki / "ca.crt", "cert": pki / "hospital-a.crt", "key": pki / "hospital-a.key"},
        "admin": {"bind": "127.0.0.1:0", "token_file": token_file},
        "student_address": "127.0.0.1:1",
        "guardian_address": "127.0.0.1:1",
        "heads": tmp_path / "missing-heads.safetensors",
        "cap": {"epsilon": 30.0, "record": tmp_path / "cap.jsonl"},
    }
    with pytest.raises(InputError, match=r"NOT private.*allow_insecure_noise: true"):
        serve_teacher(TeacherSettings(**site), stop=threading.Event())
    # Opted in, it gets past that check (and, with its cap record made, stops at the next: it has no heads).
    from capc_common.federation import FederationConfig
    from capc_services.teacher.cap import LocalCap

    LocalCap.init(tmp_path / "cap.jsonl", config=FederationConfig.load(seeded))
    with pytest.raises(InputError, match="missing-heads"):
        serve_teacher(TeacherSettings(**site, allow_insecure_noise=True), stop=threading.Event())


@pytest.mark.parametrize(
    "site",
    [
        {"grpc": {"bind": "0.0.0.0:0"}},
        {"admin": {"bind": "0.0.0.0:0", "token_file": None, "allow_remote": True, "tls": True}},
    ],
)
def test_every_listener_stays_on_loopback(
    pki: Path, tmp_path: Path, token_file: Path, seeded: Path, site: dict[str, dict[str, object]]
) -> None:
    if "admin" in site:
        site["admin"]["token_file"] = token_file
    with pytest.raises(InputError, match=r"loopback only, but (grpc|admin)\.bind 0\.0\.0\.0:0 is not"):
        serve(guardian_settings(pki, tmp_path, token_file, seeded, **site), stop=threading.Event())


def test_readiness_metrics_and_budget_say_so(
    pki: Path, tmp_path: Path, token_file: Path, seeded: Path
) -> None:
    settings = guardian_settings(pki, tmp_path, token_file, seeded)
    party = PartyRuntime(settings, role="guardian")
    with open_ledger(settings) as ledger:
        from capc_common.aggregation import party_noise

        noise = party_noise("guardian", seed=party.config.mechanism.insecure_noise_seed)
        guardian = Guardian(config=party.config, ledger=ledger, noise=noise, metrics=party.metrics)
        client = TestClient(
            party.admin_app(readiness=dict, routers=[router(guardian)]), base_url="http://localhost"
        )
        client.headers["Authorization"] = f"Bearer {party.token}"
        ready = client.get("/readyz").json()
        assert ready["ready"] and "INSECURE" in ready["checks"]["noise"]["detail"]
        assert "capc_insecure_noise 1.0" in client.get("/metrics").text
        budget = client.get("/api/v1/budget").json()
        assert (budget["noise"], budget["noise_secure"]) == ("SeededNoise", False)
    assert (
        "capc_insecure_noise 0.0"
        in generate_latest(
            PartyRuntime(
                guardian_settings(pki, tmp_path, token_file, _private(tmp_path)), role="guardian"
            ).metrics.registry
        ).decode()
    )


def _private(tmp_path: Path) -> Path:
    path = tmp_path / "private.yaml"
    funded_config().save(path)
    return path
