"""The privacy-budget dashboard the guardian's admin server serves at ``/dashboard``.

Four static files (HTML, JS, CSS, an icon) shipped in the package: no CDN, no external asset, works
offline. The page holds no data and no secret; every figure it shows it fetches from ``/api/v1`` with the
admin bearer token (from the URL fragment ``#token=…``, which browsers never send to the server, or a form),
so the API's authentication is the page's. Charts are plain SVG drawn by ~100 lines of the page's own script:
two charts (ε over time, queries per batch) do not justify vendoring, auditing and updating a chart library.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import Response

_STATIC = resources.files("capc_services.guardian") / "static"
_TYPES = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
# Only this origin's own files and API; no inline script, no framing, no referrer leaving the page.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _file(name: str) -> Response:
    return Response((_STATIC / name).read_bytes(), media_type=_TYPES[name], headers=HEADERS)


def dashboard_router() -> APIRouter:
    """``GET /dashboard`` (the page) and ``GET /dashboard/{dashboard.js,dashboard.css,favicon.svg}``."""
    api = APIRouter(tags=["dashboard"])

    @api.get("/dashboard", include_in_schema=False)
    def page() -> Response:
        """The dashboard page (static; its data comes from the token-protected API)."""
        return _file("dashboard.html")

    @api.get("/dashboard/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        """The page's script, style sheet and icon."""
        if name not in _TYPES or name == "dashboard.html":
            raise HTTPException(status_code=status.HTTP_404_NOT_FOUND, detail=f"no dashboard file {name!r}")
        return _file(name)

    return api
