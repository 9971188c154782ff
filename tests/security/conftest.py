"""Fixtures of the security suite: the ``doors`` federation (``doors_harness.py`` says what it holds)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from doors_harness import (
    CALLS_PER_PEER,
    FIRST_MESSAGE_S,
    OPTIONS,
    Doors,
    edit_site,
    revoke_and_retire,
)

from capc_services.local.processes import start_party, stop_processes, wait_ready
from capc_services.local.provision import provision


@pytest.fixture(scope="session")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    """The running guardian and student of the suite (one per test process), stopped at the end."""
    layout, _, endpoints = provision(tmp_path_factory.mktemp("doors") / "federation", OPTIONS)
    config = revoke_and_retire(layout)
    metrics = layout.root / "tokens" / "metrics.token"
    metrics.write_text(secrets.token_urlsafe(32))
    metrics.chmod(0o600)
    limits = {"first_message_s": FIRST_MESSAGE_S, "max_calls_per_peer": CALLS_PER_PEER}
    edit_site(layout, "guardian", grpc=limits, admin={"metrics_token_file": str(metrics)})
    edit_site(layout, "student", grpc=limits)
    processes = {
        role: start_party(layout, party=role, role=role, admin_port=endpoints.admin[role])
        for role in ("guardian", "student")
    }
    try:
        wait_ready(layout, list(processes.values()), timeout=120)
        yield Doors(layout, config, endpoints, processes, metrics.read_text())
    finally:
        stop_processes(list(processes.values()), grace=10)
