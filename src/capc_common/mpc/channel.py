"""Message channels between the two parties: an in-memory pair for tests and a socket channel.

A :class:`Channel` moves whole messages (frames) of at most :data:`MAX_FRAME_BYTES`; the protocol splits
anything larger. The services wrap a gRPC bidirectional stream of ``bytes`` frames in the same interface,
so the protocol code never knows which transport it runs on.
"""

from __future__ import annotations

import abc
import contextlib
import queue
import socket
import struct
import threading
from collections.abc import Sequence

import numpy as np

from capc_common.errors import InputError, ProtocolError, UnavailableError

Frame = bytes | bytearray | memoryview
"""What ``recv`` returns: any bytes-like object (sockets hand out views of a fresh buffer, not copies)."""
MAX_FRAME_BYTES = (4 << 20) + 64
"""Largest frame a channel accepts: 4 MiB of payload plus the protocol's header."""
_LENGTH = struct.Struct("<I")
_MAX_IOVECS = 512  # below Linux's IOV_MAX of 1024 buffers per sendmsg


class Channel(abc.ABC):
    """A reliable, ordered, message-oriented duplex link to the peer."""

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.bytes_received = 0

    @abc.abstractmethod
    def _send(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def _recv(self) -> Frame: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Close the link; the peer's next ``recv`` raises :class:`ProtocolError`. Idempotent."""

    def send(self, data: bytes) -> None:
        """Send one frame of at most :data:`MAX_FRAME_BYTES` bytes.

        Raises:
            InputError: the frame is too large (a bug in the caller: split it).
            ProtocolError: the channel is closed.
        """
        self.send_parts((data,))

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """Send the concatenation of ``parts`` as one frame (same limits as :meth:`send`).

        The default joins the parts; channels that can write several buffers at once override
        :meth:`_send_parts` and skip that copy.
        """
        size = sum(len(part) for part in parts)
        if size > MAX_FRAME_BYTES:
            raise InputError(f"frame of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte limit; split it.")
        self._send_parts(parts)
        self.bytes_sent += size

    def _send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        self._send(parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts))

    def recv(self) -> Frame:
        """Receive the next frame (``bytes`` or another read-only bytes-like view).

        Raises:
            ProtocolError: the peer closed the link or sent an oversized frame.
            UnavailableError: nothing arrived within the channel's timeout.
        """
        data = self._recv()
        self.bytes_received += len(data)
        return data


_CLOSED = object()


class _QueueChannel(Channel):
    def __init__(
        self, inbox: queue.Queue[object], outbox: queue.Queue[object], timeout: float | None
    ) -> None:
        super().__init__()
        self._inbox, self._outbox, self._timeout = inbox, outbox, timeout
        self._closed = threading.Event()

    def _send(self, data: bytes) -> None:
        if self._closed.is_set():
            raise ProtocolError("cannot send: this channel is closed.")
        self._outbox.put(bytes(data))

    def _recv(self) -> bytes:
        if self._closed.is_set():
            raise ProtocolError("cannot receive: this channel is closed.")
        try:
            item = self._inbox.get(timeout=self._timeout)
        except queue.Empty as exc:
            raise UnavailableError(f"no message from the peer within {self._timeout} s.") from exc
        if item is _CLOSED:
            self._inbox.put(_CLOSED)  # every later recv sees the close too
            raise ProtocolError("the peer closed the channel.")
        assert isinstance(item, bytes)
        return item

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._outbox.put(_CLOSED)


def channel_pair(*, timeout: float | None = 120.0) -> tuple[Channel, Channel]:
    """Two connected in-memory channels (thread-safe), e.g. garbler in a thread and evaluator in the test.

    Args:
        timeout: seconds a ``recv`` waits before raising :class:`UnavailableError` (None: forever).
    """
    a_to_b: queue.Queue[object] = queue.Queue()
    b_to_a: queue.Queue[object] = queue.Queue()
    return _QueueChannel(b_to_a, a_to_b, timeout), _QueueChannel(a_to_b, b_to_a, timeout)


class SocketChannel(Channel):
    """Frames over a connected stream socket (TCP or Unix), each prefixed with its 4-byte length.

    Args:
        sock: a connected socket; the channel owns it from now on.
        timeout: seconds a ``recv`` may wait (None: forever).
    """

    def __init__(self, sock: socket.socket, *, timeout: float | None = 120.0) -> None:
        super().__init__()
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)
        sock.settimeout(timeout)
        self._sock = sock
        self._closed = False

    @classmethod
    def connect(cls, host: str, port: int, *, timeout: float | None = 120.0) -> SocketChannel:
        """Connect to a peer listening on ``host:port``."""
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise UnavailableError(f"cannot connect to the MPC peer at {host}:{port}: {exc}.") from exc
        return cls(sock, timeout=timeout)

    @classmethod
    def connect_unix(cls, path: str, *, timeout: float | None = 120.0) -> SocketChannel:
        """Connect to a peer listening on the Unix socket ``path`` (same machine; cheaper than TCP)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise UnavailableError(f"cannot connect to the MPC peer at {path}: {exc}.") from exc
        return cls(sock, timeout=timeout)

    def _send(self, data: bytes) -> None:
        self._send_parts((data,))

    def _send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """Length prefix and parts through ``sendmsg``, straight from the callers' buffers (no join)."""
        if self._closed:
            raise ProtocolError("cannot send: this channel is closed.")
        pending = [memoryview(_LENGTH.pack(sum(len(p) for p in parts)))]
        pending += [memoryview(p).cast("B") for p in parts if len(p)]
        try:
            while pending:
                sent = self._sock.sendmsg(pending[:_MAX_IOVECS])
                while pending and sent >= len(pending[0]):
                    sent -= len(pending[0])
                    pending.pop(0)
                if pending and sent:
                    pending[0] = pending[0][sent:]
        except OSError as exc:
            raise ProtocolError(f"sending to the peer failed: {exc}.") from exc

    def _read_exact(self, n: int) -> memoryview:
        view, got = np.empty(n, dtype=np.uint8).data, 0  # uninitialised: recv_into fills every byte
        try:
            while got < n:
                k = self._sock.recv_into(view[got:])
                if k == 0:
                    raise ProtocolError(
                        f"the peer closed the connection ({got} of {n} bytes of a frame received)."
                    )
                got += k
        except TimeoutError as exc:
            raise UnavailableError("no message from the peer within the socket timeout.") from exc
        except OSError as exc:
            raise ProtocolError(f"receiving from the peer failed: {exc}.") from exc
        return view

    def _recv(self) -> Frame:
        if self._closed:
            raise ProtocolError("cannot receive: this channel is closed.")
        (length,) = _LENGTH.unpack(self._read_exact(_LENGTH.size))
        if length > MAX_FRAME_BYTES:
            raise ProtocolError(f"the peer announced a {length}-byte frame; the limit is {MAX_FRAME_BYTES}.")
        return self._read_exact(length)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):  # already disconnected: nothing left to flush
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
