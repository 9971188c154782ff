"""Revocation that holds: a revoked or retired certificate is refused by every party on every method.

Servers (the real guardian and student processes): every method of their services and of the health service
refuses hospital-2's revoked certificate, retired hospital-3's revoked certificate and hospital-3's other
certificate (its name is no party's any more). Clients (the student's guardian client, a teacher's work
stream): a server presenting the guardian's or the student's revoked certificate is refused before anything is
taken from it. Parties with different revocation lists refuse each other. A retirement must revoke.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from doors_harness import Doors, ledger_of
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.aggregation import party_noise
from capc_common.errors import InputError, ProtocolError
from capc_common.federation import FederationConfig, add_party, membership_change, retire_party
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.interceptors import (
    HASH_HEADER,
    REVOCATION_HEADER,
    AuthInterceptor,
    FederationClientInterceptor,
)
from capc_services.common.runtime import start_grpc_server
from capc_services.guardian.membership import record_change
from capc_services.guardian.servicer import POLICY as GUARDIAN_POLICY
from capc_services.student.guardian_client import GuardianClient
from capc_services.student.links import TeacherRegistry
from capc_services.student.servicer import POLICY as STUDENT_POLICY
from capc_services.student.servicer import StudentServicer
from capc_services.student.servicer import add_to_server as add_student
from capc_services.tls import ServerIdentity, TlsFiles

HEALTH = "grpc.health.v1.Health"


def _methods(service: str) -> list[tuple[str, bool, bool]]:
    """(full method name, client streaming, server streaming) of every method of ``service``."""
    described = descriptor_pool.Default().FindServiceByName(service)
    return [(f"/{service}/{m.name}", m.client_streaming, m.server_streaming) for m in described.methods]


EVERY_METHOD = {
    role: [*_methods(service), *_methods(HEALTH)]
    for role, service in (("guardian", rpc.GUARDIAN_SERVICE), ("student", rpc.STUDENT_SERVICE))
}


def _call(channel: grpc.Channel, method: str, streams: tuple[bool, bool], metadata: Any) -> grpc.RpcError:
    """Call ``method`` with an empty message (as raw bytes) and return the error it must end with."""
    client_streaming, server_streaming = streams
    with pytest.raises(grpc.RpcError) as info:
        if client_streaming:
            call = channel.stream_stream(method)(iter([b""]), metadata=metadata, timeout=10)
            list(call) if server_streaming else call
        elif server_streaming:
            list(channel.unary_stream(method)(b"", metadata=metadata, timeout=10))
        else:
            channel.unary_unary(method)(b"", metadata=metadata, timeout=10)
    return info.value


@pytest.mark.parametrize("role", ["guardian", "student"])
@pytest.mark.parametrize(
    ("holder", "refusal"),
    [
        (
            "revoked",
            r"serial [0-9a-f]+ of 'hospital-2' is revoked in federation.yaml \(key on a lost laptop\)",
        ),
        (
            "retired",
            r"serial [0-9a-f]+ of 'hospital-3' is revoked in federation.yaml \(left the consortium\)",
        ),
        ("retired_unlisted", r"'hospital-3' \(serial [0-9a-f]+\) is not a party of federation"),
    ],
)
def test_a_revoked_or_retired_certificate_is_refused_on_every_method(
    doors: Doors, role: str, holder: str, refusal: str
) -> None:
    files: TlsFiles = doors.revoked() if holder == "revoked" else getattr(doors, holder)
    metadata = (
        (HASH_HEADER, doors.config.config_hash()),
        (REVOCATION_HEADER, doors.config.revocation_hash()),
    )
    channel = files.channel(doors.grpc(role), peer=role)
    try:
        for method, *streams in EVERY_METHOD[role]:
            error = _call(channel, method, tuple(streams), metadata)  # type: ignore[arg-type]
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (method, error)
            assert re.search(refusal, error.details()), (method, error.details())
    finally:
        channel.close()
    assert len(EVERY_METHOD[role]) >= 4


class _Answering(rpc.GuardianServiceServicer):
    """What a fake guardian answers: anything, as long as the student takes it."""

    def BatchStatus(self, request: Any, context: Any) -> Any:
        return pb.BatchStatusReply(state=pb.BatchState.Value("BATCH_STATE_UNKNOWN"))

    def OpenBatch(self, request: Any, context: Any) -> Any:
        return pb.OpenBatchReply(state=pb.BatchState.Value("BATCH_STATE_OPEN"), remaining_rdp=1e9)


def _impostor(doors: Doors, party: str, register: Any, policy: Any) -> Any:
    """A server holding ``party``'s revoked key and certificate, running the real interceptor."""
    stolen = doors.revoked(party)
    interceptor = AuthInterceptor(config=doors.config, policy=policy, identity=ServerIdentity.load(stolen))
    return start_grpc_server(
        bind="127.0.0.1:0",
        tls=stolen,
        register=[register],
        services=[],
        interceptors=[interceptor],
        max_workers=4,
    )


