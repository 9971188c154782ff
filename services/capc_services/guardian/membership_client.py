"""The client side of a membership change: post the new ``federation.yaml`` to a running guardian's admin API
(``POST /api/v1/membership``), as ``capc guardian membership`` and ``capc local add-party`` do."""

from __future__ import annotations

from typing import Any

import httpx

from capc_common.errors import InputError, ProtocolError, UnavailableError
from capc_common.federation import FederationConfig


def record_membership(url: str, *, token: str, config: FederationConfig) -> dict[str, Any]:
    """Ask the guardian at ``url`` to record the change to ``config`` on its ledger (it stops afterwards).

    Returns:
        The guardian's reply: ``entry``, ``added``, ``retired``, both config hashes, ``head``, ``next``, …

    Raises:
        UnavailableError: nothing answers at ``url``.
        InputError: the token was refused (401), or the change was (409/422, with the guardian's reason).
        ProtocolError: any other answer.
    """
    endpoint = url.rstrip("/") + "/api/v1/membership"
    try:
        response = httpx.post(
            endpoint,
            json=config.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
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
