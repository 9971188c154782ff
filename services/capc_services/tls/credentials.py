"""gRPC credentials and channels for mutual TLS between federation parties."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from capc_common.errors import InputError

# MPC frames of a large batch run to tens of megabytes; keepalives hold a teacher's outbound stream open
# through NAT and firewalls that drop idle connections.
GRPC_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", 512 * 1024 * 1024),
    ("grpc.max_receive_message_length", 512 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    *GRPC_OPTIONS,
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.so_reuseport", 0),
)


@dataclass(frozen=True)
class TlsFiles:
    """The three PEM files a party needs: the federation CA, its certificate and its private key."""

    ca: Path
    cert: Path
    key: Path

    def _read(self) -> tuple[bytes, bytes, bytes]:
        for path in (self.ca, self.cert, self.key):
            if not path.is_file():
                raise InputError(f"TLS file {path} does not exist; issue certificates with `capc cert issue`")
        mode = stat.S_IMODE(self.key.stat().st_mode)
        if mode & 0o077:
            raise InputError(
                f"private key {self.key} is readable by others (mode {mode:o}); run `chmod 600 {self.key}`"
            )
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that *require* a client certificate signed by the federation CA."""
        ca, cert, key = self._read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    def channel(self, address: str, *, peer: str, interceptors: tuple[Any, ...] = ()) -> grpc.Channel:
        """A mutually authenticated channel to ``address`` that only accepts a server certified as ``peer``.

        Every federation certificate carries its party name as a DNS SAN, so overriding the TLS target
        name with ``peer`` makes the handshake fail unless the server *is* that party — whatever host name
        or IP it is reached at.
        """
        ca, cert, key = self._read()
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        options = (*GRPC_OPTIONS, ("grpc.ssl_target_name_override", peer), ("grpc.default_authority", peer))
        channel = grpc.secure_channel(address, creds, options=options)
        return grpc.intercept_channel(channel, *interceptors) if interceptors else channel
