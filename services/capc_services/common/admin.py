"""The admin REST app every party serves: probes, metrics and (behind a bearer token) its API routes."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from capc_common import __version__

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

    def to_dict(self) -> dict[str, Any]:
        """JSON body of ``/readyz``."""
        return {
            "ready": self.ready,
            "checks": {name: {"ok": ok, "detail": detail} for name, (ok, detail) in self.checks.items()},
        }


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """FastAPI dependency: 401 unless the request carries ``Authorization: Bearer <admin token>``."""
    expected: str = request.app.state.admin_token
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
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
) -> FastAPI:
    """The FastAPI app of one party (OpenAPI at ``/openapi.json``, docs at ``/docs``).

    Args:
        title: shown in the OpenAPI document.
        token: the admin bearer token (already validated).
        readiness: computes the ``/readyz`` checks on each call.
        registry: the party's Prometheus registry, served at ``/metrics``.
        routers: the role's API routers (build them with :func:`api_router`).
    """
    app = FastAPI(title=title, version=__version__)
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
    def readyz() -> JSONResponse:
        """Readiness: every check passes (503 otherwise, with the failing checks)."""
        try:
            report = readiness()
        except Exception:  # a probe that raised says "not ready" and why, never 500 with a traceback
            _log.exception("a readiness check raised")
            detail = "a readiness check raised; the party's log has the error"
            report = Readiness({"readiness": (False, detail)})
        code = status.HTTP_200_OK if report.ready else status.HTTP_503_SERVICE_UNAVAILABLE
        return JSONResponse(report.to_dict(), status_code=code)

    @app.get(
        "/metrics",
        tags=["probes"],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    def metrics() -> Response:
        """Prometheus exposition of this party's metrics."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    for router in routers:
        app.include_router(router)
    return app
