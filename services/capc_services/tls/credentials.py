"""gRPC credentials and channels for mutual TLS between federation parties."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.errors import InputError, ProtocolError
from capc_common.mpc import MAX_FRAME_BYTES

DEFAULT_MESSAGE_BYTES = MAX_FRAME_BYTES + (64 << 10)
"""Largest gRPC message when a link sets no limit of its own: one MPC frame and headroom (see
:class:`capc_services.common.limits.MessageLimits` for the limits a federation's links use)."""
KEEPALIVE: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
"""Every channel's and server's keepalive, the one place it is set. Pings hold a teacher's outbound stream
open through NAT and firewalls that drop idle connections, and tell a half-open connection (a peer that
vanished without FIN or RST: a host gone, a partition) from a quiet one: a ping unanswered for 10 s drops the
connection, so the calls on it fail UNAVAILABLE and the party reconnects — at most 20 + 10 s after the last
byte, 10 s while data flows. gRPC times pings out by ``grpc.http2.ping_timeout_ms`` (one minute by default);
``keepalive_timeout_ms`` alone left a half-open connection standing for 60–80 s (measured through the link
lab's blackhole)."""
RECONNECT_BACKOFF_MS = (100, 1000)
"""First and largest wait of a client channel between two attempts to connect (gRPC's defaults, 1 s growing
to 120 s, leave a channel that failed a few times refusing calls for seconds after its peer is back: a
restarted party then waits, and the calls made meanwhile fail). A federation has a handful of parties, and a
refused connection costs the peer nothing, so each channel tries again within a second, and first after a
tenth of one (a party restarted at once is back within a second)."""


def grpc_options(
    *, receive: int = DEFAULT_MESSAGE_BYTES, send: int = DEFAULT_MESSAGE_BYTES, server: bool = False
) -> tuple[tuple[str, Any], ...]:
    """gRPC channel or server options with message limits: gRPC refuses (RESOURCE_EXHAUSTED) a message whose
    length prefix exceeds ``receive`` before it buffers the message, so a peer cannot make this party hold
    more than that per call."""
    options = (
        ("grpc.max_send_message_length", send),
        ("grpc.max_receive_message_length", receive),
        *KEEPALIVE,
    )
    if server:
        options += (("grpc.http2.min_ping_interval_without_data_ms", 10_000), ("grpc.so_reuseport", 0))
    return options


@dataclass(frozen=True)
class TlsFiles:
    """The three PEM files a party needs: the federation CA, its certificate and its private key."""

    ca: Path
    cert: Path
    key: Path

    def check_key(self) -> None:
        """Refuse missing files and a private key readable by others.

        Raises:
            InputError: says which file and the fix.
        """
        for path in (self.ca, self.cert, self.key):
            if not path.is_file():
                raise InputError(f"TLS file {path} does not exist; issue certificates with `capc cert issue`")
        mode = stat.S_IMODE(self.key.stat().st_mode)
        if mode & 0o077:
            raise InputError(
                f"private key {self.key} is readable by others (mode {mode:o}); run `chmod 600 {self.key}`"
            )

    def _read(self) -> tuple[bytes, bytes, bytes]:
        self.check_key()
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that *require* a client certificate signed by the federation CA."""
        ca, cert, key = self._read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    def channel(
        self,
        address: str,
        *,
        peer: str,
        interceptors: tuple[Any, ...] = (),
        receive: int = DEFAULT_MESSAGE_BYTES,
        send: int = DEFAULT_MESSAGE_BYTES,
    ) -> grpc.Channel:
        """A mutually authenticated channel to ``address`` that only accepts a server certified as ``peer``.

        ``receive`` and ``send`` bound the size of one message each way (what the link's protocol sends).

        Every federation certificate carries its party name as a DNS SAN, so overriding the TLS target
        name with ``peer`` makes the handshake fail unless the server *is* that party — whatever host name
        or IP it is reached at.
        """
        ca, cert, key = self._read()
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        options = (
            *grpc_options(receive=receive, send=send),
            ("grpc.ssl_target_name_override", peer),
            ("grpc.default_authority", peer),
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
        )
        channel = grpc.secure_channel(address, creds, options=options)
        return grpc.intercept_channel(channel, *interceptors) if interceptors else channel


def channel_ready(channel: grpc.Channel, *, timeout: float) -> bool:
    """Whether the peer at the other end of ``channel`` answers (or does within ``timeout`` seconds).

    One standard health check, made with ``wait_for_ready`` so that it waits for the connection: any answer,
    a refusal included, means the connection is up. Not gRPC's ``channel_ready_future``: that subscribes to
    the channel's connectivity, which runs a poller thread beside the channel, and a poller still looking at
    the channel when it is closed dies with "Channel closed!" (gRPC checks the state of a channel another
    thread has just closed).

    Raises:
        ProtocolError: the peer answered, but the channel's client interceptor refused it (another
            federation config or revocation list, or a certificate it may not present).
    """
    try:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True
        )
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        # CANCELLED: this side closed the channel meanwhile (shutting down), no answer from the peer
        return code not in (
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.CANCELLED,
        )
    except ValueError:  # grpc: "Cannot invoke RPC on closed channel!"
        return False
    return True


def peer_problem(channel: grpc.Channel, *, timeout: float) -> str:
    """Why the peer at the other end of ``channel`` is not usable ('' when it answers within ``timeout``
    seconds under this party's federation config): for a readiness probe, which must say why and never
    raise. A peer that answers but is refused — under another config hash (the federation changed and one
    side has not restarted yet), another revocation list, a revoked certificate — is up but not usable: the
    reason says which."""
    try:
        ready = channel_ready(channel, timeout=timeout)
    except ProtocolError as exc:
        return f"answers, but this party refuses it ({exc})"
    return "" if ready else f"did not accept a TLS connection within {timeout:g} s"
