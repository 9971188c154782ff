"""The guardian's admin REST API as the guardian serves it: bounded parameters, problem+JSON errors."""

from __future__ import annotations

from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from capc_common.privacy import SeededNoise
from capc_services.common.party import PartyRuntime
from capc_services.guardian.api import router
from capc_services.guardian.app import open_ledger
from capc_services.guardian.core import Guardian
from capc_services.guardian.settings import GuardianSettings


@pytest.fixture
def client(pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path) -> Iterator[TestClient]:
    settings = GuardianSettings(
        party="guardian",
        federation=funded_federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "guardian.crt", "key": pki / "guardian.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file},
        ledger=tmp_path / "ledger.sqlite",
    )
    party = PartyRuntime(settings, role="guardian")
    with open_ledger(settings) as ledger:
        guardian = Guardian(
            config=party.config, ledger=ledger, noise=SeededNoise("api"), metrics=party.metrics
        )
        app = party.admin_app(readiness=lambda: {}, routers=[router(guardian)])
        client = TestClient(app)
        client.headers["Authorization"] = f"Bearer {party.token}"
        yield client


@pytest.mark.parametrize(
    "query",
    ["offset=99999999999999999999", "offset=9223372036854775808", "offset=-1", "limit=0", "limit=1001"],
)
def test_out_of_range_numbers_are_a_422_problem(client: TestClient, query: str) -> None:
    """The campaign's `offset=99999999999999999999` was a 500 with a traceback."""
    reply = client.get(f"/api/v1/ledger?{query}")
    assert reply.status_code == 422, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    body = reply.json()
    assert body["status"] == 422 and body["title"] == HTTPStatus(422).phrase
    assert query.split("=")[0] in body["detail"]


def test_the_largest_offset_sqlite_holds_is_answered(client: TestClient) -> None:
    reply = client.get(f"/api/v1/ledger?offset={2**63 - 1}")
    assert reply.status_code == 200 and reply.json()["entries"] == []


def test_a_missing_token_is_a_401_problem(client: TestClient) -> None:
    reply = client.get("/api/v1/budget", headers={"Authorization": ""})
    assert reply.status_code == 401
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in reply.json()["detail"]
