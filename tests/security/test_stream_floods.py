"""One certified peer holding idle streams cannot freeze a party: the real guardian and student on loopback.

64 idle streams from one teacher's certificate — health watches (not served: refused at once) and work
streams that never say hello (a thread each, until their first-message deadline) — leave the party serving
everyone else at once: past ``grpc.max_calls_per_peer`` open calls the peer is refused
(``RESOURCE_EXHAUSTED``), and a stream without its first message ends after ``grpc.first_message_s``
(``DEADLINE_EXCEEDED``). Bounded in count (64) and time (a few seconds); loopback only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from doors_harness import CALLS_PER_PEER, FIRST_MESSAGE_S, Doors
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.admission import StreamLimits
from capc_services.common.interceptors import (
    HASH_HEADER,
    REVOCATION_HEADER,
    AuthInterceptor,
    FederationClientInterceptor,
)
from capc_services.common.runtime import start_grpc_server
from capc_services.tls import ServerIdentity

FLOOD = 64
SERVING = health_pb2.HealthCheckResponse.SERVING


def _channel(doors: Doors, party: str, role: str) -> grpc.Channel:
    files = doors.files(party)
    interceptor = FederationClientInterceptor.dialling(doors.config, tls=files, peer=role)
    return files.channel(doors.grpc(role), peer=role, interceptors=(interceptor,))


def _silent(stop: threading.Event) -> Iterator[Any]:
    """A request stream that sends nothing until ``stop``."""
    stop.wait()
    yield from ()


def _others_are_served(doors: Doors, role: str) -> float:
    """Seconds for another party's health check and, on the guardian, the student's batch call."""
    start = time.monotonic()
    with _channel(doors, "hospital-2", role) as other:
        reply = health_pb2_grpc.HealthStub(other).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == SERVING
    if role == "guardian":
        with _channel(doors, "student", "guardian") as student:
            status = rpc.GuardianServiceStub(student).BatchStatus(
                pb.BatchStatusRequest(batch_id="b"), timeout=5
            )
            assert status.state == pb.BatchState.Value("BATCH_STATE_UNKNOWN")
    return time.monotonic() - start


@pytest.mark.parametrize("role", ["guardian", "student"])
def test_64_health_watches_from_one_peer_leave_the_party_serving_others(doors: Doors, role: str) -> None:
    flooder = _channel(doors, "hospital-1", role)
    watches = [
        health_pb2_grpc.HealthStub(flooder).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        for _ in range(FLOOD)
    ]
    try:
        codes = []
        for watch in watches:
            with pytest.raises(grpc.RpcError) as info:
                next(watch)
            codes.append(info.value.code())
        assert codes == [grpc.StatusCode.UNIMPLEMENTED] * FLOOD  # not served: poll Check
        took = _others_are_served(doors, role)
        print(f"{role}: {FLOOD} health watches from hospital-1 refused; others served in {took:.3f} s")
        assert took < 3.0
    finally:
        for watch in watches:
            watch.cancel()
        flooder.close()


def test_64_work_streams_that_never_say_hello_leave_the_student_serving_others(doors: Doors) -> None:
    stop = threading.Event()
    flooder = _channel(doors, "hospital-1", "student")
    streams = [rpc.StudentServiceStub(flooder).Work(_silent(stop), timeout=60) for _ in range(FLOOD)]
    ended: list[tuple[Any, float]] = []
    start = time.monotonic()

    def drain(stream: Any) -> None:
        try:
            next(stream)
        except grpc.RpcError as exc:
            ended.append((exc.code(), time.monotonic() - start))

    readers = [threading.Thread(target=drain, args=(s,), daemon=True) for s in streams]
    for reader in readers:
        reader.start()
    try:
        # hospital-2 says hello and is welcomed while hospital-1's streams sit idle
        hello = pb.TeacherMessage(hello=pb.TeacherHello(party="hospital-2", heads=2))
        with _channel(doors, "hospital-2", "student") as other:
            work = rpc.StudentServiceStub(other).Work(iter([hello]), timeout=10)
            assert next(work).WhichOneof("kind") == "welcome"
            work.cancel()
        for reader in readers:
            reader.join(timeout=FIRST_MESSAGE_S + 10)
        codes = [code for code, _ in ended]
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == FLOOD - CALLS_PER_PEER, codes
        assert codes.count(grpc.StatusCode.DEADLINE_EXCEEDED) == CALLS_PER_PEER, codes
        last = max(s for code, s in ended if code == grpc.StatusCode.DEADLINE_EXCEEDED)
        assert last < FIRST_MESSAGE_S + 5
        took = _others_are_served(doors, "student")
        print(
            f"student: {FLOOD} silent work streams, the idle ones ended by {last:.1f} s; "
            f"others served in {took:.3f} s"
        )
        assert took < 3.0
    finally:
        stop.set()
        for stream in streams:
            stream.cancel()
        flooder.close()


def test_idle_compute_streams_end_after_the_first_message_deadline(doors: Doors) -> None:
    stop = threading.Event()
    channel = _channel(doors, "student", "guardian")
    streams = [
        rpc.GuardianServiceStub(channel).Compute(_silent(stop), timeout=60) for _ in range(CALLS_PER_PEER)
    ]
    try:
        start = time.monotonic()
        for stream in streams:
            with pytest.raises(grpc.RpcError) as info:
                next(stream)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "no first message within 2 s (grpc.first_message_s)" in info.value.details()
        assert time.monotonic() - start < FIRST_MESSAGE_S + 5
        assert _others_are_served(doors, "guardian") < 3.0
    finally:
        stop.set()
        channel.close()


class _Ticker:
    """A callback-driven streaming method, as the health service's ``Watch`` is: it answers once and keeps the
    call open with no thread of its own — unless gRPC is not told it is callback-driven, when it falls back to
    a blocking iterator (one worker thread per open call, like ``Watch``'s fallback)."""

    def __init__(self) -> None:
        self.experimental_non_blocking = True

    def __call__(self, request: bytes, context: Any, send_response_callback: Any = None) -> Any:
        if send_response_callback is not None:
            send_response_callback(b"tick")
            return None
        return self._blocking(context)

    @staticmethod
    def _blocking(context: Any) -> Iterator[bytes]:
        yield b"tick"
        while context.is_active():
            time.sleep(0.05)


def test_a_callback_driven_method_holds_no_worker_thread_behind_the_interceptor(doors: Doors) -> None:
    """16 open calls of a callback-driven method on a server of 4 worker threads leave it answering at once:
    the interceptor keeps the handler's ``experimental_non_blocking``."""
    method = "/capc.test.Ticker/Tick"
    ticker = grpc.method_handlers_generic_handler(
        "capc.test.Ticker", {"Tick": grpc.unary_stream_rpc_method_handler(_Ticker())}
    )
    guardian = doors.files("guardian")
    auth = AuthInterceptor(
        config=doors.config,
        policy={method: frozenset({"teacher"})},
        identity=ServerIdentity.load(guardian),
        limits=StreamLimits(calls_per_peer=64),
    )
    server = start_grpc_server(
        bind="127.0.0.1:0",
        tls=guardian,
        register=[lambda s: s.add_generic_rpc_handlers((ticker,))],
        services=[],
        interceptors=[auth],
        max_workers=4,
    )
    hashes = ((HASH_HEADER, doors.config.config_hash()), (REVOCATION_HEADER, doors.config.revocation_hash()))
    channel = doors.files("hospital-1").channel(f"127.0.0.1:{server.port}", peer="guardian")
    calls = [channel.unary_stream(method)(b"", metadata=hashes, timeout=30) for _ in range(16)]
    try:
        assert [next(call) for call in calls] == [b"tick"] * 16
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        assert reply.status == SERVING
    finally:
        for call in calls:
            call.cancel()
        channel.close()
        server.stop(0)
