"""Protocol round trips, counted where they happen: how many times a party sends and must wait for its peer.

Over a link with round-trip time RTT, a batch or a release costs at least its round trips on the critical
path times RTT, whatever the bandwidth; so they are counted by the code that makes them, never estimated:

* every call a party makes to a peer (:class:`RoundTripInterceptor` on its channels): a unary call is one
  round trip; a stream's opening counts once;
* every turn within a stream — a message received after this side sent (``FrameChannel.turns``, added per
  batch by whoever runs the stream; the student's dispatch of a work item and its wait for the teachers'
  answers, per teacher).

Each party exports them as ``capc_round_trips_total{peer, call}`` on ``/metrics``: ``peer`` is the role
called (``guardian``, ``student``, ``teacher``), ``call`` the method or stream.
"""

from __future__ import annotations

from typing import Any

import grpc

from capc_services.common.metrics import PartyMetrics

__all__ = ["RoundTripInterceptor", "counted"]


class RoundTripInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Counts each call this party makes to ``peer`` (a role) into its metrics, by method name."""

    def __init__(self, metrics: PartyMetrics, *, peer: str) -> None:
        self._metrics, self._peer = metrics, peer

    def _count(self, details: Any) -> None:
        method = str(details.method).rsplit("/", 1)[-1]
        self._metrics.round_trips.labels(peer=self._peer, call=method).inc()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self._count(details)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self._count(details)
        return continuation(details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        self._count(details)
        return continuation(details, request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        self._count(details)
        return continuation(details, request_iterator)


def counted(metrics: PartyMetrics | None, *, peer: str) -> tuple[RoundTripInterceptor, ...]:
    """The interceptors that count a channel's calls to ``peer`` into ``metrics`` (none without metrics)."""
    return () if metrics is None else (RoundTripInterceptor(metrics, peer=peer),)
