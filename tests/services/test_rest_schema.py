"""Schemathesis against the admin apps as each party serves them: every operation of the OpenAPI schema,
with generated and boundary inputs, with and without the bearer token, must answer as documented (status
code, content type, body schema) and never with a server error (issue 15's REST campaign)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from sites_harness import federation_dict, guardian_settings

from capc_common.aggregation import party_noise
from capc_common.federation import FederationConfig
from capc_common.federation.releases import protocol_for
from capc_common.learn.heads import HeadRecipe, train_heads
from capc_common.mechanisms import HeadsVoter
from capc_common.models import extract_features
from capc_common.privacy import BudgetLedger
from capc_common.synth import generate
from capc_services.common.party import PartyRuntime
from capc_services.guardian.api import router as guardian_router
from capc_services.guardian.app import open_ledger
from capc_services.guardian.core import Guardian
from capc_services.guardian.membership import membership_router
from capc_services.guardian.releases import ReleaseGuardian
from capc_services.student.app import progress_router
from capc_services.student.guardian_client import GuardianClient
from capc_services.student.links import TeacherRegistry
from capc_services.student.release_app import progress_router as release_progress_router
from capc_services.student.releases import ReleaseProgress, release_privacy
from capc_services.student.scheduler import Scheduler
from capc_services.student.settings import StudentSettings
from capc_services.student.store import LabelStore
from capc_services.teacher.app import status_router
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.client import TeacherLinks
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.worker import TeacherWorker

NOWHERE = "127.0.0.1:1"  # the apps are exercised alone: no peer is ever dialled
ADMIN = {"bind": "127.0.0.1:0", "allowed_hosts": ["testserver"]}  # the ASGI client's host name


def _site(pki: Path, party: str, token_file: Path) -> dict[str, Any]:
    return {
        "party": party,
        "tls": {"ca": pki / "ca.crt", "cert": pki / f"{party}.crt", "key": pki / f"{party}.key"},
        "admin": {**ADMIN, "token_file": token_file},
    }


@contextmanager
def _guardian_site(
    pki: Path, tmp_path: Path, token_file: Path, federation: Path
) -> Iterator[tuple[PartyRuntime, BudgetLedger]]:
    """A guardian party of ``federation`` and its opened ledger, as the guardian's app sets them up."""
    settings = guardian_settings(
        pki, tmp_path, token_file, federation, admin={**ADMIN, "token_file": token_file}
    )
    party = PartyRuntime(settings, role="guardian")
    with open_ledger(settings) as ledger:
        yield party, ledger


@pytest.fixture
def guardian_app(
    pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path
) -> Iterator[tuple[FastAPI, str]]:
    with _guardian_site(pki, tmp_path, token_file, funded_federation) as (party, ledger):
        guardian = Guardian(
            config=party.config, ledger=ledger, noise=party_noise("guardian"), metrics=party.metrics
        )
        ledger.reserve(
            "q000000000+32", queries=32, parties=["hospital-a"], mechanism="confident-gnmax", params={},
            worst_case_rdp=1.0, actor="student",
        )  # fmt: skip
        ledger.settle("q000000000+32", answered=7, actual_rdp=0.5, actor="guardian")
        membership = membership_router(config=party.config, ledger=ledger, on_change=lambda: None)
        yield _authorised(
            party, party.admin_app(readiness=dict, routers=[guardian_router(guardian), membership])
        )


@pytest.fixture
def student_app(
    pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path
) -> Iterator[tuple[FastAPI, str]]:
    settings = StudentSettings(
        **_site(pki, "student", token_file), federation=funded_federation, guardian_address=NOWHERE,
        store=tmp_path / "labels.sqlite", output_dir=tmp_path / "out",
    )  # fmt: skip
    party = PartyRuntime(settings, role="student")
    store = LabelStore(settings.store, config_hash=party.config_hash)
    registry = TeacherRegistry()
    guardian = GuardianClient(
        config=party.config, tls=party.tls, address=NOWHERE, noise=party_noise("student"), timeout=1
    )
    scheduler = Scheduler(
        config=party.config, store=store, registry=registry, guardian=guardian, metrics=party.metrics
    )
    yield _authorised(
        party,
        party.admin_app(readiness=dict, routers=[progress_router(scheduler, registry, noise="SystemNoise")]),
    )
    guardian.close()
    store.close()


@pytest.fixture
def release_federation(tmp_path: Path) -> Path:
    """A saved federation.yaml of the release family (DP prototypes)."""
    path = tmp_path / "federation.yaml"
    FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl", "rho": 0.05})).save(path)
    return path


