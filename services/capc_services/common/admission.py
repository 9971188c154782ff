"""How much of a gRPC server one peer may hold: open calls per peer, the wait for a stream's first message,
idle connections and TLS handshakes.

The servers are synchronous: each open call other than a callback-driven one holds a worker thread for as
long as it lasts, a stream for its whole life. Without limits, one certified peer opening a few dozen streams
and sending nothing would hold every worker and freeze the party for everyone else (the health service's
``Watch``, the one long-lived call a peer could open on any party, is not served at all:
:data:`~capc_services.common.interceptors.HEALTH_WATCH`). So a server counts each peer's open calls (by its
certificate's name) and refuses more than :attr:`StreamLimits.calls_per_peer` (``RESOURCE_EXHAUSTED``); a
stream whose first message does not arrive within :attr:`StreamLimits.first_message_s` ends
(``DEADLINE_EXCEEDED``); gRPC closes a connection idle (no call) for :attr:`StreamLimits.idle_connection_s`
and a TLS handshake not finished within :attr:`StreamLimits.handshake_s`.

These are the *server's* admission limits; a channel's keepalives, deadlines and retries belong to the clients
(:mod:`capc_services.tls.credentials`).
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc


@dataclass(frozen=True)
class StreamLimits:
    """A gRPC server's admission limits (site file: ``grpc.max_calls_per_peer``, ``grpc.first_message_s``,
    ``grpc.idle_connection_s``).

    Attributes:
        calls_per_peer: most calls one peer (certificate name) may have open at once. A teacher holds one
            work stream and submits one seed at a time, the student one Compute stream and a few batch calls.
        first_message_s: how long a client-streaming call may take to send its first message (a teacher's
            hello, the student's first ``ComputeStart``; both are sent as the stream opens).
        idle_connection_s: a connection with no call for this long is closed (the client reconnects when it
            next calls).
        handshake_s: a TLS handshake must finish within this.
    """

    calls_per_peer: int = 8
    first_message_s: float = 10.0
    idle_connection_s: float = 300.0
    handshake_s: float = 10.0

    def server_options(self) -> tuple[tuple[str, int], ...]:
        """The gRPC server options that enforce the connection limits."""
        return (
            ("grpc.max_connection_idle_ms", round(self.idle_connection_s * 1000)),
            ("grpc.server_handshake_timeout_ms", round(self.handshake_s * 1000)),
        )


class PeerCalls:
    """Each peer's open calls, refused past a limit (thread-safe).

    Args:
        limit: most calls one peer may have open.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def enter(self, peer: str) -> bool:
        """Count one more open call of ``peer``; False (nothing counted) when it already has the limit."""
        with self._lock:
            if self._open[peer] >= self._limit:
                return False
            self._open[peer] += 1
            return True

    def leave(self, peer: str) -> None:
        """One call of ``peer`` ended."""
        with self._lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    def open(self, peer: str) -> int:
        """How many calls ``peer`` has open."""
        with self._lock:
            return self._open[peer]


def admit(calls: PeerCalls, peer: str, context: grpc.ServicerContext, *, method: str) -> None:
    """Count the call against ``peer``'s limit for as long as it lasts, or abort it ``RESOURCE_EXHAUSTED``."""
    if not calls.enter(peer):
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{peer} already has {calls.open(peer)} calls open on this party (grpc.max_calls_per_peer); "
            f"{method} refused: end an idle stream or wait for a call to finish",
        )
    if not context.add_callback(lambda: calls.leave(peer)):  # the call has ended already
        calls.leave(peer)


def first_message(
    requests: Iterator[Any], context: grpc.ServicerContext, *, timeout: float, method: str
) -> Iterator[Any]:
    """``requests`` once its first message arrived within ``timeout`` seconds (the stream is aborted with
    ``DEADLINE_EXCEEDED`` otherwise).

    The synchronous request iterator has no timeout of its own, so a short-lived thread waits for the first
    message; when the deadline passes the call is aborted, which ends that wait too.
    """
    arrived: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)

    def wait() -> None:
        try:
            arrived.put(("message", next(requests)))
        except StopIteration:
            arrived.put(("end", None))
        except Exception as exc:  # the stream failed (cancelled, malformed): the handler sees it
            arrived.put(("error", exc))

    threading.Thread(target=wait, name="first-message", daemon=True).start()
    try:
        kind, value = arrived.get(timeout=timeout)
    except queue.Empty:
        context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"{method}: no first message within {timeout:g} s (grpc.first_message_s); the stream is closed",
        )
    if kind == "end":
        return iter(())
    return _failing(value) if kind == "error" else _chain(value, requests)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _failing(error: BaseException) -> Iterator[Any]:
    """An iterator that raises ``error`` where the handler reads the stream (it reports it as it would)."""
    raise error
    yield  # a generator: the raise happens at the first next()
