"""A userspace TCP proxy per link, for what this kernel cannot do to a link: one-way delay and jitter (it has
no ``netem``), stalls, resets mid-stream and half-open connections — and, where no network namespace can be
made, bandwidth and partitions as well.

Every byte a party sends to a peer crosses the proxy of that link: read from one socket, held until its
delivery time, written to the other. Each direction keeps its bytes in order (a chunk is never delivered
before the one read before it), as TCP does. Faults:

* **delay / jitter**: each chunk is delivered ``delay_ms`` ± ``jitter_ms`` (uniform) after it was read — a
  one-way delay, so a round trip through the link costs twice ``delay_ms``;
* **stall**: nothing is delivered either way for some seconds; connections stay up, then go on;
* **reset**: every open connection of the link is closed with a TCP RST (SO_LINGER 0), mid-stream;
* **blackhole**: every open connection silently swallows whatever comes, for ever — no FIN, no RST: the
  bytes are acknowledged by TCP and never answered, so each party holds a half-open connection that only its
  own deadlines or keepalives can tell dead; new connections pass;
* **partition** (only without namespaces, where ``iptables`` cannot): existing connections are swallowed as
  by a blackhole and new ones accepted and swallowed;
* **rate** (only without namespaces, where ``tc tbf`` cannot): each direction delivers at most
  ``rate_bps`` bits per second.

The proxy runs as its own process (``python -m capc_services.lab.proxy``), so its timing does not share an
interpreter with the harness that measures; it reads one JSON command per line on stdin and answers one JSON
line on stdout (:class:`ProxyProcess` is the harness's side). Jitter is not secret: it comes from a seeded
generator, so a run can be repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capc_common.errors import UnavailableError

__all__ = ["LinkSpec", "ProxyProcess"]
CHUNK = 1 << 16
CONNECT_TIMEOUT_S = 10.0
BUFFER_BYTES = 4 << 20
"""Bytes one direction of a connection may hold in the proxy; beyond that it stops reading, so a sender feels
the link's backpressure through TCP as it would a slow path's."""


@dataclass
class LinkSpec:
    """How a link behaves now (every field may change while connections are open)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    rate_bps: float | None = None
    stall_until: float = 0.0  # monotonic time
    partitioned: bool = False


@dataclass
class _Direction:
    """One direction of one connection: chunks waiting for their delivery time."""

    queue: deque[tuple[float, bytes | None]] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    last_due: float = 0.0
    held: int = 0


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    swallowed: bool = False  # blackholed: nothing more is delivered, nothing closed
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    directions: tuple[_Direction, ...] = ()


