"""A bridge between a gRPC bidirectional stream and the MPC library's blocking, message-oriented channel.

The library's sessions call ``send(bytes)`` / ``recv() -> bytes`` in order; gRPC's synchronous API gives a
server an iterator of requests and wants an iterator of responses back (and the reverse for a client).
The bridge holds an outgoing queue drained by the gRPC side and pulls incoming frames from the peer's
iterator, so a session runs unchanged in its own thread.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from capc_common.errors import ProtocolError
from capc_common.mpc import Channel
from capc_common.wire.messages import ComputeMessage

_END = object()


class FrameChannel(Channel):
    """An MPC :class:`~capc_common.mpc.Channel` over ``ComputeMessage.frame`` messages in both directions.

    Args:
        incoming: the peer's messages (the request iterator on a server); a client, whose response
            iterator only exists once the call is made with :meth:`outgoing`, passes None and calls
            :meth:`attach`.
        peer: who is on the other side, for error messages.
        on_error: maps a gRPC error raised by ``incoming`` to the library error to raise instead.
    """

    def __init__(
        self,
        incoming: Iterator[ComputeMessage] | None,
        *,
        peer: str,
        on_error: Callable[[grpc.RpcError], Exception] | None = None,
    ) -> None:
        super().__init__()
        self._incoming = incoming
        self._outgoing: queue.Queue[Any] = queue.Queue()
        self._peer = peer
        self._on_error = on_error
        self._closed = False

    def attach(self, incoming: Iterator[ComputeMessage]) -> None:
        """Set the peer's message iterator (client side: the call's response iterator)."""
        self._incoming = incoming

    def _send(self, data: bytes) -> None:
        if self._closed:
            raise ProtocolError(f"channel to {self._peer} is closed; cannot send")
        self._outgoing.put(ComputeMessage(frame=bytes(data)))

    def send_message(self, message: ComputeMessage) -> None:
        """Queue a control message (start, agreed) for the peer."""
        self._outgoing.put(message)

    def next_message(self) -> ComputeMessage | None:
        """Block for the peer's next message; None when the peer ended the stream cleanly.

        Raises:
            ProtocolError (or what ``on_error`` maps to): the stream failed.
        """
        if self._incoming is None:
            raise ProtocolError(f"channel to {self._peer} has no incoming stream attached")
        try:
            return next(self._incoming)
        except StopIteration:
            return None
        except grpc.RpcError as exc:
            if self._on_error is not None:
                raise self._on_error(exc) from None
            raise ProtocolError(f"stream to {self._peer} failed: {exc}") from None

    def recv_message(self) -> ComputeMessage:
        """Block for the peer's next message.

        Raises:
            ProtocolError: the peer ended the stream or it failed.
        """
        message = self.next_message()
        if message is None:
            raise ProtocolError(f"{self._peer} closed the stream mid-protocol")
        return message

    def _recv(self) -> bytes:
        message = self.recv_message()
        if message.WhichOneof("kind") != "frame":
            raise ProtocolError(f"{self._peer} sent {message.WhichOneof('kind')} where an MPC frame was due")
        return message.frame

    def close(self) -> None:
        """End the outgoing direction once everything queued has gone out (idempotent)."""
        if not self._closed:
            self._closed = True
            self._outgoing.put(_END)

    def outgoing(self) -> Iterator[ComputeMessage]:
        """What the gRPC side sends: queued messages until :meth:`close`."""
        while True:
            item = self._outgoing.get()
            if item is _END:
                return
            yield item
