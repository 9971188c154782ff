"""The link lab's parts on their own, as real sockets, namespaces and cgroups: the proxy's delay, stall,
reset and half-open connections; a party's namespace reaches nothing but its own link; a throttled process
gets a tenth of a core; a skewed process's wall clock, and its certificate checks, are minutes off. Where
namespaces cannot be made the link tests run on loopback (the lab's own fallback) — except under
``CI=true``, where the machine is expected to allow them (``require``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capc_services.common.runtime import start_grpc_server
from capc_services.lab import clock, cpu, netns
from capc_services.lab.proxy import ProxyProcess
from capc_services.tls import TlsFiles, grpc_options

Require = Callable[[bool, str], None]


def tls_files(pki: Path, party: str) -> TlsFiles:
    return TlsFiles(ca=pki / "ca.crt", cert=pki / f"{party}.crt", key=pki / f"{party}.key")


@pytest.fixture(scope="module")
def echo() -> Iterator[int]:
    """A TCP echo server on loopback; its port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass


@pytest.fixture(scope="module")
def proxies() -> Iterator[ProxyProcess]:
    running = ProxyProcess()
    yield running
    running.close()


@pytest.fixture
def proxy(proxies: ProxyProcess, echo: int, request: pytest.FixtureRequest) -> Iterator[tuple[Link, int]]:
    """A link of its own on the module's proxy process, to the echo server."""
    name = request.node.name
    port = proxies.call("link", name=name, listen="127.0.0.1:0", target=f"127.0.0.1:{echo}", seed=0)["port"]
    yield Link(proxies, name), int(port)


class Link:
    """One link's commands (the proxy process serves every test's link)."""

    def __init__(self, proxies: ProxyProcess, name: str) -> None:
        self.proxies, self.name = proxies, name

    def call(self, op: str, **args: object) -> dict[str, object]:
        args.pop("name", None)
        return self.proxies.call(op, name=self.name, **args)


def _round_trip(conn: socket.socket) -> float:
    start = time.perf_counter()
    conn.sendall(b"x")
    assert conn.recv(16) == b"x"
    return time.perf_counter() - start


def test_the_proxy_adds_its_delay_each_way_and_holds_bytes_through_a_stall(
    proxy: tuple[Link, int],
) -> None:
    link, port = proxy
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        assert _round_trip(conn) < 0.05
        link.call("set", name="l", delay_ms=40.0)
        rtts = sorted(_round_trip(conn) for _ in range(5))
        assert 0.078 <= rtts[2] < 0.2, rtts  # 2 × 40 ms, one way each
        link.call("set", name="l", delay_ms=0.0)
        link.call("stall", name="l", seconds=0.5)
        assert 0.45 <= _round_trip(conn) < 2.0  # held, then delivered: the connection stayed up


def test_a_reset_is_a_tcp_rst_mid_stream(proxy: tuple[Link, int]) -> None:
    link, port = proxy
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        _round_trip(conn)
        assert link.call("reset", name="l")["connections"] == 1
        with pytest.raises(ConnectionResetError):
            conn.sendall(b"y")
            conn.recv(16)


def test_a_blackhole_leaves_the_connection_half_open_and_new_ones_pass(
    proxy: tuple[Link, int],
) -> None:
    link, port = proxy
    with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
        _round_trip(conn)
        assert link.call("blackhole", name="l")["connections"] == 1
        conn.sendall(b"z")  # accepted by TCP …
        with pytest.raises(TimeoutError):
            conn.recv(16)  # … and never answered: no data, no FIN, no RST
        with socket.create_connection(("127.0.0.1", port), timeout=5) as fresh:
            assert _round_trip(fresh) < 1.0


def test_a_half_open_connection_is_dropped_by_the_keepalive_ping_timeout(proxies: ProxyProcess) -> None:
    """A long-lived call on a connection the link blackholes fails UNAVAILABLE once a keepalive ping goes
    unanswered for the ping timeout (10 s), not gRPC's default minute: the party then reconnects. The test
    pings every second instead of every 20 s, to wait 10 s rather than 30."""
    server = grpc.server(futures.ThreadPoolExecutor(2), options=list(grpc_options(server=True)))
    checks = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    link = proxies.call("link", name="keepalive", listen="127.0.0.1:0", target=f"127.0.0.1:{port}", seed=0)
    options = [(k, 1000 if k == "grpc.keepalive_time_ms" else v) for k, v in grpc_options()]
    channel = grpc.insecure_channel(f"127.0.0.1:{link['port']}", options=options)
    try:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=120)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        proxies.call("blackhole", name="keepalive")
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as dropped:
            next(watch)
        assert dropped.value.code() == grpc.StatusCode.UNAVAILABLE, dropped.value
        assert time.monotonic() - start < 20  # 1 s to the next ping + 10 s unanswered (was 1 s + 60 s)
    finally:
        channel.close()
        server.stop(0)


