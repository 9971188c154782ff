"""HTTP clients of a party's admin API (the CLI, the guardian's relay of the student's progress) that never
send a bearer token in cleartext over a network.

``http://`` is accepted only to this machine (``localhost``, 127.0.0.0/8, ``::1``); any other host needs
``https://``, verified against the federation CA (``ca``) and, when ``party`` is given, pinned to that party's
certificate whatever host name reaches it (as gRPC's channels pin their peer: every federation certificate
carries its party name as a DNS SAN). Import it lazily: it brings httpx.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx

from capc_common.errors import InputError
from capc_services.common.settings import check_admin_url


def _verify(ca: Path | None) -> ssl.SSLContext | bool:
    if ca is None:
        return True  # the system's trust store
    if not ca.is_file():
        raise InputError(f"CA certificate {ca} does not exist (the federation's ca.crt)")
    return ssl.create_default_context(cafile=str(ca))


def tls_client(*, ca: Path | None = None, party: str | None = None, timeout: float = 10.0) -> httpx.Client:
    """An ``httpx.Client`` verifying an ``https://`` server against ``ca`` (and ``party``'s name, when given),
    for URLs checked by the caller (:func:`admin_client` checks them).

    Raises:
        InputError: ``ca`` does not exist.
    """
    verify = _verify(ca)
    transport = None if party is None else _PinnedTransport(party, verify=verify)
    return httpx.Client(timeout=timeout, verify=verify, transport=transport)


def admin_client(
    url: str,
    *,
    token: str | None = None,
    ca: Path | None = None,
    party: str | None = None,
    timeout: float = 10.0,
) -> httpx.Client:
    """An ``httpx.Client`` for the admin API at ``url`` (checked by :func:`check_admin_url`).

    Args:
        url: the base URL (``https://guardian.example:8080``).
        token: the bearer token sent with every request, if any.
        ca: the federation CA certificate that signed the party's (default: the system's trust store).
        party: pin the server's certificate to this party name instead of the URL's host name.
        timeout: seconds per request.

    Raises:
        InputError: an unusable URL or CA file.
    """
    client = tls_client(ca=ca, party=party, timeout=timeout)
    client.base_url = httpx.URL(check_admin_url(url))
    if token is not None:
        client.headers["Authorization"] = f"Bearer {token}"
    return client


class _PinnedTransport(httpx.HTTPTransport):
    """An httpx transport that verifies the server's certificate against ``party``'s name (the TLS server
    name indication and hostname check use it), whatever host the URL names."""

    def __init__(self, party: str, *, verify: ssl.SSLContext | bool) -> None:
        super().__init__(verify=verify)
        self._party = party

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.extensions["sni_hostname"] = self._party
        return super().handle_request(request)
