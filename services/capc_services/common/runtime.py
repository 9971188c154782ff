"""Process plumbing shared by the three roles: the mTLS gRPC server with health, the admin REST server in
a thread, and a graceful shutdown on SIGTERM/SIGINT.

gRPC runs with the synchronous API and a thread pool. The library's protocol objects (MPC sessions,
the ledger, model inference) are blocking, CPU-bound calls; with threads, a bidirectional stream maps onto
the library's blocking ``Channel`` with two queues, and numpy/torch/AES release the GIL in their kernels.
The asyncio API would need every one of those calls pushed to an executor anyway.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capc_common.errors import InputError, UnavailableError
from capc_services.common.admission import StreamLimits
from capc_services.common.settings import parse_bind
from capc_services.tls import DEFAULT_MESSAGE_BYTES, TlsFiles, grpc_options

_log = logging.getLogger(__name__)


@dataclass
class GrpcServer:
    """A started gRPC server, its health servicer and the port it actually bound."""

    server: grpc.Server
    health: health.HealthServicer
    port: int
    services: tuple[str, ...]

    def stop(self, grace: float) -> None:
        """Report NOT_SERVING, then stop accepting calls and give running ones ``grace`` seconds."""
        for name in ("", *self.services):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.stop(grace).wait(grace + 1)


def start_grpc_server(
    *,
    bind: str,
    tls: TlsFiles,
    register: Sequence[Callable[[grpc.Server], None]],
    services: Sequence[str],
    interceptors: Sequence[grpc.ServerInterceptor],
    max_workers: int = 32,
    max_receive_bytes: int = DEFAULT_MESSAGE_BYTES,
    max_send_bytes: int = DEFAULT_MESSAGE_BYTES,
    limits: StreamLimits | None = None,
) -> GrpcServer:
    """Start a mutual-TLS gRPC server with the standard health service reporting SERVING.

    ``limits`` sets the connection limits (idle connections, handshakes); the per-peer limits are the
    interceptor's (:class:`~capc_services.common.interceptors.AuthInterceptor`).

    ``max_receive_bytes`` is the largest message a caller may send (size it to what the server's callers
    legitimately send): gRPC reads a call's request before the identity check of the interceptor runs, so
    it is also the most any certified party can make this server read before its role is checked.

    Raises:
        InputError: the address cannot be bound.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=list(interceptors),
        options=[
            *grpc_options(receive=max_receive_bytes, send=max_send_bytes, server=True),
            *(limits or StreamLimits()).server_options(),
        ],
        maximum_concurrent_rpcs=max_workers * 4,
    )
    for add in register:
        add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    host, port = parse_bind(bind)
    try:
        bound = server.add_secure_port(f"{host}:{port}", tls.server_credentials())
    except RuntimeError as exc:
        raise InputError(f"cannot bind gRPC to {bind}: {exc}") from None
    if bound == 0:
        raise InputError(f"cannot bind gRPC to {bind}: address in use or not local")
    server.start()
    for name in ("", *services):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    _log.info("gRPC listening", extra={"bind": f"{host}:{bound}"})
    return GrpcServer(server=server, health=health_servicer, port=bound, services=tuple(services))


class AdminServer:
    """Uvicorn serving the admin app from a daemon thread (the main thread runs the party itself).

    Args:
        app: the admin app.
        bind: ``host:port``.
        tls: serve HTTPS with these files' certificate and key (the party's federation identity, which
            admin clients verify against the federation CA); None: plain HTTP (loopback only, see
            :class:`~capc_services.common.settings.AdminSettings`).
    """

    def __init__(self, app: FastAPI, *, bind: str, tls: TlsFiles | None = None) -> None:
        host, port = parse_bind(bind)
        ssl: dict[str, Any] = {}
        if tls is not None:
            tls.check_key()
            ssl = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
        # No websocket routes: ws="none" spares every party importing a websocket implementation at start.
        config = uvicorn.Config(
            app, host=host, port=port, log_config=None, access_log=False, lifespan="off", ws="none", **ssl
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="admin-http", daemon=True)

    def start(self, *, timeout: float = 30.0) -> int:
        """Start serving and return the bound port.

        Raises:
            UnavailableError: uvicorn did not come up within ``timeout`` seconds (e.g. port in use).
        """
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise UnavailableError("the admin HTTP server did not start (is its port already in use?)")
            time.sleep(0.02)
        sockets = self._server.servers[0].sockets
        port: int = sockets[0].getsockname()[1]
        _log.info("admin REST listening", extra={"port": port})
        return port

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for it."""
        self._server.should_exit = True
        self._thread.join(timeout=10)


#: How often a main thread waiting for its stop event wakes to run the signal handlers pending for it.
_SIGNAL_CHECK_S = 0.5


class _StopEvent(threading.Event):
    """An event whose untimed ``wait`` wakes every :data:`_SIGNAL_CHECK_S` seconds.

    Python runs a signal's handler in the main thread, once that thread executes bytecode again. The kernel
    may deliver the signal to any thread of the process: normally it interrupts the main thread's wait, but
    after the process was stopped and continued (SIGSTOP, ^Z, a debugger) it often lands on a gRPC or
    worker thread, and a main thread blocked in an untimed wait never ran the SIGTERM handler — measured: a
    party stopped with SIGSTOP ignored SIGTERM+SIGCONT until SIGKILL, every time. Waking now and then costs
    nothing and lets the handler run.
    """

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            return super().wait(timeout)
        while not super().wait(_SIGNAL_CHECK_S):
            pass
        return True


def stop_event_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (install from the main thread only), whose untimed ``wait`` lets
    the handlers run however the kernel delivered the signal (:class:`_StopEvent`)."""
    event = _StopEvent()

    def _handler(signum: int, frame: Any) -> None:
        del frame
        _log.info("stopping on signal", extra={"signal": signal.Signals(signum).name})
        event.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
    return event