def test_a_guardian_with_a_revoked_certificate_is_refused_by_the_student(doors: Doors) -> None:
    server = _impostor(
        doors,
        "guardian",
        lambda s: rpc.add_GuardianServiceServicer_to_server(_Answering(), s),
        GUARDIAN_POLICY,
    )
    client = GuardianClient(
        config=doors.config,
        tls=doors.files("student"),
        address=f"127.0.0.1:{server.port}",
        noise=party_noise("student"),
        timeout=10,
    )
    try:
        with pytest.raises(
            ProtocolError, match=r"refusing the server that answered as guardian: certificate serial"
        ):
            client.status("b")
        with pytest.raises(ProtocolError, match=r"is revoked in federation.yaml \(key on a lost laptop\)"):
            client.open_batch("b", count=1, digest=b"\0" * 32)
    finally:
        client.close()
        server.stop(0)


def test_a_student_with_a_revoked_certificate_gets_no_teachers_share(doors: Doors) -> None:
    registry = TeacherRegistry()
    server = _impostor(
        doors, "student", add_student(StudentServicer(config=doors.config, registry=registry)), STUDENT_POLICY
    )
    files = doors.files("hospital-1")
    interceptor = FederationClientInterceptor.dialling(doors.config, tls=files, peer="student")
    channel = files.channel(f"127.0.0.1:{server.port}", peer="student", interceptors=(interceptor,))
    stop = threading.Event()

    def hello() -> Iterator[pb.TeacherMessage]:
        yield pb.TeacherMessage(hello=pb.TeacherHello(party="hospital-1", heads=2))
        stop.wait(10)

    try:
        work = rpc.StudentServiceStub(channel).Work(hello(), timeout=20)
        with pytest.raises(ProtocolError, match="refusing the server that answered as student"):
            next(work)  # the welcome is never handed to the teacher: it sends no share to this server
    finally:
        stop.set()
        channel.close()
        registry.close_all()
        server.stop(0)


def test_parties_with_different_revocation_lists_refuse_each_other(doors: Doors) -> None:
    stale = FederationConfig.from_dict({**doors.config.model_dump(mode="json"), "revoked": []})
    files = doors.files("student")
    interceptor = FederationClientInterceptor.dialling(stale, tls=files, peer="guardian")
    with files.channel(doors.grpc("guardian"), peer="guardian", interceptors=(interceptor,)) as channel:
        with pytest.raises(grpc.RpcError) as info:
            rpc.GuardianServiceStub(channel).BatchStatus(pb.BatchStatusRequest(batch_id="b"), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (
            "runs revocation list" in info.value.details()
            and "(0 revoked certificates)" not in info.value.details()
        )
        # and the client refuses the server's list on a reply the server sends without checking (health)
        with pytest.raises(ProtocolError, match=r"guardian runs revocation list [0-9a-f]{16}, this party"):
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)


def test_a_retirement_must_revoke_the_certificates_the_party_used(doors: Doors, tmp_path: Path) -> None:
    config = doors.config
    retired = retire_party(config, name="hospital-2", serial="5f3a", reason="left", min_parties=1)
    unrevoked = FederationConfig.from_dict(
        {**retired.model_dump(mode="json"), "revoked": config.model_dump(mode="json")["revoked"]}
    )
    with pytest.raises(InputError, match=r"retiring \['hospital-2'\] needs their certificates revoked"):
        membership_change(config, unrevoked)
    with ledger_of(config, tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(
            InputError, match=r"certificate serial\(s\) \['abcd'\] it called this guardian with"
        ):
            record_change(
                config=config,
                ledger=ledger,
                proposed=retired.model_dump(mode="json"),
                token="t" * 40,
                serials={"hospital-2": {"abcd", "5f3a"}},
            )
        assert ledger.membership_changes() == []
        recorded = record_change(
            config=config,
            ledger=ledger,
            proposed=retired.model_dump(mode="json"),
            token="t" * 40,
            serials={"hospital-2": {"5f3a"}},
        )
    assert recorded["retired"] == ["hospital-2"]
    # and added back under its old name, the party's revoked certificate stays refused
    back = add_party(retired, name="hospital-2", heads=2)
    assert "5f3a" in back.revoked_serials
