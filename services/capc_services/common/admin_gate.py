"""The admin API's front door: what every HTTP request must pass before any route, and FastAPI's body parsing,
sees it.

FastAPI reads and parses a request's body before it runs a route's dependencies, the bearer-token check
included: without this gate an anonymous client could make a party buffer and parse any body it sends (a
gigabyte of JSON to ``POST /api/v1/membership`` runs the guardian out of memory, and a guardian that dies
mid-batch leaves that batch charged at its worst case). So this ASGI middleware, in order:

1. refuses a ``Host`` the party does not answer to (421): a page on another site whose name was re-pointed at
   this party's address (DNS rebinding) sends its own name as the host and gets nothing;
2. refuses a request to a token-protected path without the right bearer token (401) before it reads a byte of
   the body: ``/api/…`` needs the admin token, ``/metrics`` the metrics token (or the admin token);
3. refuses a body longer than the cap (413): at once when ``Content-Length`` says so, otherwise after reading
   at most the cap, so no request makes the party hold more than the cap of body.

Only then does the route see the request, with its body replayed from the (capped) buffer. Answers are
RFC 9457 problem JSON like every other error of the admin API.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from http import HTTPStatus
from typing import Any

PROBLEM_JSON = "application/problem+json"
MAX_BODY_BYTES = 64 << 10
"""The largest request body any admin route accepts (the biggest legitimate one, a membership change's
federation config, is a few KiB)."""
API_PREFIX = "/api/"
METRICS_PATH = "/metrics"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def token_matches(presented: str | None, *expected: str | None) -> bool:
    """Whether ``presented`` equals one of the ``expected`` tokens (constant time, each compared)."""
    if presented is None:
        return False
    found = False
    for token in expected:
        if token is not None and secrets.compare_digest(presented.encode(), token.encode()):
            found = True
    return found


def host_of(value: str) -> str:
    """The host of a ``Host`` header value, without its port or IPv6 brackets, in lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    host, sep, port = value.rpartition(":")
    return host if sep and port.isdigit() else value


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AdminGate:
    """Pure ASGI middleware in front of a party's admin app (see the module docstring for what it refuses).

    Args:
        app: the admin app.
        token: the party's admin bearer token.
        metrics_token: a token that may read ``/metrics`` only (a Prometheus scraper's), or None.
        allowed_hosts: host names (besides ``localhost`` and IP addresses, which a rebinding page cannot
            send as its own name) this party answers to, e.g. its Service's name.
        max_body: the body cap in bytes.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        metrics_token: str | None = None,
        allowed_hosts: Iterable[str] = (),
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        self._app = app
        self._token = token
        self._metrics_token = metrics_token
        self._hosts = frozenset({"localhost", *(h.lower().rstrip(".") for h in allowed_hosts)})
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        refusal = self._refusal(scope["path"], headers)
        if refusal is not None:
            await _problem(send, *refusal)
            return
        length = headers.get("content-length")
        if length is not None and not length.strip().isdigit():
            await _problem(send, 400, f"malformed Content-Length {length[:40]!r}")
            return
        if length is not None and int(length) > self._max_body:
            await _problem(send, 413, self._too_large(length))
            return
        if length is None and "transfer-encoding" not in headers:
            await self._app(scope, receive, send)  # no body (a GET): nothing to read or cap
            return
        body = await self._read_capped(receive)
        if body is None:
            await _problem(send, 413, self._too_large(None))
            return
        await self._app(scope, _replay(body, receive), send)

    def _refusal(self, path: str, headers: dict[str, str]) -> tuple[int, str, dict[str, str]] | None:
        """Why the request is refused before its body is read (status, detail, headers), or None."""
        host = headers.get("host")
        if host is not None:
            name = host_of(host).rstrip(".")
            if name not in self._hosts and not _is_ip(name):
                return (
                    421,
                    f"this party does not answer to the host name {name!r} (allowed: IP addresses, "
                    f"{sorted(self._hosts)}); add it to admin.allowed_hosts if it is this party's own name",
                    {},
                )
        presented = bearer(headers.get("authorization"))
        challenge = {"WWW-Authenticate": "Bearer"}
        if path.startswith(API_PREFIX) and not token_matches(presented, self._token):
            return 401, "missing or wrong bearer token (see the party's admin.token_file)", challenge
        if path == METRICS_PATH and not token_matches(presented, self._metrics_token, self._token):
            return (
                401,
                "missing or wrong bearer token: /metrics needs the metrics token (admin.metrics_token_file) "
                "or the admin token",
                challenge,
            )
        return None

    def _too_large(self, length: str | None) -> str:
        sent = f"{length.strip()} bytes" if length is not None else "more"
        return f"request body too large: {sent}, the admin API accepts at most {self._max_body} bytes"

    async def _read_capped(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the cap (nothing more is read)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the buffered body once, then whatever the connection says next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _problem(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """Answer with an RFC 9457 problem and close the connection (an unread body is never drained)."""
    body = json.dumps(
        {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "detail": detail}
    ).encode()
    raw = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
