"""Mutual TLS, identity and config-hash checks on a real gRPC server over loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.federation import FederationConfig
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.interceptors import HASH_HEADER, AuthInterceptor, FederationClientInterceptor
from capc_services.common.runtime import GrpcServer, start_grpc_server
from capc_services.tls import ServerIdentity, TlsFiles, certificate_info, issue_certificate

STATUS = f"/{rpc.GUARDIAN_SERVICE}/BatchStatus"
SERVING = health_pb2.HealthCheckResponse.SERVING


class _StatusOnly(rpc.GuardianServiceServicer):
    def BatchStatus(self, request, context):
        return pb.BatchStatusReply(state=pb.BatchState.Value("BATCH_STATE_UNKNOWN"), detail=request.batch_id)


def _files(pki: Path, party: str, ca: Path | None = None) -> TlsFiles:
    return TlsFiles(ca=ca or pki / "ca.crt", cert=pki / f"{party}.crt", key=pki / f"{party}.key")


@pytest.fixture
def server(pki: Path, federation_dict) -> Iterator[tuple[GrpcServer, FederationConfig]]:
    config = FederationConfig.from_dict(federation_dict())
    rejected: list[tuple[str, str, str]] = []
    interceptor = AuthInterceptor(
        config=config,
        policy={STATUS: frozenset({"student"})},
        identity=ServerIdentity.load(_files(pki, "guardian")),
        on_reject=lambda m, p, c: rejected.append((m, p, c)),
    )
    srv = start_grpc_server(
        bind="127.0.0.1:0",
        tls=_files(pki, "guardian"),
        register=[lambda s: rpc.add_GuardianServiceServicer_to_server(_StatusOnly(), s)],
        services=[rpc.GUARDIAN_SERVICE],
        interceptors=[interceptor],
        max_workers=4,
    )
    yield srv, config
    srv.stop(0)


def _stub(files: TlsFiles, port: int, *, config: FederationConfig, peer: str = "guardian"):
    interceptor = FederationClientInterceptor.dialling(config, tls=files, peer=peer)
    channel = files.channel(f"127.0.0.1:{port}", peer=peer, interceptors=(interceptor,))
    return rpc.GuardianServiceStub(channel), channel


def test_student_with_matching_config_is_served(pki, server) -> None:
    srv, config = server
    stub, channel = _stub(_files(pki, "student"), srv.port, config=config)
    reply, call = stub.BatchStatus.with_call(pb.BatchStatusRequest(batch_id="b1"), timeout=10)
    assert reply.detail == "b1"
    assert dict(call.initial_metadata())[HASH_HEADER] == config.config_hash()
    channel.close()


@pytest.mark.parametrize("party", ["hospital-a", "outsider", "guardian"])
def test_other_parties_are_denied(pki, server, party: str) -> None:
    srv, config = server
    stub, channel = _stub(_files(pki, party), srv.port, config=config)
    with pytest.raises(grpc.RpcError) as info:
        stub.BatchStatus(pb.BatchStatusRequest(batch_id="b1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"CN {party!r}" in info.value.details()
    channel.close()


def test_config_hash_mismatch_is_refused(pki, server, federation_dict) -> None:
    srv, _ = server
    other = FederationConfig.from_dict(federation_dict(name="another"))
    stub, channel = _stub(_files(pki, "student"), srv.port, config=other)
    with pytest.raises(grpc.RpcError) as info:
        stub.BatchStatus(pb.BatchStatusRequest(batch_id="b1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "federation config hash mismatch" in info.value.details()
    assert other.config_hash()[:16] in info.value.details()
    channel.close()


def test_client_without_certificate_fails_the_handshake(pki, server) -> None:
    srv, _ = server
    creds = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.crt").read_bytes())
    channel = grpc.secure_channel(
        f"127.0.0.1:{srv.port}", creds, options=[("grpc.ssl_target_name_override", "guardian")]
    )
    with pytest.raises(grpc.RpcError) as info:
        rpc.GuardianServiceStub(channel).BatchStatus(pb.BatchStatusRequest(batch_id="b1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()


def test_certificate_from_another_ca_fails_the_handshake(pki, server) -> None:
    srv, config = server
    foreign = TlsFiles(
        ca=pki / "ca.crt", cert=pki / "foreign" / "student.crt", key=pki / "foreign" / "student.key"
    )
    stub, channel = _stub(foreign, srv.port, config=config)
    with pytest.raises(grpc.RpcError) as info:
        stub.BatchStatus(pb.BatchStatusRequest(batch_id="b1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()


def test_client_refuses_a_server_that_is_not_the_expected_party(pki, server) -> None:
    srv, config = server
    stub, channel = _stub(_files(pki, "student"), srv.port, config=config, peer="student")
    with pytest.raises(grpc.RpcError) as info:
        stub.BatchStatus(pb.BatchStatusRequest(batch_id="b1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()


def test_health_service_reports_serving_to_parties_only(pki, server) -> None:
    srv, _ = server
    request = health_pb2.HealthCheckRequest(service=rpc.GUARDIAN_SERVICE)
    party = _files(pki, "hospital-a").channel(f"127.0.0.1:{srv.port}", peer="guardian")
    assert health_pb2_grpc.HealthStub(party).Check(request, timeout=10).status == SERVING
    stranger = _files(pki, "outsider").channel(f"127.0.0.1:{srv.port}", peer="guardian")
    with pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(stranger).Check(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'outsider'" in info.value.details() and "not a party of federation" in info.value.details()
    srv.stop(0)
    party.close()
    stranger.close()


def test_private_key_readable_by_others_is_refused(tmp_path: Path, pki: Path) -> None:
    key = tmp_path / "k.key"
    key.write_bytes((pki / "student.key").read_bytes())
    key.chmod(0o644)
    files = TlsFiles(ca=pki / "ca.crt", cert=pki / "student.crt", key=key)
    with pytest.raises(Exception, match="chmod 600"):
        files.channel("127.0.0.1:1", peer="guardian")


def _revoking(config: FederationConfig, *serials: str) -> FederationConfig:
    revoked = [{"serial": s, "party": "student", "reason": "laptop lost"} for s in serials]
    return FederationConfig.from_dict({**config.model_dump(mode="json"), "revoked": revoked})


def _server_for(pki: Path, config: FederationConfig) -> GrpcServer:
    return start_grpc_server(
        bind="127.0.0.1:0",
        tls=_files(pki, "guardian"),
        register=[lambda s: rpc.add_GuardianServiceServicer_to_server(_StatusOnly(), s)],
        services=[rpc.GUARDIAN_SERVICE],
        interceptors=[
            AuthInterceptor(
                config=config,
                policy={STATUS: frozenset({"student"})},
                identity=ServerIdentity.load(_files(pki, "guardian")),
            )
        ],
        max_workers=4,
    )


def test_a_revoked_certificate_is_refused_even_for_health(pki, server) -> None:
    # Prepare: the federation revokes the student's certificate by serial (upper case, colons: normalised)
    _, config = server
    serial = certificate_info(pki / "student.crt").serial
    spelled = ":".join(serial.upper().zfill(40)[i : i + 2] for i in range(0, 40, 2))
    revoking = _revoking(config, spelled)
    srv = _server_for(pki, revoking)
    stub, channel = _stub(_files(pki, "student"), srv.port, config=revoking)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        # Execute / Assert
        for call in (
            lambda: stub.BatchStatus(pb.BatchStatusRequest(batch_id="b1"), timeout=10),
            lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=10),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert f"serial {serial} of 'student' is revoked in federation.yaml (laptop lost)" in (
                info.value.details()
            )
    finally:
        channel.close()
        srv.stop(0)
    # the revocation list is not a parameter: the config hash (ledger, label store, caps) stays the same
    assert revoking.config_hash() == config.config_hash()


def test_a_student_certificate_naming_the_guardian_is_refused(pki, server, tmp_path: Path) -> None:
    srv, config = server
    issue_certificate(pki, "student", out_dir=tmp_path, dns_names=("GUARDIAN",))
    files = TlsFiles(ca=pki / "ca.crt", cert=tmp_path / "student.crt", key=tmp_path / "student.key")
    stub, channel = _stub(files, srv.port, config=config)
    with pytest.raises(grpc.RpcError) as info:
        stub.BatchStatus(pb.BatchStatusRequest(batch_id="b1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "carries the name(s) ['GUARDIAN'] of another party" in info.value.details()
    channel.close()


def test_a_timed_out_readiness_probe_leaves_no_poller_behind(pki: Path) -> None:
    """A readiness probe that times out unsubscribes: left waiting, each one kept a callback on the channel
    and gRPC's connectivity poller thread running for as long as the channel lived (a teacher probes its
    guardian at every vote deadline while it is down), and that thread died with "Channel closed!" once
    the channel was closed."""
    import socket
    import threading
    import time

    from capc_services.tls import channel_ready

    with socket.socket() as free:  # a port nobody listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    before = set(threading.enumerate())  # other tests' threads may end meanwhile: only new ones count
    channel = _files(pki, "student").channel(f"127.0.0.1:{port}", peer="guardian")
    try:
        assert not channel_ready(channel, timeout=0.3)
        assert not channel_ready(channel, timeout=0.3)
        deadline = time.monotonic() + 5
        while set(threading.enumerate()) - before and time.monotonic() < deadline:
            time.sleep(0.05)  # the poller notices at its next wake-up (every 0.2 s)
        assert not set(threading.enumerate()) - before
    finally:
        channel.close()


def test_a_probe_on_a_channel_this_side_closed_is_not_a_reachable_peer(pki) -> None:
    """A teacher shutting down closes its guardian channel while its work thread may still probe it: that
    probe (cut off, or made after the close) must say "not reachable", so that nothing is charged to the
    party's cap for a share no guardian can take, and no thread dies with grpc's ValueError."""
    import socket
    import threading

    from capc_services.tls import channel_ready

    with socket.socket() as free:  # a port nobody listens on: the probe waits until the close cuts it off
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    channel = _files(pki, "student").channel(f"127.0.0.1:{port}", peer="guardian")
    threading.Timer(0.3, channel.close).start()
    assert not channel_ready(channel, timeout=10)  # cut off by the close: CANCELLED
    assert not channel_ready(channel, timeout=10)  # after it: "Cannot invoke RPC on closed channel!"


@pytest.mark.parametrize("party", ["student", "outsider"])
def test_a_readiness_probe_that_reaches_its_peer_runs_no_thread_beside_the_channel(
    pki, server, party
) -> None:
    """A probe that succeeds (a refusal is an answer: the connection is up) and the channel closed right
    after: gRPC's connectivity poller, which a probe used to start, was still looking at the channel then and
    died with "Channel closed!" (PytestUnhandledThreadExceptionWarning in the student's tests)."""
    import threading

    from capc_services.tls import channel_ready

    srv, config = server
    before = set(threading.enumerate())
    _, channel = _stub(_files(pki, party), srv.port, config=config)
    try:
        assert channel_ready(channel, timeout=10)
        beside = {t for t in set(threading.enumerate()) - before if not t.name.startswith("grpc")}
        assert not beside  # the server's own workers ("grpc_N") answered the probe: not the channel's
    finally:
        channel.close()
