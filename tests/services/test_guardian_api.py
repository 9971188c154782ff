"""The guardian's admin REST API as the guardian serves it: bounded parameters, problem+JSON errors."""

from __future__ import annotations

from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sites_harness import funded_config

from capc_common.federation import sampler_delta
from capc_common.privacy import SeededNoise
from capc_services.common.party import PartyRuntime
from capc_services.guardian.api import router
from capc_services.guardian.app import open_ledger
from capc_services.guardian.core import Guardian
from capc_services.guardian.settings import GuardianSettings


@pytest.fixture
def served(
    pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path
) -> Iterator[tuple[TestClient, Guardian]]:
    """The admin API over a guardian (whose ledger a test may write batches into)."""
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
        client = TestClient(app, base_url="http://localhost")
        client.headers["Authorization"] = f"Bearer {party.token}"
        yield client, guardian


@pytest.fixture
def client(served: tuple[TestClient, Guardian]) -> TestClient:
    return served[0]


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


def test_the_budget_adds_the_samplers_distance_to_delta(client: TestClient) -> None:
    budget = client.get("/api/v1/budget").json()  # ε = 300 here: the (1 + e^ε) factor makes it large
    assert budget["delta_sampler"] == sampler_delta(funded_config()) > 0
    assert budget["delta_total"] == budget["delta"] + budget["delta_sampler"]


def test_the_batch_history_has_one_row_per_finished_batch(served: tuple[TestClient, Guardian]) -> None:
    """Each batch leaves a reserve, a compute and a settle row (or reserve and release); the dashboard's
    per-batch chart draws one bar per history row, so the history holds exactly the finishing rows: it
    once kept every row but the reservations, and drew 43 bars for 22 batches."""
    client, guardian = served
    ledger = guardian.ledger
    for i in range(5):
        batch = f"q{16 * i:09d}+16"
        ledger.reserve(batch, queries=16, parties=["hospital-a"], mechanism="m", params={},
                       worst_case_rdp=0.05, actor="student")  # fmt: skip
        if i == 3:
            ledger.release(batch, reason="quorum not met", actor="guardian")
            continue
        ledger.begin(batch, computation=f"c{i}", actor="guardian")
        ledger.settle(batch, answered=i, actual_rdp=0.01, actor="guardian", computation=f"c{i}")
    ledger.reserve(
        "q000000080+16",
        queries=16,
        parties=["hospital-a"],
        mechanism="m",
        params={},
        worst_case_rdp=0.05,
        actor="student",
    )  # left open: not finished, so not in the history
    budget = client.get("/api/v1/budget").json()
    rows = client.get("/api/v1/budget/history").json()["batches"]
    assert len(rows) == budget["batches"] + budget["released_batches"] == 5
    assert [r["batch_id"] for r in rows] == [f"q{16 * i:09d}+16" for i in range(5)]
    assert [r["kind"] for r in rows] == ["settle", "settle", "settle", "release", "settle"]
    assert [r["answered"] for r in rows] == [0, 1, 2, 0, 4]
    latest = client.get("/api/v1/budget/history?batches=2").json()["batches"]
    assert [r["batch_id"] for r in latest] == ["q000000048+16", "q000000064+16"]


def test_the_students_row_counts_the_batches_it_opened(served: tuple[TestClient, Guardian]) -> None:
    """The student submits no share sets, so counting those gave its row "batches 0" on the dashboard
    after a whole run; it opens every batch, once each (a repeated open of the same batch is idempotent)."""
    client, guardian = served
    student = guardian.config.student
    size = guardian.config.queries.batch_size
    for batch in ("q000000000+16", "q000000016+16", "q000000000+16"):
        guardian.open_batch(batch_id=batch, count=min(16, size), digest=bytes(32), actor=student)
    parties = client.get("/api/v1/parties").json()["parties"]
    assert parties[student]["role"] == "student" and parties[student]["batches"] == 2
    assert all(p["batches"] == 0 for p in parties.values() if p["role"] == "teacher")
