"""The admin REST skeleton every party serves, and the settings that feed it."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from capc_common.errors import InputError
from capc_services.common.admin import Readiness, api_router, build_admin_app
from capc_services.common.admin_client import admin_client
from capc_services.common.metrics import PartyMetrics
from capc_services.common.party import PartyRuntime
from capc_services.common.settings import SiteSettings, load_admin_token
from capc_services.tls import certificate_info


@pytest.fixture
def app_and_state(pki: Path):
    token = secrets.token_urlsafe(32)
    metrics = PartyMetrics(
        party="guardian",
        role="guardian",
        config_hash="ab" * 32,
        certificate=certificate_info(pki / "guardian.crt"),
    )
    state = {"ready": True}
    router = api_router()

    @router.get("/echo")
    def echo() -> dict[str, str]:
        return {"ok": "yes"}

    app = build_admin_app(
        title="test",
        token=token,
        readiness=lambda: Readiness({"flag": (state["ready"], "detail")}),
        registry=metrics.registry,
        routers=[router],
    )
    return TestClient(app, base_url="http://localhost"), token, state


def test_probes_need_no_token_and_say_details_only_with_it(app_and_state) -> None:
    client, token, state = app_and_state
    assert client.get("/livez").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    state["ready"] = False
    not_ready = client.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["checks"]["flag"] == {"ok": False}
    detailed = client.get("/readyz", headers={"Authorization": f"Bearer {token}"})
    assert detailed.json()["checks"]["flag"] == {"ok": False, "detail": "detail"}
    assert client.get("/metrics").status_code == 401
    body = client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text
    assert "capc_certificate_expires_in_seconds" in body
    assert 'capc_party_info{config_hash="' in body


def test_a_readiness_check_that_raises_is_a_503_not_a_500(pki: Path, caplog) -> None:
    """A probe never answers 500 with a traceback: the check that raised makes the party not ready, and the
    error goes to the party's log (the body is public: it names no internals)."""

    def raising() -> Readiness:
        raise RuntimeError("peer hash mismatch, internal detail")

    metrics = PartyMetrics(
        party="guardian",
        role="guardian",
        config_hash="ab" * 32,
        certificate=certificate_info(pki / "guardian.crt"),
    )
    app = build_admin_app(title="t", token="x" * 32, readiness=raising, registry=metrics.registry)
    with caplog.at_level(logging.ERROR):
        client = TestClient(app, raise_server_exceptions=False, base_url="http://localhost")
        answer = client.get("/readyz", headers={"Authorization": "Bearer " + "x" * 32})  # details: token
    assert answer.status_code == 503
    assert answer.json() == {
        "ready": False,
        "checks": {
            "readiness": {"ok": False, "detail": "a readiness check raised; the party's log has the error"}
        },
    }
    assert "internal detail" not in answer.text and "internal detail" in caplog.text


def test_api_needs_the_bearer_token(app_and_state) -> None:
    client, token, _ = app_and_state
    assert client.get("/api/v1/echo").status_code == 401
    assert client.get("/api/v1/echo", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/v1/echo", headers={"Authorization": f"Bearer {token}"}).json() == {"ok": "yes"}
    assert "/api/v1/echo" in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    ("content", "mode", "match"),
    [
        ("changethis", 0o600, "default or shorter"),
        ("short", 0o600, "default or shorter"),
        (secrets.token_urlsafe(32), 0o644, "readable by others"),
    ],
    ids=["default", "short", "world-readable"],
)
def test_bad_admin_tokens_are_refused(tmp_path: Path, content: str, mode: int, match: str) -> None:
    path = tmp_path / "t"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(InputError, match=match):
        load_admin_token(path)
    with pytest.raises(InputError, match="does not exist"):
        load_admin_token(tmp_path / "missing")


