"""What every party process sets up the same way: identity, TLS files, metrics, admin REST."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import APIRouter

from capc_common.errors import InputError
from capc_services.common import faults
from capc_services.common.admin import Readiness, build_admin_app
from capc_services.common.interceptors import AuthInterceptor
from capc_services.common.metrics import PartyMetrics
from capc_services.common.runtime import AdminServer
from capc_services.common.settings import SiteSettings
from capc_services.tls import certificate_info, refusal

_log = logging.getLogger(__name__)


def apply_torch_threads(threads: int | None) -> None:
    """Cap torch's CPU threads (several parties on one machine must not oversubscribe its cores)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


class PartyRuntime:
    """One party's identity and shared plumbing, checked at start-up.

    Args:
        settings: the party's site settings.
        role: ``guardian``, ``student`` or ``teacher``.

    Raises:
        InputError: the certificate's CN is not the site's party, the admin token is unusable, or the
            federation config cannot be read.
    """

    def __init__(self, settings: SiteSettings, *, role: str) -> None:
        self.settings = settings
        self.role = role
        self.config = settings.federation_config
        self.config_hash = self.config.config_hash()
        self.tls = settings.tls.files()
        self.certificate = certificate_info(settings.tls.cert)
        if self.certificate.common_name != settings.party:
            raise InputError(
                f"certificate {settings.tls.cert} is for {self.certificate.common_name!r}, but this site is "
                f"party {settings.party!r}; issue one with `capc cert issue {settings.party}`"
            )
        refused = refusal(
            self.config,
            common_name=self.certificate.common_name,
            serial=self.certificate.serial,
            dns_names=self.certificate.dns_names,
        )
        if refused is not None:
            raise InputError(f"{settings.tls.cert}: {refused}")
        self.token = settings.admin_token()
        faults.arm_from_environment()
        self.metrics = PartyMetrics(
            party=settings.party, role=role, config_hash=self.config_hash, certificate=self.certificate
        )
        self._admin: AdminServer | None = None
        self.admin_port = 0

    def certificate_check(self) -> tuple[bool, dict[str, Any]]:
        """Readiness check: the certificate has not expired (and when it will)."""
        left = self.certificate.seconds_left()
        return left > 0, {"expires_at": self.certificate.not_after.isoformat(), "expires_in_s": round(left)}

    def interceptor(self, policy: Mapping[str, frozenset[str]]) -> AuthInterceptor:
        """The identity/config-hash interceptor for this party's gRPC server."""
        return AuthInterceptor(config=self.config, policy=policy, on_reject=self.metrics.reject)

    def start_admin(
        self, *, readiness: Callable[[], dict[str, tuple[bool, Any]]], routers: Sequence[APIRouter]
    ) -> int:
        """Serve the admin REST app (probes, metrics, the role's API); returns its port."""

        def ready() -> Readiness:
            return Readiness({"certificate": self.certificate_check(), **readiness()})

        app = build_admin_app(
            title=f"capc {self.role} {self.settings.party}",
            token=self.token,
            readiness=ready,
            registry=self.metrics.registry,
            routers=routers,
        )
        self._admin = AdminServer(app, bind=self.settings.admin.bind)
        self.admin_port = self._admin.start()
        return self.admin_port

    def stop_admin(self) -> None:
        """Stop the admin server."""
        if self._admin is not None:
            self._admin.stop()
