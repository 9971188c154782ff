"""A teacher's ``/readyz`` (no token needed) does not make the party dial its guardian per request: a real
guardian-side gRPC server counts the health checks it receives while the readiness is asked 50 times."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
from doors_harness import Doors

from capc_services.common.interceptors import AuthInterceptor
from capc_services.common.runtime import start_grpc_server
from capc_services.teacher.app import vote_readiness
from capc_services.teacher.client import TeacherLinks
from capc_services.tls import ServerIdentity


class _Counting(grpc.ServerInterceptor):
    """Counts the calls of each method the server receives."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        with self._lock:
            self.calls[details.method] = self.calls.get(details.method, 0) + 1
        return continuation(details)


def server_auth(doors: Doors, party: str) -> AuthInterceptor:
    """The interceptor ``party``'s server installs (its identity: its own certificate and key)."""
    return AuthInterceptor(config=doors.config, policy={}, identity=ServerIdentity.load(doors.files(party)))


def test_readiness_asks_the_guardian_at_most_once_per_period(doors: Doors) -> None:
    counting = _Counting()
    guardian = start_grpc_server(
        bind="127.0.0.1:0",
        tls=doors.files("guardian"),
        register=[],
        services=[],
        interceptors=[counting, server_auth(doors, "guardian")],
    )
    links = TeacherLinks(
        config=doors.config,
        party="hospital-1",
        tls=doors.files("hospital-1"),
        student_address="127.0.0.1:1",  # never dialled here
        guardian_address=f"127.0.0.1:{guardian.port}",
        worker=None,  # type: ignore[arg-type]  # only its work stream uses it
    )
    try:
        readiness = vote_readiness(links, guardian=f"127.0.0.1:{guardian.port}", every_s=60)
        answers = [readiness()["guardian"] for _ in range(50)]
        assert all(ok for ok, _ in answers)
        assert counting.calls == {"/grpc.health.v1.Health/Check": 1}
    finally:
        links.close()
        guardian.stop(0)
