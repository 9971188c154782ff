"""The client side of a membership change: post the new ``federation.yaml`` to a running guardian's admin API
(``POST /api/v1/membership``), as ``capc guardian membership`` and ``capc local add-party`` do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from capc_common.errors import InputError, ProtocolError, UnavailableError
from capc_common.federation import FederationConfig
from capc_services.common.admin_client import admin_client


def record_membership(
    url: str, *, token: str, config: FederationConfig, ca: Path | None = None, party: str | None = None
) -> dict[str, Any]:
    """Ask the guardian at ``url`` to record the change to ``config`` on its ledger (it stops afterwards).

    Args:
        url: the guardian's admin API: ``https://`` (verified against ``ca``), ``http://`` on this machine.
        token: the guardian's admin token (it authorises the change and keys the entry's HMAC).
        config: the new federation config.
        ca: the federation CA of an ``https://`` guardian.
        party: the guardian's party name, to check its certificate under (default: the URL's host name).

    Returns:
        The guardian's reply: ``entry``, ``added``, ``retired``, both config hashes, ``head``, ``next``, …

    Raises:
        UnavailableError: nothing answers at ``url``.
        InputError: ``url`` would carry the token in cleartext over a network; the token was refused (401),
            or the change was (409/422, with the guardian's reason).
        ProtocolError: any other answer.
    """
    endpoint = url.rstrip("/") + "/api/v1/membership"
    try:
        with admin_client(url, token=token, ca=ca, party=party, timeout=60) as client:
            response = client.post("/api/v1/membership", json=config.model_dump(mode="json"))
    except httpx.HTTPError as exc:
        raise UnavailableError(f"the guardian's admin API at {url} does not answer ({exc})") from None
    try:
        detail = str(response.json().get("detail", response.text))
    except (ValueError, AttributeError):  # not the guardian's problem JSON (a proxy's page, an empty body)
        detail = response.text
    if response.status_code == 401:
        raise InputError(f"the guardian at {url} refused the admin token; check --token-file ({detail})")
    if response.status_code in (409, 422):
        raise InputError(f"the guardian refused the change: {detail}")
    if response.status_code != 200:
        raise ProtocolError(f"{endpoint} answered HTTP {response.status_code}: {response.text}")
    reply: dict[str, Any] = response.json()
    return reply