def test_site_file_paths_resolve_relative_to_it_and_env_overrides(
    tmp_path: Path, monkeypatch, federation
) -> None:
    _, fed_path = federation
    site = tmp_path / "sites" / "g.yaml"
    site.parent.mkdir()
    site.write_text(
        yaml.safe_dump(
            {
                "party": "guardian",
                "federation": "../federation.yaml",
                "tls": {"ca": "c/ca.crt", "cert": "c/g.crt", "key": "c/g.key"},
                "admin": {"bind": "127.0.0.1:1", "token_file": "tok"},
            }
        )
    )
    monkeypatch.setenv("CAPC_ADMIN__BIND", "0.0.0.0:9000")
    monkeypatch.setenv("CAPC_ADMIN__ALLOW_REMOTE", "true")
    monkeypatch.setenv("CAPC_ADMIN__TLS", "true")
    settings = SiteSettings.load(site)
    assert settings.tls.ca == (site.parent / "c" / "ca.crt").resolve()
    assert settings.admin.bind == "0.0.0.0:9000"
    assert settings.federation_config.role_of("guardian") == "guardian"
    assert settings.federation == fed_path.resolve()


def test_invalid_site_file_names_the_field(tmp_path: Path) -> None:
    site = tmp_path / "s.yaml"
    site.write_text(yaml.safe_dump({"party": "x", "federation": "f", "admin": {"bind": "nope"}}))
    with pytest.raises(InputError) as info:
        SiteSettings.load(site)
    assert "tls" in str(info.value)
    assert "admin.bind" in str(info.value) or "host:port" in str(info.value)


@pytest.mark.parametrize(
    ("bind", "remote"),
    [("127.0.0.1:8080", False), ("127.8.9.1:1", False), ("[::1]:8080", False), ("localhost:80", False),
     ("0.0.0.0:8080", True), ("[::]:8080", True), ("10.1.2.3:8080", True), ("guardian:8080", True)],
)  # fmt: skip
def test_a_non_loopback_admin_bind_needs_an_explicit_opt_in_and_tls(
    tmp_path: Path, federation, monkeypatch: pytest.MonkeyPatch, bind: str, remote: bool
) -> None:
    _, fed_path = federation
    site = tmp_path / "g.yaml"
    site.write_text(
        yaml.safe_dump(
            {
                "party": "guardian",
                "federation": str(fed_path),
                "tls": {"ca": "ca.crt", "cert": "g.crt", "key": "g.key"},
                "admin": {"bind": bind, "token_file": "tok"},
            }
        )
    )
    if remote:
        with pytest.raises(InputError, match=r"not a loopback address.*allow_remote: true"):
            SiteSettings.load(site)
        monkeypatch.setenv("CAPC_ADMIN__ALLOW_REMOTE", "true")
        with pytest.raises(InputError, match=r"token would cross the network in cleartext.*admin.tls: true"):
            SiteSettings.load(site)
        monkeypatch.setenv("CAPC_ADMIN__TLS", "true")
    assert SiteSettings.load(site).admin.bind == bind


def test_an_allowed_remote_admin_bind_is_announced_at_start_and_speaks_tls(
    pki: Path, token_file: Path, funded_federation: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = SiteSettings(
        party="guardian",
        federation=funded_federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "guardian.crt", "key": pki / "guardian.key"},
        admin={"bind": "0.0.0.0:0", "token_file": token_file, "allow_remote": True, "tls": True},
    )
    party = PartyRuntime(settings, role="guardian")
    with caplog.at_level(logging.WARNING):
        port = party.start_admin(readiness=dict, routers=[])
    try:
        assert any("non-loopback" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        # HTTPS with the party's certificate, verified against the federation CA and pinned to its name
        with admin_client(f"https://127.0.0.1:{port}", ca=pki / "ca.crt", party="guardian") as client:
            assert client.get("/livez").json() == {"status": "ok"}
        pinned_wrong = admin_client(f"https://127.0.0.1:{port}", ca=pki / "ca.crt", party="student")
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"), pinned_wrong as client:
            client.get("/livez")
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"http://127.0.0.1:{port}/livez")  # no cleartext on the TLS port
    finally:
        party.stop_admin()
