"""The admin API's doors, against the real guardian and student processes and every role's app: a token
before any body is read, a capped body, probes that say only what is safe, no other site's host name, no page
that loads anything from elsewhere.

The done-when of the oversized body: an unauthenticated 20 MB POST is refused with 401 (with the token: 413)
and the party's peak resident memory (``VmHWM`` in ``/proc/PID/status``) grows by less than a few MB.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from doors_harness import Doors
from fastapi.testclient import TestClient

from capc_services.common.party import PartyRuntime
from capc_services.common.settings import SiteSettings

MB = 1 << 20
ROUTES = {"guardian": "/api/v1/membership", "student": "/api/v1/progress"}
GROWTH_LIMIT_KB = 4096


def _hwm_kb(pid: int) -> int:
    """Peak resident memory of a process, in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def _body(size: int, *, chunked: bool) -> Iterator[bytes]:
    piece = b"{" * (64 << 10)
    for start in range(0, size, len(piece)):
        chunk = piece[: min(len(piece), size - start)]
        yield f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk
    if chunked:
        yield b"0\r\n\r\n"


def _post(port: int, path: str, *, size: int, token: str | None, chunked: bool) -> tuple[int, dict, int]:
    """POST ``size`` bytes of junk the way an attacker would: it keeps sending until the party answers.

    Returns:
        The status, the problem body and how many body bytes went out before the answer.
    """
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}")
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sock.settimeout(2)
        for chunk in _body(size, chunked=chunked):
            if select.select([sock], [], [], 0)[0]:
                break  # the party has answered: it reads no more of this request
            try:
                sock.sendall(chunk)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break  # it stopped reading (or closed): what did not go out never reaches it
            sent += len(chunk)
        sock.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head_part, _, rest = data.partition(b"\r\n\r\n")
        length = int(
            next(
                h.split(b":")[1] for h in head_part.split(b"\r\n") if h.lower().startswith(b"content-length")
            )
        )
        while len(rest) < length:
            rest += sock.recv(65536)
    return int(head_part.split()[1]), json.loads(rest[:length]), sent


@pytest.mark.parametrize("role", ["guardian", "student"])
def test_a_20_mb_post_is_refused_before_it_is_read_and_the_memory_stays_flat(doors: Doors, role: str) -> None:
    """Four 20 MB POSTs (with and without a length, with and without the token); run with ``-s`` for the
    figures (docs/results.md, "Admin doors")."""
    port, route, token = doors.endpoints.admin[role], ROUTES[role], doors.token(role)
    before = _hwm_kb(doors.pid(role))
    for chunked in (False, True):
        for secret, expected, says in ((None, 401, "bearer token"), (token, 413, "at most 65536 bytes")):
            status, problem, sent = _post(port, route, size=20 * MB, token=secret, chunked=chunked)
            assert status == expected and says in problem["detail"], problem
            assert sent < 20 * MB, "the party read the whole body before it answered"
            print(f"{role} {'chunked' if chunked else 'sized'} {'token' if secret else 'anonymous'}: "
                  f"{status} after {sent / MB:.1f} MB had left the client")  # fmt: skip
    grown = _hwm_kb(doors.pid(role)) - before
    print(f"{role}: peak resident memory (VmHWM) {before} KiB, +{grown} KiB after the four")
    assert grown < GROWTH_LIMIT_KB, f"{role}'s peak resident memory grew by {grown} KiB"
    assert httpx.get(f"{doors.admin(role)}/livez", timeout=10).status_code == 200


@pytest.mark.parametrize("role", ["guardian", "student", "teacher"])
def test_every_role_refuses_an_unauthenticated_malformed_body_with_401_not_422(
    doors: Doors, tmp_path: Path, role: str
) -> None:
    """The same gate in front of every role's app: no token, no parsing (today's FastAPI answered 422)."""
    party = {"guardian": "guardian", "student": "student", "teacher": "hospital-1"}[role]
    settings = SiteSettings(
        party=party,
        federation=doors.layout.federation,
        tls=doors.files(party).__dict__,
        admin={"bind": "127.0.0.1:0", "token_file": doors.layout.admin_token(role)},
    )
    runtime = PartyRuntime(settings, role=role)
    client = TestClient(runtime.admin_app(readiness=dict, routers=[]), base_url="http://localhost")
    for path in ("/api/v1/membership", "/api/v1/anything"):
        refused = client.post(path, content=b"{not json")
        assert refused.status_code == 401, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
    big = client.post("/api/v1/anything", content=b"x" * (65536 + 1), headers=_bearer(runtime.token))
    assert big.status_code == 413, big.text


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_probes_without_a_token_say_only_what_is_safe(doors: Doors) -> None:
    admin, token = doors.admin("guardian"), doors.token("guardian")
    anonymous = httpx.get(f"{admin}/readyz", timeout=10)
    assert anonymous.status_code == 200
    checks = anonymous.json()["checks"]
    assert set(checks) >= {"certificate", "grpc", "ledger"}
    assert all(check == {"ok": True} for check in checks.values()), checks  # no detail: no paths, no errors
    assert str(doors.layout.root) not in anonymous.text
    detailed = httpx.get(f"{admin}/readyz", headers=_bearer(token), timeout=10).json()
    assert str(doors.layout.root) in json.dumps(detailed)  # the ledger's path, for whoever holds the token
    # /metrics: the ε figures and the ledger head only for the scraper's token (or the admin token)
    assert httpx.get(f"{admin}/metrics", timeout=10).status_code == 401
    scraped = httpx.get(f"{admin}/metrics", headers=_bearer(doors.metrics_token), timeout=10)
    assert scraped.status_code == 200 and "capc_epsilon_limit" in scraped.text
    assert (
        httpx.get(f"{admin}/api/v1/budget", headers=_bearer(doors.metrics_token), timeout=10).status_code
        == 401
    )


@pytest.mark.parametrize("path", ["/readyz", "/dashboard", "/api/v1/budget", "/openapi.json"])
def test_a_page_of_another_site_rebound_to_the_party_gets_nothing(doors: Doors, path: str) -> None:
    admin, token = doors.admin("guardian"), doors.token("guardian")
    rebound = httpx.get(f"{admin}{path}", headers={"Host": "attacker.example", **_bearer(token)}, timeout=10)
    assert rebound.status_code == 421 and "attacker.example" in rebound.json()["detail"]
    for host in ("localhost", "127.0.0.1", "guardian"):
        own = httpx.get(f"{admin}{path}", headers={"Host": f"{host}:8080", **_bearer(token)}, timeout=10)
        assert own.status_code == 200, (host, own.text)


def test_no_page_loads_anything_from_elsewhere(doors: Doors) -> None:
    admin = doors.admin("guardian")
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert httpx.get(f"{admin}{page}", timeout=10).status_code == 404, page
    assert httpx.get(f"{admin}/openapi.json", timeout=10).json()["info"]["title"] == "capc guardian guardian"
