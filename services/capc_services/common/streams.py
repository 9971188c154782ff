"""A bridge between a gRPC bidirectional stream and the MPC library's blocking, message-oriented channel.

The library's sessions call ``send(bytes)`` / ``recv() -> bytes`` in order; gRPC's synchronous API gives a
server an iterator of requests and wants an iterator of responses back (and the reverse for a client).
The bridge holds a bounded outgoing queue drained by the gRPC side and a reader thread that pulls incoming
messages from the peer's iterator into a bounded inbox, so a session runs unchanged in its own thread.

Nothing waits for the peer forever within a batch: a frame must arrive, and room in the send queue must
free up, within the channel's deadline, or the call fails with :class:`UnavailableError`. So a peer that
stalls (stops reading or writing, but keeps its connection) cannot hold the guardian's computation — and
the lock that orders batches — for longer than the deadline, and a slow reader costs at most the queue's
few frames of memory. Waiting *between* batches (for the next ``ComputeStart``) has no deadline: a
long-lived stream may idle.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from capc_common.errors import ProtocolError, UnavailableError
from capc_common.mpc import Channel
from capc_common.wire.messages import ComputeMessage

FRAME_DEADLINE_S = 60.0
"""Longest wait, within a batch, for the peer's next message or for room in the send queue."""
QUEUE_FRAMES = 8
"""Messages (each at most one 4 MiB MPC frame) that may wait in either direction."""
_END = object()
_POLL_S = 0.25