@pytest.fixture
def release_guardian_app(
    pki: Path, tmp_path: Path, token_file: Path, release_federation: Path
) -> Iterator[tuple[FastAPI, str]]:
    with _guardian_site(pki, tmp_path, token_file, release_federation) as (party, ledger):
        protocol = protocol_for(party.config, dim=party.backbone.feature_dim, backbone=party.backbone)
        guardian = ReleaseGuardian(
            config=party.config, ledger=ledger, noise=party_noise("guardian"), protocol=protocol,
            metrics=party.metrics,
        )  # fmt: skip
        for teacher, seed in zip(party.config.teacher_names, (b"\1", b"\2"), strict=True):
            guardian.submit_contribution(
                release_id="r0", round=0, party=teacher, seed=seed * 16, length=protocol.length
            )
        guardian.release(release_id="r0", round=0, parties=party.config.teacher_names, actor="student")
        yield _authorised(party, party.admin_app(readiness=dict, routers=[guardian_router(guardian)]))


@pytest.fixture
def release_student_app(
    pki: Path, tmp_path: Path, token_file: Path, release_federation: Path
) -> tuple[FastAPI, str]:
    settings = StudentSettings(
        **_site(pki, "student", token_file), federation=release_federation, guardian_address=NOWHERE,
        store=tmp_path / "labels.sqlite", output_dir=tmp_path / "out",
    )  # fmt: skip
    party = PartyRuntime(settings, role="student")
    protocol = protocol_for(party.config, dim=party.backbone.feature_dim, backbone=party.backbone)
    progress = ReleaseProgress(rounds=3, rounds_done=1, rdp_spent=0.25, last_parties=["hospital-a"])
    router = release_progress_router(
        progress, noise="SystemNoise", privacy=lambda: release_privacy(party.config, protocol, progress)
    )
    return _authorised(party, party.admin_app(readiness=dict, routers=[router]))


@pytest.fixture
def teacher_app(pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path) -> tuple[FastAPI, str]:
    settings = TeacherSettings(
        **_site(pki, "hospital-a", token_file), federation=funded_federation, student_address=NOWHERE,
        guardian_address=NOWHERE, heads=tmp_path / "heads.safetensors",
        cap={"epsilon": 30.0, "record": tmp_path / "cap.jsonl"},
    )  # fmt: skip
    party = PartyRuntime(settings, role="teacher", model=True)
    images = generate("dead_leaves", seed=3, start=0, count=32, height=28, width=28, channels=1)
    features = extract_features(party.backbone, images, bn_batch=16, mode="current")
    heads = train_heads(
        features,
        np.arange(32) % 10,
        owners=np.arange(32) % 2,
        heads=2,
        classes=10,
        recipe=HeadRecipe(steps=5),
    )
    cap = LocalCap(
        LocalCap.init(settings.cap.record, config=party.config), config=party.config, epsilon_cap=30.0
    )
    worker = TeacherWorker(
        config=party.config,
        voter=HeadsVoter(party.backbone, heads, classes=party.config.classes),
        cap=cap,
        metrics=party.metrics,
    )
    links = TeacherLinks(
        config=party.config, party="hospital-a", tls=party.tls, student_address=NOWHERE,
        guardian_address=NOWHERE, worker=worker,
    )  # fmt: skip
    return _authorised(party, party.admin_app(readiness=dict, routers=[status_router(worker, links, cap)]))


def _authorised(party: PartyRuntime, app: FastAPI) -> tuple[FastAPI, str]:
    return app, party.token


def _fuzz(app_and_token: tuple[FastAPI, str]) -> None:
    """Every operation, generated inputs, once with the admin token (the documented 200s and 422s) and once
    without it (401s); each response checked against the schema (status, content type, body)."""
    app, token = app_and_token
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy())
    def run(case: Any) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"})
        case.call_and_validate(headers={"Authorization": ""})

    run()


def test_guardian(guardian_app: tuple[FastAPI, str]) -> None:
    _fuzz(guardian_app)


def test_student(student_app: tuple[FastAPI, str]) -> None:
    _fuzz(student_app)


def test_release_guardian(release_guardian_app: tuple[FastAPI, str]) -> None:
    _fuzz(release_guardian_app)


def test_release_student(release_student_app: tuple[FastAPI, str]) -> None:
    _fuzz(release_student_app)


def test_teacher(teacher_app: tuple[FastAPI, str]) -> None:
    _fuzz(teacher_app)
