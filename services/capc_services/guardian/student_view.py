"""The student's progress and model card as the guardian's dashboard shows them: relayed from the
student's own admin API (its REST API stays the only source), never an error when the student is away.

The relay sends the student's admin token with every refresh, so it goes over loopback or over HTTPS verified
against the federation CA and pinned to the student's certificate (:mod:`~capc_services.common.admin_client`),
never in cleartext across a network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capc_common.errors import InputError
from capc_services.common.settings import load_admin_token
from capc_services.guardian.settings import StudentAdminSettings


class StudentView:
    """Reads ``/api/v1/progress`` and ``/api/v1/model-card`` of the student's admin API.

    Args:
        settings: the student's admin URL and token file (None: not configured).
        ca: the federation CA certificate an ``https://`` student presents a certificate of.
        party: the student's party name, pinned on its certificate (None: the URL's host name).
        timeout: seconds per request (short: the dashboard refreshes every few seconds).
    """

    def __init__(
        self,
        settings: StudentAdminSettings | None,
        *,
        ca: Path | None = None,
        party: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        self._settings = settings
        self._ca = ca
        self._party = party
        self._timeout = timeout

    def read(self) -> dict[str, Any]:
        """``{"reachable": True, "progress", "model_card"}`` or ``{"reachable": False, "error"}``."""
        if self._settings is None:
            return {
                "reachable": False,
                "error": "the guardian's site file has no student_admin: {url, token_file}",
            }
        url = self._settings.url.rstrip("/")
        try:
            token = load_admin_token(self._settings.token_file)
        except InputError as exc:
            return {"reachable": False, "url": url, "error": f"student admin token: {exc}"}
        import httpx  # (and the rich console it brings) only once the dashboard asks

        from capc_services.common.admin_client import admin_client

        try:
            with admin_client(
                url, token=token, ca=self._ca, party=self._party, timeout=self._timeout
            ) as client:
                progress = client.get("/api/v1/progress")
                progress.raise_for_status()
                body = progress.json()
                card = None
                if body.get("published"):
                    reply = client.get("/api/v1/model-card")
                    reply.raise_for_status()
                    card = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            return {"reachable": False, "url": url, "error": f"{type(exc).__name__}: {exc}"}
        return {"reachable": True, "url": url, "progress": body, "model_card": card}
