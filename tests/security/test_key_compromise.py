"""The key-compromise procedure of docs/operations.md ("Key compromise: rotate the CA"), end to end on a real
guardian process: a new CA, a new key and certificate for every party (requested on the party's side, signed
against the fingerprint it read out), the guardian restarted on them — and then every certificate of the old
CA, the thief's copies included, is refused in the TLS handshake, as a client and as a server."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest
from doors_harness import OPTIONS
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.federation import FederationConfig
from capc_common.wire import rpc
from capc_services.common.interceptors import AuthInterceptor, FederationClientInterceptor
from capc_services.common.runtime import start_grpc_server
from capc_services.guardian.servicer import POLICY
from capc_services.local.layout import Layout
from capc_services.local.processes import start_party, stop_processes, wait_ready
from capc_services.local.provision import provision
from capc_services.tls import ServerIdentity, TlsFiles, init_ca, request_certificate, sign_request

SERVING = health_pb2.HealthCheckResponse.SERVING


def _files(directory: Path, party: str, *, ca: Path | None = None) -> TlsFiles:
    return TlsFiles(
        ca=ca or directory / "ca.crt", cert=directory / f"{party}.crt", key=directory / f"{party}.key"
    )


def _health(files: TlsFiles, address: str, config: FederationConfig, *, peer: str = "guardian") -> int:
    interceptor = FederationClientInterceptor.dialling(config, tls=files, peer=peer)
    with files.channel(address, peer=peer, interceptors=(interceptor,)) as channel:
        return int(
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        )


def _rotate(layout: Layout, config: FederationConfig, work: Path) -> None:
    """The documented rotation: a new CA, then each party's new key, request, fingerprint and certificate."""
    init_ca(work / "ca-2", name=f"{config.name}-2")
    for party in config.party_names:
        made = request_certificate(
            party, out_dir=work / party, dns_names=("localhost",), ip_addresses=("127.0.0.1",)
        )
        sign_request(
            made.csr,
            ca_dir=work / "ca-2",
            federation=config,
            fingerprint_read_out=made.fingerprint.upper(),  # as read out over the phone
            out=work / party / f"{party}.crt",
        )
        for suffix in ("crt", "key"):  # the party installs its new files where its site file points
            (layout.certs / f"{party}.{suffix}").unlink()
            shutil.copy2(work / party / f"{party}.{suffix}", layout.certs / f"{party}.{suffix}")
    shutil.copy(work / "ca-2" / "ca.crt", layout.certs / "ca.crt")


def test_rotating_the_ca_locks_out_every_certificate_of_the_old_one(tmp_path: Path) -> None:
    layout, config, endpoints = provision(tmp_path / "federation", OPTIONS)
    address = f"127.0.0.1:{endpoints.guardian_grpc}"
    stolen = tmp_path / "stolen"  # everything of the old CA's world: what a thief of its key could hold
    shutil.copytree(layout.certs, stolen)
    _rotate(layout, config, tmp_path / "rotation")
    guardian = start_party(layout, party="guardian", role="guardian", admin_port=endpoints.admin["guardian"])
    try:
        wait_ready(layout, [guardian], timeout=120)
        assert _health(_files(layout.certs, "hospital-1"), address, config) == SERVING  # the new world
        # a stolen client key of the old CA: the guardian refuses it in the handshake
        thief = _files(stolen, "hospital-1", ca=layout.certs / "ca.crt")
        with pytest.raises(grpc.RpcError) as info:
            _health(thief, address, config)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stop_processes([guardian], grace=10)
    # the stolen guardian key as a server: a party on the new CA refuses it in the handshake; a party still on
    # the old CA would have taken it (which is why every party installs the new ca.crt)
    identity = ServerIdentity.load(_files(stolen, "guardian"))
    fake = start_grpc_server(
        bind="127.0.0.1:0",
        tls=_files(stolen, "guardian"),
        register=[],
        services=[rpc.GUARDIAN_SERVICE],
        interceptors=[AuthInterceptor(config=config, policy=POLICY, identity=identity)],
        max_workers=4,
    )
    try:
        with pytest.raises(grpc.RpcError) as info:
            _health(_files(layout.certs, "hospital-1"), f"127.0.0.1:{fake.port}", config)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert _health(_files(stolen, "hospital-1"), f"127.0.0.1:{fake.port}", config) == SERVING
    finally:
        fake.stop(0)
