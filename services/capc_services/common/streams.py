"""Bridges between a gRPC bidirectional stream and the MPC library's blocking, message-oriented channel.

The library's sessions call ``send(bytes)`` / ``recv() -> bytes`` in order; gRPC's synchronous API gives a
server an iterator of requests and wants an iterator of responses back (and the reverse for a client).
Each bridge holds an outgoing queue drained by the gRPC side and pulls incoming frames from the peer's
iterator, so the session runs unchanged in its own thread.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from capc_common.errors import ProtocolError
from capc_common.wire.messages import ComputeMessage

_END = object()


class FrameChannel:
    """A blocking byte channel over two message iterators (``ComputeMessage.frame`` in both directions).

    Args:
        incoming: the peer's messages (the request iterator on a server, the response iterator on a
            client).
        peer: who is on the other side, for error messages.
        on_error: maps a gRPC error raised by ``incoming`` to the library error to raise instead.
    """

    def __init__(
        self,
        incoming: Iterator[ComputeMessage],
        *,
        peer: str,
        on_error: Callable[[grpc.RpcError], Exception] | None = None,
    ) -> None:
        self._incoming = incoming
        self._outgoing: queue.Queue[Any] = queue.Queue()
        self._peer = peer
        self._on_error = on_error
        self._closed = False
        self.bytes_sent = 0
        self.bytes_received = 0

    def send(self, data: bytes) -> None:
        """Queue one frame for the peer."""
        if self._closed:
            raise ProtocolError(f"channel to {self._peer} is closed; cannot send")
        self.bytes_sent += len(data)
        self._outgoing.put(ComputeMessage(frame=bytes(data)))

    def send_message(self, message: ComputeMessage) -> None:
        """Queue a control message (start, agreed) for the peer."""
        self._outgoing.put(message)

    def recv_message(self) -> ComputeMessage:
        """Block for the peer's next message.

        Raises:
            ProtocolError: the peer ended the stream.
        """
        try:
            return next(self._incoming)
        except StopIteration:
            raise ProtocolError(f"{self._peer} closed the stream mid-protocol") from None
        except grpc.RpcError as exc:
            if self._on_error is not None:
                raise self._on_error(exc) from None
            raise ProtocolError(f"stream to {self._peer} failed: {exc}") from None

    def recv(self) -> bytes:
        """Block for the peer's next frame.

        Raises:
            ProtocolError: the stream ended or the peer sent something other than a frame.
        """
        message = self.recv_message()
        if message.WhichOneof("kind") != "frame":
            raise ProtocolError(f"{self._peer} sent {message.WhichOneof('kind')} where an MPC frame was due")
        self.bytes_received += len(message.frame)
        return message.frame

    def close(self) -> None:
        """End the outgoing direction once everything queued has gone out."""
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
