"""The admin REST app every party serves: probes, metrics and (behind a bearer token) its API routes.

Every request first passes :class:`~capc_services.common.admin_gate.AdminGate` (host allowlist, token
before body, body cap). Without a token, ``/readyz`` says only which checks pass, never their details (file
paths, errors, peers); ``/metrics`` needs the metrics or the admin token. No interactive docs page is served
(FastAPI's loads its script from a CDN): the OpenAPI document is at ``/openapi.json``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Annotated, Any, Generic, TypeVar

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from capc_common import __version__
from capc_services.common.admin_gate import MAX_BODY_BYTES, AdminGate, bearer, token_matches

T = TypeVar("T")
_log = logging.getLogger(__name__)
_bearer = HTTPBearer(auto_error=False)
PROBLEM_JSON = "application/problem+json"
_PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "An RFC 9457 problem detail: what went wrong, the values involved, the fix.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
    },
}


def problem_response(description: str) -> dict[str, Any]:
    """An OpenAPI ``responses`` entry for an error answered as problem+JSON."""
    return {"description": description, "content": {PROBLEM_JSON: {"schema": _PROBLEM_SCHEMA}}}


def _problem(status_code: int, detail: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = {"type": "about:blank", "title": HTTPStatus(status_code).phrase, "status": status_code,
            "detail": detail}  # fmt: skip
    return JSONResponse(body, status_code=status_code, headers=dict(headers or {}), media_type=PROBLEM_JSON)


def _http_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return _problem(exc.status_code, str(exc.detail), exc.headers)


def _validation_problem(request: Request, exc: Exception) -> Response:
    """A 422 naming each bad parameter, its bound and the value sent (all of them non-secret)."""
    assert isinstance(exc, RequestValidationError)
    parts = [
        f"{'.'.join(str(p) for p in err['loc'][1:]) or err['loc'][0]}: {err['msg']}"
        + (f" (got {err['input']!r})" if "input" in err else "")
        for err in exc.errors()
    ]
    return _problem(422, "; ".join(parts))


@dataclass
class Readiness:
    """Named checks, each ``(ok, detail)``; the party is ready when all are ok."""

    checks: dict[str, tuple[bool, Any]] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """True when every check passed."""
        return all(ok for ok, _ in self.checks.values())

    def to_dict(self, *, details: bool = True) -> dict[str, Any]:
        """JSON body of ``/readyz``; without ``details`` only whether each check passes (what probes need)."""
        return {
            "ready": self.ready,
            "checks": {
                name: {"ok": ok, "detail": detail} if details else {"ok": ok}
                for name, (ok, detail) in self.checks.items()
            },
        }


class RecentCheck(Generic[T]):
    """A readiness check asked at most once every ``every_s`` seconds, the last answer given in between.

    ``/readyz`` needs no token, so a check behind it that dials a peer (a teacher's guardian reachability)
    would let anyone who can reach the admin port make the party open a connection per request.

    Args:
        check: the check itself.
        every_s: seconds its answer stays current.
    """

    def __init__(self, check: Callable[[], T], *, every_s: float) -> None:
        self._check = check
        self._every = every_s
        self._lock = threading.Lock()
        self._answer: tuple[float, T] | None = None

    def __call__(self) -> T:
        with self._lock:  # concurrent probes wait for one check instead of each making their own
            if self._answer is None or time.monotonic() - self._answer[0] >= self._every:
                self._answer = (time.monotonic(), self._check())
            return self._answer[1]


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """FastAPI dependency: 401 unless the request carries ``Authorization: Bearer <admin token>``."""
    expected: str = request.app.state.admin_token
    if credentials is None or not token_matches(credentials.credentials, expected):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token (see the party's admin.token_file)",
            headers={"WWW-Authenticate": "Bearer"},
        )


TokenDep = Depends(require_token)


def api_router() -> APIRouter:
    """A router for ``/api/v1`` routes, every one of which needs the admin token."""
    return APIRouter(
        prefix="/api/v1",
        dependencies=[TokenDep],
        responses={
            401: problem_response("Missing or wrong bearer token."),
            413: problem_response("The request body is larger than the admin API accepts."),
            422: problem_response("A parameter is out of range or malformed."),
        },
    )


def build_admin_app(
    *,
    title: str,
    token: str,
    readiness: Callable[[], Readiness],
    registry: CollectorRegistry,
    routers: Sequence[APIRouter] = (),
    metrics_token: str | None = None,
    allowed_hosts: Iterable[str] = (),
    max_body: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The FastAPI app of one party (OpenAPI at ``/openapi.json``; no docs page), behind its gate.

    Args:
        title: shown in the OpenAPI document.
        token: the admin bearer token (already validated).
        readiness: computes the ``/readyz`` checks on each call.
        registry: the party's Prometheus registry, served at ``/metrics``.
        routers: the role's API routers (build them with :func:`api_router`).
        metrics_token: a token that may read ``/metrics`` only (a scraper's), or None.
        allowed_hosts: host names the party answers to besides ``localhost`` and IP addresses.
        max_body: the largest request body accepted, in bytes.
    """
    app = FastAPI(title=title, version=__version__, docs_url=None, redoc_url=None)
    app.add_middleware(
        AdminGate, token=token, metrics_token=metrics_token, allowed_hosts=allowed_hosts, max_body=max_body
    )
    app.state.admin_token = token
    app.add_exception_handler(StarletteHTTPException, _http_problem)
    app.add_exception_handler(RequestValidationError, _validation_problem)

    @app.get("/livez", tags=["probes"])
    def livez() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    readiness_body = {"application/json": {"schema": {"type": "object"}}}

    @app.get(
        "/readyz",
        tags=["probes"],
        responses={
            200: {"description": "Every check passed.", "content": readiness_body},
            503: {"description": "A check failed (its detail says which).", "content": readiness_body},
        },
    )
    def readyz(request: Request) -> JSONResponse:
        """Readiness: every check passes (503 otherwise). Each check's detail only with the admin token."""
        try:
            report = readiness()
        except Exception:  # a probe that raised says "not ready" and why, never 500 with a traceback
            _log.exception("a readiness check raised")
            detail = "a readiness check raised; the party's log has the error"
            report = Readiness({"readiness": (False, detail)})
        code = status.HTTP_200_OK if report.ready else status.HTTP_503_SERVICE_UNAVAILABLE
        details = token_matches(bearer(request.headers.get("authorization")), token)
        return JSONResponse(report.to_dict(details=details), status_code=code)

    @app.get(
        "/metrics",
        tags=["probes"],
        response_class=PlainTextResponse,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
            401: problem_response("Missing or wrong metrics or admin token."),
        },
    )
    def metrics() -> Response:
        """Prometheus exposition of this party's metrics (bearer: the metrics token or the admin token)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    for router in routers:
        app.include_router(router)
    return app