class _Link:
    def __init__(self, name: str, target: tuple[str, int], spec: LinkSpec, *, seed: int) -> None:
        self.name, self.target, self.spec = name, target, spec
        self.rng = np.random.default_rng(seed)  # not secret: jitter only
        self.connections: set[_Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.accepted = self.resets = 0
        self.bytes = [0, 0]  # client → target, target → client

    def due(self, now: float) -> float:
        jitter = self.spec.jitter_ms
        delay = self.spec.delay_ms + (float(self.rng.uniform(-jitter, jitter)) if jitter else 0.0)
        return now + max(delay, 0.0) / 1000.0


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST: SO_LINGER on, zero seconds."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class LinkProxy:
    """The proxy's engine: the links of one lab on one event loop."""

    def __init__(self) -> None:
        self.links: dict[str, _Link] = {}

    async def add(self, name: str, *, listen: str, target: str, seed: int, **spec: Any) -> int:
        host, port = listen.rsplit(":", 1)
        thost, tport = target.rsplit(":", 1)
        link = _Link(name, (thost, int(tport)), LinkSpec(**spec), seed=seed)
        link.server = await asyncio.start_server(
            lambda r, w: self._accept(link, r, w), host=host, port=int(port), backlog=128
        )
        self.links[name] = link
        return int(link.server.sockets[0].getsockname()[1])

    async def _accept(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link.accepted += 1
        conn = _Connection(client=writer, swallowed=link.spec.partitioned)
        link.connections.add(conn)
        try:
            if conn.swallowed:
                await self._swallow(reader)
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*link.target), timeout=CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                _rst(writer)  # the peer refused: so does the link (as a router would answer)
                return
            conn.upstream = up_writer
            forward, backward = _Direction(), _Direction()
            conn.directions = (forward, backward)
            conn.tasks = [
                asyncio.ensure_future(self._read(link, conn, reader, forward, 0)),
                asyncio.ensure_future(self._write(link, conn, up_writer, forward)),
                asyncio.ensure_future(self._read(link, conn, up_reader, backward, 1)),
                asyncio.ensure_future(self._write(link, conn, writer, backward)),
            ]
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        except asyncio.CancelledError:
            pass  # the proxy is stopping
        finally:  # both peers closed their ends (a swallowed connection: both gave up on it), or a reset
            link.connections.discard(conn)
            for end in (writer, conn.upstream):
                if end is not None:
                    end.close()

    @staticmethod
    async def _swallow(reader: asyncio.StreamReader) -> None:
        while await reader.read(CHUNK):
            pass

    async def _read(
        self, link: _Link, conn: _Connection, reader: asyncio.StreamReader, out: _Direction, way: int
    ) -> None:
        while True:
            try:
                data = await reader.read(CHUNK)
            except OSError:
                data = b""
            if conn.swallowed:
                if not data:
                    return
                continue  # swallowed: read and forgotten, the sender sees its bytes acknowledged
            link.bytes[way] += len(data)
            due = max(link.due(time.monotonic()), out.last_due)  # in order, as TCP delivers
            out.last_due = due
            out.queue.append((due, data or None))
            out.held += len(data)
            out.ready.set()
            if not data:
                return
            while out.held > BUFFER_BYTES and not conn.swallowed:
                out.room.clear()
                await out.room.wait()

    async def _write(
        self, link: _Link, conn: _Connection, writer: asyncio.StreamWriter, out: _Direction
    ) -> None:
        while True:
            await out.ready.wait()
            out.ready.clear()
            while out.queue:
                if conn.swallowed:  # half-open for good: nothing more is delivered, only a peer closes it
                    out.queue.clear()
                    out.room.set()
                    return
                due, data = out.queue[0]
                wait = max(due, link.spec.stall_until) - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(min(wait, 0.05))  # short steps: a stall or reset may come meanwhile
                    continue
                out.queue.popleft()
                out.held -= len(data or b"")
                if out.held <= BUFFER_BYTES:
                    out.room.set()
                if data is None:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                if link.spec.rate_bps:
                    await asyncio.sleep(len(data) * 8 / link.spec.rate_bps)
                try:
                    writer.write(data)
                    await writer.drain()
                except (OSError, ConnectionError):
                    return

    def update(self, name: str, **spec: Any) -> None:
        link = self.links[name]
        for key, value in spec.items():
            if not hasattr(link.spec, key):
                raise ValueError(f"unknown link setting {key!r}")
            setattr(link.spec, key, value)

    def stall(self, name: str, seconds: float) -> None:
        self.links[name].spec.stall_until = time.monotonic() + seconds

    def reset(self, name: str) -> int:
        link = self.links[name]
        for conn in list(link.connections):
            for end in (conn.client, conn.upstream):
                if end is not None:
                    _rst(end)
            for task in conn.tasks:
                task.cancel()
        link.resets += len(link.connections)
        return len(link.connections)

    def blackhole(self, name: str) -> int:
        link = self.links[name]
        for conn in link.connections:
            conn.swallowed = True
            for direction in conn.directions:
                direction.ready.set()  # its writer sees the swallow and stops
        return len(link.connections)

    def stats(self, name: str) -> dict[str, Any]:
        link = self.links[name]
        return {
            "connections": len(link.connections),
            "accepted": link.accepted,
            "resets": link.resets,
            "bytes": list(link.bytes),
        }

    async def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command.pop("op")
        if op == "link":
            return {"port": await self.add(command.pop("name"), **command)}
        if op == "set":
            self.update(command.pop("name"), **command)
            return {}
        if op == "stall":
            self.stall(command["name"], float(command["seconds"]))
            return {}
        if op == "reset":
            return {"connections": self.reset(command["name"])}
        if op == "blackhole":
            return {"connections": self.blackhole(command["name"])}
        if op == "stats":
            return self.stats(command["name"])
        raise ValueError(f"unknown proxy command {op!r}")


async def _serve() -> None:
    proxy = LinkProxy()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        if command.get("op") == "quit":
            break
        try:
            reply = {"ok": True, **await proxy.handle(command)}
        except Exception as exc:  # the harness gets the reason; the proxy goes on
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class ProxyProcess:
    """The harness's side of a proxy process: start it, send it commands, stop it.

    Raises:
        UnavailableError: the process did not start or stopped answering.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "capc_services.lab.proxy"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one command and return its answer."""
        if self._proc.poll() is not None or self._proc.stdin is None or self._proc.stdout is None:
            raise UnavailableError(f"the link proxy exited (code {self._proc.returncode})")
        self._proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise UnavailableError(f"the link proxy exited (code {self._proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        if not reply.pop("ok"):
            raise UnavailableError(f"the link proxy refused {op}: {reply['error']}")
        return reply

    def close(self) -> None:
        """Stop the proxy (its connections close with it)."""
        if self._proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self._proc.stdin is not None
                self._proc.stdin.write('{"op": "quit"}\n')
                self._proc.stdin.flush()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()


if __name__ == "__main__":
    asyncio.run(_serve())
