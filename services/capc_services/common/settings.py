"""Site settings: one YAML file per party (its addresses, paths and local policy), overridable from the
environment (``CAPC_ADMIN__BIND=0.0.0.0:8080``), next to the shared ``federation.yaml``.

Relative paths in a site file are relative to that file, so a state directory can be moved or mounted
into a container as a whole.
"""

from __future__ import annotations

import ipaddress
import stat
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_services.common.admin_gate import MAX_BODY_BYTES
from capc_services.tls import TlsFiles

_DEFAULT_SECRETS = frozenset({"changethis", "changeme", "secret", "password", "token", "admin"})
MIN_TOKEN_CHARS = 32


def parse_bind(value: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 hosts in brackets) into its parts.

    Raises:
        InputError: not ``host:port`` with a port in [0, 65535].
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"address {value!r} must be host:port, e.g. 127.0.0.1:50051")
    return host.strip("[]"), int(port)


def load_admin_token(path: Path) -> str:
    """Read the admin bearer token, refusing missing, shared-readable, short or well-known tokens.

    Raises:
        InputError: says which rule the token breaks and how to make a good one.
    """
    fix = f"write a fresh one with `python -c 'import secrets; print(secrets.token_urlsafe(32))' > {path}`"
    if not path.is_file():
        raise InputError(f"admin token file {path} does not exist; {fix} and chmod 600 it")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise InputError(f"admin token file {path} is readable by others (mode {mode:o}); chmod 600 {path}")
    token = path.read_text().strip()
    if token.lower() in _DEFAULT_SECRETS or len(token) < MIN_TOKEN_CHARS:
        raise InputError(
            f"admin token in {path} is a default or shorter than {MIN_TOKEN_CHARS} characters "
            f"({len(token)}); {fix}"
        )
    return token


class TlsSettings(BaseModel):
    """Paths of the federation CA certificate and this party's certificate and key."""

    model_config = ConfigDict(extra="forbid")
    ca: Path
    cert: Path
    key: Path

    def files(self) -> TlsFiles:
        """The TLS files as the credentials helper takes them."""
        return TlsFiles(ca=self.ca, cert=self.cert, key=self.key)


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost`` or a loopback address (127.0.0.0/8, ::1); any other
    name may resolve to any interface."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback(bind: str) -> bool:
    """Whether ``host:port`` listens on this machine only (see :func:`is_loopback_host`)."""
    host, _ = parse_bind(bind)
    return is_loopback_host(host)


def check_admin_url(url: str) -> str:
    """``url`` without a trailing slash, if an admin token may be sent to it: ``https://`` anywhere, ``http://``
    only to this machine.

    Raises:
        InputError: not ``http(s)://HOST…``, or ``http://`` to another machine.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"admin URL {url!r} must be http(s)://HOST:PORT")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise InputError(
            f"refusing to send an admin token to {parts.hostname} over plain HTTP ({url}): use https:// "
            "(the party serves it with admin.tls: true) with the federation CA, or reach the party over "
            "loopback (ssh -L, kubectl port-forward)"
        )
    return url.rstrip("/")


class AdminSettings(BaseModel):
    """The admin REST endpoint: where it listens, whether it speaks TLS, and its bearer tokens.

    Attributes:
        bind: ``host:port``; loopback unless ``allow_remote`` and ``tls``.
        token_file: the bearer token (mode 0600); one per role, never shared with another role's party.
        tls: serve HTTPS with the party's federation certificate and key (``tls.cert``/``tls.key``); clients
            verify it against the federation CA. Required on a non-loopback ``bind``: the bearer token never
            crosses a network in cleartext.
        allow_remote: accept a non-loopback ``bind`` (with ``tls``). The party logs a warning at start.
        allowed_hosts: host names this party's admin API answers to besides ``localhost``, its party name and
            IP addresses (a Service's name, a published DNS name); any other ``Host`` is refused (DNS
            rebinding).
        metrics_token_file: a second token (mode 0600) that reads ``/metrics`` and nothing else, for a
            Prometheus scraper (``authorization: {credentials_file: …}``); the admin token reads it too.
        max_body_bytes: the largest request body accepted (413 beyond it, before it is parsed).
    """

    model_config = ConfigDict(extra="forbid")
    bind: str = "127.0.0.1:8080"
    token_file: Path
    tls: bool = False
    allow_remote: bool = False
    allowed_hosts: tuple[str, ...] = ()
    metrics_token_file: Path | None = None
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=1024, le=16 << 20)

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        parse_bind(value)
        return value

    @model_validator(mode="after")
    def _remote_needs_opt_in_and_tls(self) -> Self:
        if is_loopback(self.bind):
            return self
        if not self.allow_remote:
            raise ValueError(
                f"admin.bind {self.bind} is not a loopback address: bind it to 127.0.0.1, or set "
                "admin.allow_remote: true (CAPC_ADMIN__ALLOW_REMOTE=true) and admin.tls: true to serve the "
                "admin API beyond this machine over HTTPS"
            )
        if not self.tls:
            raise ValueError(
                f"admin.bind {self.bind} is not a loopback address, but the admin API would speak plain HTTP "
                "and its bearer token would cross the network in cleartext: set admin.tls: true "
                "(CAPC_ADMIN__TLS=true; HTTPS with the party's federation certificate), or bind 127.0.0.1"
            )
        return self

    @property
    def scheme(self) -> str:
        """``https`` with ``tls``, else ``http``."""
        return "https" if self.tls else "http"


def _resolve(value: Any, base: Path) -> Any:
    if isinstance(value, Path):
        return value if value.is_absolute() else (base / value).resolve()
    if isinstance(value, BaseModel):
        updates = {name: _resolve(getattr(value, name), base) for name in type(value).model_fields}
        return value.model_copy(update=updates)
    return value


class SiteSettings(BaseSettings):
    """Settings every party has; each service extends this with its own (one class per service)."""

    model_config = SettingsConfigDict(env_prefix="CAPC_", env_nested_delimiter="__", extra="forbid")

    party: str
    federation: Path
    tls: TlsSettings
    admin: AdminSettings
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the site file (containers set a few values without editing it).
        return env_settings, init_settings

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read a site file, apply environment overrides, resolve relative paths and check the party.

        Raises:
            InputError: the file is missing or invalid, or its party is not the role this class serves.
        """
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise InputError(f"site file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise InputError(f"site file {path} is not valid YAML: {exc}") from None
        try:
            settings = cls(**data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise InputError(f"site file {path} is invalid: {problems}") from None
        resolved: Self = _resolve(settings, path.resolve().parent)
        resolved.check_role()
        return resolved

    def check_role(self) -> None:
        """Hook for subclasses: refuse a site file whose party plays another role."""

    def listen_addresses(self) -> dict[str, str]:
        """Every address this party listens on, by setting name (subclasses add their gRPC bind)."""
        return {"admin.bind": self.admin.bind}

    @cached_property
    def federation_config(self) -> FederationConfig:
        """The shared federation.yaml this site points at."""
        return FederationConfig.load(self.federation)

    def admin_token(self) -> str:
        """The validated admin bearer token (see :func:`load_admin_token`)."""
        return load_admin_token(self.admin.token_file)

    def metrics_token(self) -> str | None:
        """The validated metrics token, or None when the site sets none."""
        path = self.admin.metrics_token_file
        return None if path is None else load_admin_token(path)

    def _require_role(self, role: str) -> None:
        found = self.federation_config.role_of(self.party)
        if found != role:
            raise InputError(
                f"site party {self.party!r} is a {found or 'stranger'} in federation "
                f"{self.federation_config.name!r}, but this command runs a {role}"
            )
