"""What every party process sets up the same way: identity, TLS files, metrics, admin REST."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI

from capc_common.errors import InputError
from capc_common.federation import check_runnable
from capc_services.common import faults
from capc_services.common.admin import Readiness, build_admin_app
from capc_services.common.admission import StreamLimits
from capc_services.common.interceptors import AuthInterceptor, superseded_by_history
from capc_services.common.metrics import PartyMetrics
from capc_services.common.runtime import AdminServer
from capc_services.common.settings import SiteSettings, is_loopback
from capc_services.tls import ServerIdentity, certificate_info, refusal

if TYPE_CHECKING:
    from capc_common.models import Backbone

_log = logging.getLogger(__name__)


def apply_threads(threads: int | None, *, backbone: bool = True) -> None:
    """Cap the CPU threads of torch and of numpy's BLAS (several parties on one machine must not
    oversubscribe its cores: their idle threads spin, measured at 7× the CPU time of one thread for the
    features of 2,048 images with two threads each beside two busy processes on two cores). ``backbone``:
    False in a process that never runs the backbone (numpy's threads alone; torch is not imported)."""
    if threads is not None:
        from threadpoolctl import threadpool_limits

        if backbone:
            import torch

            torch.set_num_threads(threads)
        threadpool_limits(limits=threads, user_api="blas")


class PartyRuntime:
    """One party's identity and shared plumbing, checked at start-up.

    Args:
        settings: the party's site settings.
        role: ``guardian``, ``student`` or ``teacher``.
        model: load the shared backbone now (a teacher votes with it); otherwise only its file is checked,
            without torch (:func:`check_runnable`), and the party loads it when it needs it, once.
        public_cache: a release protocol reads and writes the site's shared cache of public features
            (``feature_cache``); False for a party whose featurising process does that for it (the cache's
            code imports torch).

    Raises:
        InputError: the certificate's CN is not the site's party, the admin token is unusable, or the
            federation config cannot be read or could never run (:func:`check_runnable`).
        IntegrityError: the backbone is not the one federation.yaml pins.
    """

    def __init__(
        self, settings: SiteSettings, *, role: str, model: bool = False, public_cache: bool = True
    ) -> None:
        self.settings = settings
        self.role = role
        self.config = settings.federation_config
        self.config_hash = self.config.config_hash()
        #: The shared backbone (and a release mechanism's protocol), verified with everything else
        #: federation.yaml pins (refused otherwise).
        self.runnable = check_runnable(
            self.config, model=model, cache=getattr(settings, "feature_cache", None) if public_cache else None
        )
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
        self.metrics_token = settings.metrics_token()
        faults.arm_from_environment()
        if self.config.insecure_noise:
            self._check_insecure_noise()
        self.metrics = PartyMetrics(
            party=settings.party,
            role=role,
            config_hash=self.config_hash,
            certificate=self.certificate,
            insecure_noise=self.config.insecure_noise,
        )
        self._admin: AdminServer | None = None
        self.admin_port = 0

    @property
    def backbone(self) -> Backbone:
        """The shared backbone (loaded at start-up with ``model=True``, or by a release mechanism)."""
        return self.runnable.backbone

    def _check_insecure_noise(self) -> None:
        """A federation with seeded noise runs on one machine: refuse any non-loopback listener, then say
        loudly that nothing it releases is private (never the seed: it would strip the noise)."""
        remote = {k: v for k, v in self.settings.listen_addresses().items() if not is_loopback(v)}
        if remote:
            where = ", ".join(f"{k} {v}" for k, v in remote.items())
            raise InputError(
                "federation.yaml seeds the noise (mechanism.insecure_noise_seed: reproducible, NOT "
                f"private), so every party listens on loopback only, but {where} is not: bind 127.0.0.1, or "
                "remove the seed for a real federation"
            )
        _log.warning(
            "INSECURE: federation.yaml seeds the noise (mechanism.insecure_noise_seed); labels are "
            "reproducible and NOT private. Use only to compare with the central reference."
        )

    def noise_check(self) -> tuple[bool, str]:
        """Readiness detail: whether this federation's noise is private."""
        if self.config.insecure_noise:
            return True, "INSECURE: seeded noise (mechanism.insecure_noise_seed), labels are NOT private"
        return True, "private: each party's noise from its CSPRNG"

    def certificate_check(self) -> tuple[bool, dict[str, Any]]:
        """Readiness check: the certificate has not expired (and when it will)."""
        left = self.certificate.seconds_left()
        return left > 0, {"expires_at": self.certificate.not_after.isoformat(), "expires_in_s": round(left)}

    def interceptor(
        self,
        policy: Mapping[str, frozenset[str]],
        *,
        limits: StreamLimits,
        superseded: Mapping[str, str] | None = None,
    ) -> AuthInterceptor:
        """The identity/config-hash/admission interceptor for this party's gRPC server.

        Args:
            policy: which roles may call which method.
            limits: the server's admission limits (its site's ``grpc`` section).
            superseded: earlier config hashes and why they are no longer in force (default: the membership
                changes ``federation.yaml``'s ``history`` lists).
        """
        if superseded is None:
            superseded = superseded_by_history(self.config)
        return AuthInterceptor(
            config=self.config,
            policy=policy,
            identity=ServerIdentity.load(self.tls),
            limits=limits,
            on_reject=self.metrics.reject,
            superseded=superseded,
        )

    def admin_app(
        self, *, readiness: Callable[[], dict[str, tuple[bool, Any]]], routers: Sequence[APIRouter]
    ) -> FastAPI:
        """The admin REST app (probes, metrics, the role's API) this party serves."""

        def ready() -> Readiness:
            checks = {"certificate": self.certificate_check(), "noise": self.noise_check()}
            return Readiness({**checks, **readiness()})

        admin = self.settings.admin
        return build_admin_app(
            title=f"capc {self.role} {self.settings.party}",
            token=self.token,
            readiness=ready,
            registry=self.metrics.registry,
            routers=routers,
            metrics_token=self.metrics_token,
            allowed_hosts=(self.settings.party, *admin.allowed_hosts),
            max_body=admin.max_body_bytes,
        )

    def start_admin(
        self, *, readiness: Callable[[], dict[str, tuple[bool, Any]]], routers: Sequence[APIRouter]
    ) -> int:
        """Serve :meth:`admin_app` on the site's admin address; returns its port."""
        app = self.admin_app(readiness=readiness, routers=routers)
        admin = self.settings.admin
        if not is_loopback(admin.bind):  # allowed by admin.allow_remote with admin.tls (refused otherwise)
            _log.warning(
                "the admin API listens on a non-loopback address (admin.allow_remote), over HTTPS with this "
                "party's federation certificate",
                extra={"bind": admin.bind},
            )
        self._admin = AdminServer(app, bind=admin.bind, tls=self.tls if admin.tls else None)
        self.admin_port = self._admin.start()
        # Everything loaded by now (modules, the model, the config) lives as long as the process: out of the
        # cyclic collector's way (CPython's gc.freeze), a collection no longer walks it, neither while the
        # party runs nor at exit, where it took a teacher 1.5 s of its 1.8 s from SIGTERM to gone (measured).
        # Not collected first: a full collection then found 40 unreachable objects in a teacher and took
        # 0.13 s, which a party's readiness would wait for; those few stay frozen with the rest.
        gc.freeze()
        return self.admin_port

    def stop_admin(self) -> None:
        """Stop the admin server."""
        if self._admin is not None:
            self._admin.stop()
        gc.unfreeze()  # a process that goes on (a test's) gets its objects collected again
