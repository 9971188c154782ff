"""Channels: message framing, size limits, closing and timeouts, for the in-memory pair and sockets."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from capc_common.errors import InputError, ProtocolError, UnavailableError
from capc_common.mpc import MAX_FRAME_BYTES, SocketChannel, channel_pair


def _socket_pair(timeout: float = 5.0) -> tuple[SocketChannel, SocketChannel]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return SocketChannel(a, timeout=timeout), SocketChannel(b, timeout=timeout)


@pytest.mark.parametrize("make", [lambda: channel_pair(timeout=5.0), _socket_pair])
def test_frames_keep_their_boundaries_and_are_counted(make) -> None:
    left, right = make()
    frames = [b"", b"x", bytes(range(256)) * 300, bytes(MAX_FRAME_BYTES)]
    for frame in frames:
        left.send(frame)
    assert [bytes(right.recv()) for _ in frames] == frames
    assert left.bytes_sent == right.bytes_received == sum(map(len, frames))
    with pytest.raises(InputError, match="exceeds the"):
        left.send(bytes(MAX_FRAME_BYTES + 1))
    left.close()
    with pytest.raises(ProtocolError, match="closed"):
        right.recv()
    with pytest.raises(ProtocolError, match="closed"):
        left.send(b"late")
    right.close()


@pytest.mark.parametrize("make", [lambda: channel_pair(timeout=5.0), _socket_pair])
def test_scatter_gather_frames(make) -> None:
    """Thousands of parts (more than one sendmsg takes) arrive as one frame, in order."""
    left, right = make()
    parts = [bytes([i % 251]) * (i % 7 + 1) for i in range(3000)] + [memoryview(bytes(2 << 20))]
    receiver = threading.Thread(target=lambda: frames.append(bytes(right.recv())))
    frames: list[bytes] = []
    receiver.start()  # the socket buffer is smaller than the frame: the sender has to wait for the reader
    left.send_parts(parts)
    receiver.join(5)
    assert frames == [b"".join(bytes(p) for p in parts)]
    assert left.bytes_sent == right.bytes_received == len(frames[0])
    left.close()
    right.close()


def test_in_memory_recv_times_out() -> None:
    left, _right = channel_pair(timeout=0.05)
    with pytest.raises(UnavailableError, match=r"within 0\.05 s"):
        left.recv()


def test_socket_refuses_oversized_announcements_and_times_out() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    channel = SocketChannel(b, timeout=0.1)
    with pytest.raises(UnavailableError, match="socket timeout"):
        channel.recv()
    a.sendall(struct.pack("<I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolError, match="announced a"):
        channel.recv()
    a.sendall(struct.pack("<I", 10) + b"short")
    a.close()
    with pytest.raises(ProtocolError, match=r"peer closed the connection \(5 of 10 bytes"):
        channel.recv()
    channel.close()


def test_connecting_to_nobody_is_unavailable(tmp_path) -> None:
    with pytest.raises(UnavailableError, match="cannot connect"):
        SocketChannel.connect_unix(str(tmp_path / "absent.sock"), timeout=1)