class FrameChannel(Channel):
    """An MPC :class:`~capc_common.mpc.Channel` over ``ComputeMessage.frame`` messages in both directions.

    Args:
        incoming: the peer's messages (the request iterator on a server); a client, whose response
            iterator only exists once the call is made with :meth:`outgoing`, passes None and calls
            :meth:`attach`.
        peer: who is on the other side, for error messages.
        on_error: maps a gRPC error raised by ``incoming`` to the library error to raise instead.
        deadline: seconds a receive or a send may wait within a batch (None: forever).
        queue_frames: capacity of the outgoing queue and of the inbox.
    """

    def __init__(
        self,
        incoming: Iterator[ComputeMessage] | None,
        *,
        peer: str,
        on_error: Callable[[grpc.RpcError], Exception] | None = None,
        deadline: float | None = FRAME_DEADLINE_S,
        queue_frames: int = QUEUE_FRAMES,
    ) -> None:
        super().__init__()
        self._incoming = incoming
        self._outgoing: queue.Queue[Any] = queue.Queue(maxsize=queue_frames)
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=queue_frames)
        self._peer = peer
        self._on_error = on_error
        self._deadline = deadline
        self._closed = threading.Event()
        self._reader: threading.Thread | None = None
        self._reader_lock = threading.Lock()
        #: Round trips over this stream: messages received after this side sent (a turn of the protocol).
        self.turns = 0
        self._spoke = False

    def attach(self, incoming: Iterator[ComputeMessage]) -> None:
        """Set the peer's message iterator (client side: the call's response iterator)."""
        self._incoming = incoming

    # ------------------------------------------------------------------ sending
    def _put(self, item: Any) -> None:
        if self._closed.is_set():
            raise ProtocolError(f"channel to {self._peer} is closed; cannot send")
        self._spoke = True
        try:
            self._outgoing.put(item, timeout=self._deadline)
        except queue.Full:
            raise UnavailableError(
                f"{self._peer} read nothing for {self._deadline:.0f} s ({self._outgoing.maxsize} messages "
                "waiting); giving up on the stream"
            ) from None

    def _send(self, data: bytes) -> None:
        self._put(ComputeMessage(frame=bytes(data)))

    def send_message(self, message: ComputeMessage) -> None:
        """Queue a control message (start, agreed, refused) for the peer.

        Raises:
            UnavailableError: the peer has not made room within the deadline.
            ProtocolError: the channel is closed.
        """
        self._put(message)

    # ------------------------------------------------------------------ receiving
    def _read(self) -> None:
        """Reader thread: the peer's messages into the inbox, then ("end" | "error", ...)."""
        assert self._incoming is not None
        item: tuple[str, Any]
        try:
            for message in self._incoming:
                if not self._deliver(("message", message)):
                    return
            item = ("end", None)
        except grpc.RpcError as exc:
            item = ("error", exc)
        except Exception as exc:  # the iterator itself failed: report it as the stream's failure
            item = ("error", exc)
        self._deliver(item)

    def _deliver(self, item: tuple[str, Any]) -> bool:
        """Put ``item`` in the inbox, waiting for room; False (dropped) when the channel was closed and
        nobody is making room any more. Closing ends only the outgoing direction: what the peer still sends
        (its last frames, the end of its stream) keeps arriving."""
        while True:
            try:
                self._inbox.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                if self._closed.is_set():
                    return False

    def _start_reader(self) -> None:
        with self._reader_lock:
            if self._reader is None:
                if self._incoming is None:
                    raise ProtocolError(f"channel to {self._peer} has no incoming stream attached")
                self._reader = threading.Thread(target=self._read, name=f"read-{self._peer}", daemon=True)
                self._reader.start()

    def next_message(self, *, timeout: float | None = None) -> ComputeMessage | None:
        """Block for the peer's next message; None when the peer ended the stream cleanly.

        Args:
            timeout: seconds to wait (None: forever — the wait between batches).

        Raises:
            UnavailableError: nothing arrived within ``timeout``.
            ProtocolError (or what ``on_error`` maps to): the stream failed.
        """
        self._start_reader()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                kind, value = self._inbox.get(timeout=_POLL_S)
                break
            except queue.Empty:
                assert self._reader is not None
                if not self._reader.is_alive() and self._inbox.empty():
                    # The reader stopped without a last word: the channel was closed under it.
                    raise ProtocolError(f"stream to {self._peer} is closed") from None
                if deadline is not None and time.monotonic() > deadline:
                    raise UnavailableError(
                        f"{self._peer} sent nothing for {timeout:.0f} s in the middle of a batch; giving up "
                        "on the stream"
                    ) from None
        if kind == "message":
            message: ComputeMessage = value
            if self._spoke:  # an answer to what this side sent: one turn of the protocol
                self.turns, self._spoke = self.turns + 1, False
            return message
        self._inbox.put((kind, value))  # every later receive sees the end too
        if kind == "end":
            return None
        if isinstance(value, grpc.RpcError) and self._on_error is not None:
            raise self._on_error(value)
        raise ProtocolError(f"stream to {self._peer} failed: {value}")

    def recv_message(self) -> ComputeMessage:
        """Block, at most the deadline, for the peer's next message within a batch.

        Raises:
            UnavailableError: nothing arrived within the deadline.
            ProtocolError: the peer ended the stream or it failed.
        """
        message = self.next_message(timeout=self._deadline)
        if message is None:
            raise ProtocolError(f"{self._peer} closed the stream mid-protocol")
        return message

    def _recv(self) -> bytes:
        message = self.recv_message()
        if message.WhichOneof("kind") != "frame":
            raise ProtocolError(f"{self._peer} sent {message.WhichOneof('kind')} where an MPC frame was due")
        return message.frame

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """End the outgoing direction once everything queued has gone out (idempotent)."""
        if not self._closed.is_set():
            self._closed.set()
            with contextlib.suppress(queue.Full):  # a full queue: outgoing() sees the close on its next poll
                self._outgoing.put_nowait(_END)

    def outgoing(self) -> Iterator[ComputeMessage]:
        """What the gRPC side sends: queued messages until :meth:`close`."""
        while True:
            try:
                item = self._outgoing.get(timeout=_POLL_S)
            except queue.Empty:
                if self._closed.is_set():
                    return
                continue
            if item is _END:
                return
            yield item