def test_a_partition_on_loopback_swallows_old_and_new_connections(proxy: tuple[Link, int]) -> None:
    link, port = proxy
    with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
        _round_trip(conn)
        link.call("set", name="l", partitioned=True)
        link.call("blackhole", name="l")
        with socket.create_connection(("127.0.0.1", port), timeout=1) as fresh:
            fresh.sendall(b"q")
            with pytest.raises(TimeoutError):
                fresh.recv(16)
        link.call("set", name="l", partitioned=False)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as healed:
            assert _round_trip(healed) < 1.0


def test_a_party_namespace_reaches_only_its_own_link(require: Require) -> None:
    permitted, why = netns.available()
    if os.environ.get("CI", "").strip().lower() == "true":
        require(permitted, why)
    elif not permitted:
        pytest.skip(f"the lab falls back to loopback here: {why}")
    spaces = netns.Namespaces(["a", "b"])
    try:
        # From a's namespace: the root end of a's link answers (a port nobody listens on: refused), b's
        # address and everything else have no route at all.
        script = (
            "import socket, sys\n"
            "for host in sys.argv[1:]:\n"
            "    try:\n"
            "        socket.create_connection((host, 9), timeout=2)\n"
            "    except OSError as exc:\n"
            "        print(type(exc).__name__)\n"
        )
        hosts = [spaces.host_ip("a"), spaces.party_ip("b"), "8.8.8.8"]
        out = subprocess.run(
            ["nsenter", f"--net={spaces.path('a')}", "--", sys.executable, "-c", script, *hosts],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        assert out == ["ConnectionRefusedError", "OSError", "OSError"], out
    finally:
        spaces.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert spaces.lab not in listed  # closed: every namespace of the lab is gone


def test_a_throttled_process_gets_a_tenth_of_a_core(require: Require) -> None:
    permitted, why = cpu.available()
    require(permitted, why)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        throttle = cpu.Throttle(spin.pid, share=0.1)
        try:
            before, start = _cpu_seconds(spin.pid), time.monotonic()
            time.sleep(1.5)
            share = (_cpu_seconds(spin.pid) - before) / (time.monotonic() - start)
        finally:
            throttle.close()
        assert share < 0.2, share  # a tenth, with the kernel's accounting slack
    finally:
        spin.kill()
        spin.wait(timeout=10)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_CLIENT = """
import sys, time
from pathlib import Path
from capc_services.tls import TlsFiles, channel_ready
pki, address = Path(sys.argv[1]), sys.argv[2]
files = TlsFiles(ca=pki / "ca.crt", cert=pki / "student.crt", key=pki / "student.key")
now = time.time()
time.sleep(0.01)  # sleeps are the kernel's: they still work
print(round(now), channel_ready(files.channel(address, peer="guardian"), timeout=2))
"""


def test_a_skewed_party_reads_its_date_off_and_checks_certificates_by_it(pki: Path, require: Require) -> None:
    """Certificates are valid from 5 minutes before they were issued: a party 2 minutes behind still connects;
    one an hour behind sees the guardian's certificate as not yet valid and the handshake fails."""
    permitted, why = clock.available()
    require(permitted, why)
    server = start_grpc_server(
        bind="127.0.0.1:0", tls=tls_files(pki, "guardian"), register=[], services=[], interceptors=[]
    )
    try:
        seen = {}
        for skew in (-120, -3600):
            env, before = {**os.environ, **clock.skewed(skew)}, time.time()
            out = subprocess.run(
                [sys.executable, "-c", _CLIENT, str(pki), f"127.0.0.1:{server.port}"],
                capture_output=True, text=True, timeout=60, env=env, check=False,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
            fields = out.stdout.split()
            seen[skew] = (int(fields[0]) - before, fields[1])  # the child read its clock within seconds
        assert -121 <= seen[-120][0] <= -110 and seen[-120][1] == "True", seen
        assert -3601 <= seen[-3600][0] <= -3590 and seen[-3600][1] == "False", seen
    finally:
        server.stop(0)
