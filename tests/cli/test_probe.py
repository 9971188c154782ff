"""``capc probe``, the containers' healthcheck, against a real HTTP server on a real socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Readiness(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = (200, b'{"ready": true}') if self.path == "/readyz" else (503, b'{"ready": false}')
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Readiness)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_ready_is_exit_0_and_prints_the_body(server, capc):
    proc = capc("probe", f"{server}/readyz")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '{"ready": true}'


def test_not_ready_is_exit_4_with_the_status(server, capc):
    proc = capc("probe", f"{server}/livez-but-failing")
    assert proc.returncode == 4
    assert "answered 503" in proc.stderr and '{"ready": false}' in proc.stderr


def test_nothing_listening_is_exit_4(capc):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        proc = capc("probe", f"http://127.0.0.1:{port}/readyz", "--timeout", "2")
    assert proc.returncode == 4
    assert f"http://127.0.0.1:{port}/readyz" in proc.stderr and "Traceback" not in proc.stderr
