"""What the garbler and the evaluator share: framing, ordering checks, the handshake layout, aborts.

Every frame is ``tag (1 byte) ‖ 7 zero bytes ‖ sequence number (8 bytes, little-endian)`` followed by the
payload (the 16-byte header keeps payloads 16-byte aligned, so labels can be viewed in place). Each
direction numbers its frames from 0; a frame with the wrong number or an unexpected tag is a protocol error.
Bulk data (the OT matrix, garbled tables) is a *stream* of frames of at most :data:`MAX_PAYLOAD_BYTES`.

Failures are handled in one place, :meth:`Party._fail`: the local caller gets a precise
:class:`ProtocolError` (details also logged locally), the peer gets an opaque ``ABORT`` frame, and the
session closes its channel. A batch the garbler rejects at the ``OPEN`` step (different batch id or size)
consumes nothing, so both sessions stay usable.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import logging
import struct
from collections.abc import Callable
from typing import Self

import numpy as np

from capc_common.errors import CapcError, InputError, ProtocolError
from capc_common.mpc.channel import Channel
from capc_common.mpc.config import MpcConfig
from capc_common.mpc.primitives.aes import BLOCK_BYTES, as_bytes
from capc_common.mpc.primitives.base_ot import POINT_BYTES, SEED_BYTES
from capc_common.mpc.primitives.bits import OT_WIDTH

_log = logging.getLogger(__name__)

PROTOCOL_VERSION = 2
MAX_PAYLOAD_BYTES = 4 << 20
"""Largest payload of one frame (the services' gRPC messages stay well under their 4 MiB default + header)."""
STREAM_FRAME_BYTES = 1 << 20
SEGMENT_GATES = MAX_PAYLOAD_BYTES // 32
"""Both backends split an AND layer into segments of at most this many gates, so one segment's garbled table
(32 bytes per gate) always fits one frame and the evaluator reads it without copying."""
"""Garbled material is flushed in frames of this size, so the evaluator starts while the garbler works."""
_HEADER = struct.Struct("<B7xQ")
HEADER_BYTES = _HEADER.size
SESSION_ID_BYTES = 16
_BATCH_ID_MAX = 255
HELLO = struct.Struct("<H32s16s16s16s")
"""Fixed part of HELLO: version, config digest, session id, fixed AES key, public constant-0 label."""
HELLO_BYTES = HELLO.size + OT_WIDTH * 2 * POINT_BYTES
HELLO_REPLY_BYTES = POINT_BYTES + OT_WIDTH * 2 * SEED_BYTES


class Tag(enum.IntEnum):
    """Frame types, in the order they appear in a session."""

    HELLO = 1  # garbler → evaluator: version, config digest, session id, AES key, constant label, base OT
    HELLO_REPLY = 2  # evaluator → garbler: base-OT reply
    OPEN = 3  # evaluator → garbler: batch id, number of queries (the first OT_MATRIX follows at once)
    OPEN_REPLY = 4  # garbler → evaluator: accepted or rejected, after reading that OT matrix
    OT_MATRIX = 5  # evaluator → garbler: IKNP matrix U of one chunk (stream)
    GARBLED = 6  # garbler → evaluator: input labels and garbled tables of one chunk (stream)
    GARBLED_END = 9  # garbler → evaluator: the last frame of a chunk's garbled stream (may be empty)
    PASS_LABELS = 7  # evaluator → garbler: output labels of the pass bits of one chunk (empty in GNMax mode)
    DECODE = 8  # garbler → evaluator: pass bits and label decoding bits, after the ledger commit
    ABORT = 15  # either way, empty: "I stopped", nothing more


class BatchRejected(ProtocolError):
    """The two parties disagreed on a batch's id or size; nothing was computed and the session is usable."""


class _PeerAborted(ProtocolError):
    pass


def batch_id_bytes(batch_id: bytes | str) -> bytes:
    """Batch ids go on the wire as at most 255 bytes (UTF-8 for strings)."""
    raw = batch_id.encode() if isinstance(batch_id, str) else bytes(batch_id)
    if not raw or len(raw) > _BATCH_ID_MAX:
        raise InputError(f"a batch id must be 1 to {_BATCH_ID_MAX} bytes, got {len(raw)}.")
    return raw


def chunk_bounds(queries: int, chunk: int) -> list[tuple[int, int]]:
    """Split ``queries`` into consecutive ``[start, stop)`` chunks of at most ``chunk``."""
    return [(start, min(start + chunk, queries)) for start in range(0, queries, chunk)]


class GateCounter:
    """The session-wide AND-gate index: gate g hashes with tweaks 2g and 2g + 1, so tweaks never repeat.

    Both parties advance their counters identically; a counter is never reset within a session.
    """

    __slots__ = ("next_gate",)

    def __init__(self) -> None:
        self.next_gate = 0

    def take(self, n: int) -> int:
        """Reserve ``n`` consecutive gate indices and return the first."""
        first = self.next_gate
        self.next_gate += n
        return first


class StreamWriter:
    """Packs arrays into frames of about :data:`STREAM_FRAME_BYTES` and sends them as one tagged stream.

    An array is split across frames only if it alone exceeds :data:`MAX_PAYLOAD_BYTES`, so the reader can
    view most arrays (one garbled layer each) in place.
    """

    def __init__(self, send: Callable[..., None], tag: Tag) -> None:
        self._send, self._tag = send, tag
        self._parts: list[memoryview] = []
        self._size = 0

    def write(self, array: np.ndarray) -> None:
        """Queue an array's bytes (the array must not be modified afterwards)."""
        view = as_bytes(array)
        if self._size + len(view) > MAX_PAYLOAD_BYTES:
            self.flush()
        while len(view) > MAX_PAYLOAD_BYTES:
            self._send(self._tag, view[:MAX_PAYLOAD_BYTES])
            view = view[MAX_PAYLOAD_BYTES:]
        self._parts.append(view)
        self._size += len(view)
        if self._size >= STREAM_FRAME_BYTES:
            self.flush()

    def flush(self) -> None:
        """Send what is queued as one frame."""
        if self._size:
            self._send(self._tag, *self._parts)
            self._parts, self._size = [], 0

    def close(self, end_tag: Tag) -> None:
        """Send the rest as the stream's final frame, tagged ``end_tag`` so a short stream is detected."""
        self._send(end_tag, *self._parts)
        self._parts, self._size = [], 0


class StreamReader:
    """Reads exact byte counts from a tagged stream of frames, zero-copy when a read fits in one frame.

    The stream's last frame carries ``end_tag``; reading past it, or ending before it, is a protocol error.
    """

    def __init__(self, recv: Callable[..., tuple[Tag, memoryview]], tag: Tag, end_tag: Tag) -> None:
        self._recv, self._tag, self._end_tag = recv, tag, end_tag
        self._frame = memoryview(b"")
        self._pos = 0
        self._ended = False

    def _next_frame(self) -> None:
        if self._ended:
            raise ProtocolError(f"{self._tag.name} stream ended before the expected bytes arrived.")
        tag, self._frame = self._recv(self._tag, self._end_tag)
        self._pos, self._ended = 0, tag == self._end_tag

    def read(self, nbytes: int) -> np.ndarray:
        """The next ``nbytes`` bytes as a read-only uint8 array."""
        if self._pos == len(self._frame) and nbytes:
            self._next_frame()  # the writer starts every array in a fresh frame when it would not fit
        if len(self._frame) - self._pos >= nbytes:
            out = np.frombuffer(self._frame, dtype=np.uint8, count=nbytes, offset=self._pos)
            self._pos += nbytes
            return out
        buf = np.empty(nbytes, dtype=np.uint8)
        got = len(self._frame) - self._pos
        buf[:got] = np.frombuffer(self._frame, dtype=np.uint8, offset=self._pos)
        while got < nbytes:
            self._next_frame()
            take = min(nbytes - got, len(self._frame))
            buf[got : got + take] = np.frombuffer(self._frame, dtype=np.uint8, count=take)
            got += take
            self._pos = take
        return buf

    def read_blocks(self, shape: tuple[int, ...]) -> np.ndarray:
        """The next labels as a uint64 array of ``shape + (2,)``."""
        count = int(np.prod(shape, dtype=np.int64))
        raw = self.read(count * BLOCK_BYTES)
        return np.frombuffer(raw, dtype=np.uint64).reshape((*shape, 2))

    def end(self) -> None:
        """Check that the stream ends here: everything read, up to and including its final frame."""
        if self._pos == len(self._frame) and not self._ended:
            self._next_frame()  # the final frame may still be due (empty, or already fully read)
        if self._pos != len(self._frame) or not self._ended:
            raise ProtocolError(
                f"{self._tag.name} stream is longer than expected ({len(self._frame) - self._pos} bytes "
                "left in its frame)."
            )
        self._frame, self._pos, self._ended = memoryview(b""), 0, False


class Party(abc.ABC):
    """State both roles share: the channel, frame numbering, the gate counter and the session's health.

    Args:
        channel: link to the peer (the session owns it and closes it on failure or :meth:`close`).
        config: parameters; the peer must hold an equal one.
    """

    role = "party"

    def __init__(self, channel: Channel, config: MpcConfig) -> None:
        if not isinstance(config, MpcConfig):
            raise InputError(f"config must be an MpcConfig, got {type(config).__name__}.")
        self._channel = channel
        self.config = config
        self._sent = 0
        self._received = 0
        self._ready = False
        self._closed = False
        self.gates = GateCounter()

    # -- framing ---------------------------------------------------------------------------------------------
    def _send(self, tag: Tag, *payload: bytes | memoryview) -> None:
        size = sum(len(part) for part in payload)
        if size > MAX_PAYLOAD_BYTES:
            raise InputError(f"{tag.name} payload of {size} bytes exceeds {MAX_PAYLOAD_BYTES}; stream it.")
        self._channel.send_parts((_HEADER.pack(tag, self._sent), *payload))
        self._sent += 1

    def _send_stream(self, tag: Tag, data: np.ndarray) -> None:
        view = as_bytes(data)
        for offset in range(0, len(view), MAX_PAYLOAD_BYTES):
            self._send(tag, view[offset : offset + MAX_PAYLOAD_BYTES])

    def _recv_any(self, *tags: Tag) -> tuple[Tag, memoryview]:
        """The next frame, which must be one of ``tags``, in sequence: ``(tag, payload)``."""
        wanted = " or ".join(t.name for t in tags)
        frame = self._channel.recv()
        if len(frame) < HEADER_BYTES:
            raise ProtocolError(f"truncated frame of {len(frame)} bytes while waiting for {wanted}.")
        raw_tag, seq = _HEADER.unpack_from(frame)
        if raw_tag == Tag.ABORT:
            raise _PeerAborted(f"the peer aborted the session while we waited for {wanted}.")
        if seq != self._received:
            raise ProtocolError(f"out-of-order frame: sequence number {seq}, expected {self._received}.")
        if raw_tag not in tags:
            name = Tag(raw_tag).name if raw_tag in Tag._value2member_map_ else f"unknown tag {raw_tag}"
            raise ProtocolError(f"expected a {wanted} frame, got {name} (frame {seq}).")
        self._received += 1
        return Tag(raw_tag), memoryview(frame)[HEADER_BYTES:]

    def _recv(self, tag: Tag) -> memoryview:
        return self._recv_any(tag)[1]

    def _recv_exact(self, tag: Tag, nbytes: int) -> memoryview:
        payload = self._recv(tag)
        if len(payload) != nbytes:
            raise ProtocolError(f"{tag.name} payload has {len(payload)} bytes, expected {nbytes}.")
        return payload

    def _recv_stream(self, tag: Tag, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, dtype=np.uint8)
        got = 0
        while got < nbytes:
            payload = self._recv(tag)
            expected = min(MAX_PAYLOAD_BYTES, nbytes - got)
            if len(payload) != expected:
                raise ProtocolError(
                    f"{tag.name} frame of {len(payload)} bytes where {expected} were due "
                    f"({got} of {nbytes} bytes received)."
                )
            out[got : got + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
            got += len(payload)
        return out

    # -- lifecycle -------------------------------------------------------------------------------------------
    def handshake(self) -> None:
        """Run the once-per-session setup (config check, base OTs) now instead of in the first batch.

        Raises:
            ProtocolError: the peer's configuration differs or its messages are malformed (session closed).
        """
        self._require_open()
        if self._ready:
            return
        try:
            self._handshake()
        except BaseException as exc:
            self._fail(exc)
            raise
        self._ready = True

    @abc.abstractmethod
    def _handshake(self) -> None:
        """This role's half of the session setup."""

    @property
    def closed(self) -> bool:
        """True once the session failed or was closed; a closed session refuses every call."""
        return self._closed

    def _require_open(self) -> None:
        if self._closed:
            raise ProtocolError(
                f"this {self.role} session is closed (after close() or an earlier protocol failure); "
                "open a new session on a new channel."
            )

    def _fail(self, exc: BaseException) -> None:
        """Tell the peer (opaquely) that we stopped, close the channel and mark the session closed."""
        if isinstance(exc, CapcError):
            _log.warning("mpc %s session aborted: %s", self.role, exc)
        else:
            _log.warning("mpc %s session aborted by %s", self.role, type(exc).__name__)
        if not isinstance(exc, _PeerAborted):
            with contextlib.suppress(CapcError):  # the channel may already be gone; closing is what is left
                self._channel.send(_HEADER.pack(Tag.ABORT, self._sent))
        self.close()

    def close(self) -> None:
        """Close the session and its channel. Idempotent."""
        if not self._closed:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
