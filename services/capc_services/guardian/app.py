"""``capc guardian serve``: the guardian process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from capc_common.aggregation import party_noise
from capc_common.errors import IntegrityError
from capc_common.federation import ReleaseMember
from capc_common.memory import keep_freed_memory
from capc_common.privacy import BudgetLedger, NoiseSource
from capc_common.wire import rpc
from capc_services.common.limits import MessageLimits
from capc_services.common.party import PartyRuntime
from capc_services.common.runtime import start_grpc_server
from capc_services.guardian.api import router
from capc_services.guardian.core import Guardian
from capc_services.guardian.dashboard import dashboard_router
from capc_services.guardian.membership import membership_router, superseded_hashes
from capc_services.guardian.release_servicer import RELEASE_POLICY, ReleaseGuardianServicer
from capc_services.guardian.releases import ReleaseGuardian
from capc_services.guardian.servicer import POLICY, GuardianServicer, add_to_server
from capc_services.guardian.settings import GuardianSettings
from capc_services.guardian.student_view import StudentView

_log = logging.getLogger(__name__)


def open_ledger(settings: GuardianSettings) -> BudgetLedger:
    """Open (or create) the guardian's ledger for the federation's budget, refusing one that fails
    verification (an edited row or total, a broken chain, a damaged file): charging on it could spend
    budget the true ledger does not have.

    Raises:
        IntegrityError: the ledger belongs to another federation or failed verification.
    """
    config = settings.federation_config
    settings.ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger = BudgetLedger.open_or_create(
        settings.ledger,
        epsilon_limit=config.budget.epsilon,
        delta=config.budget.delta,
        order=config.budget.order,
        config=config.parameters(),
    )
    report = ledger.verify()
    if not report.ok:
        ledger.close()
        raise IntegrityError(
            f"the ledger {settings.ledger} failed verification ({'; '.join(report.problems[:3])}); the "
            f"guardian will not charge on it. Run `capc budget verify --ledger {settings.ledger}` and "
            "restore the file from a backup"
        )
    _log.info("ledger verified", extra={"entries": report.entries, "head": report.head})
    return ledger


def _core(
    party: PartyRuntime, ledger: BudgetLedger, noise: NoiseSource, *, force: str | None = None
) -> tuple[Guardian | ReleaseGuardian, Any, Mapping[str, frozenset[str]]]:
    """The guardian's state, servicer and call policy for the federation's mechanism family: query batches
    with a 2PC (selection), or noisy totals (release); ``force``: the site's reason to run what the
    pre-spend checks refuse as a judgement."""
    config = party.config
    if isinstance(config.mechanism, ReleaseMember):
        protocol = party.runnable.release_protocol()
        core = ReleaseGuardian(
            config=config, ledger=ledger, noise=noise, protocol=protocol, metrics=party.metrics
        )
        return core, ReleaseGuardianServicer(core), RELEASE_POLICY
    keep_freed_memory()  # the garbler's label arrays, every batch (before the gRPC threads start)
    guardian = Guardian(config=config, ledger=ledger, noise=noise, metrics=party.metrics, force=force)
    return guardian, GuardianServicer(guardian), POLICY


def serve(settings: GuardianSettings, *, stop: threading.Event) -> None:
    """Run the guardian until ``stop`` is set — or until a membership change is recorded through its admin
    API, after which it must start again under the new ``federation.yaml``: gRPC (mTLS) for the parties,
    REST for admins."""
    party = PartyRuntime(settings, role="guardian")
    noise = party_noise("guardian", seed=party.config.mechanism.insecure_noise_seed)
    ledger = open_ledger(settings)
    guardian, servicer, policy = _core(party, ledger, noise, force=settings.force)
    limit = MessageLimits.of(party.config).compute
    limits = settings.grpc.limits()
    interceptor = party.interceptor(policy, limits=limits, superseded=superseded_hashes(ledger))
    server = start_grpc_server(
        bind=settings.grpc.bind,
        tls=party.tls,
        register=[add_to_server(servicer)],
        services=[rpc.GUARDIAN_SERVICE],
        interceptors=[interceptor],
        max_workers=settings.grpc.max_workers,
        limits=limits,
        # Only the student's Compute frames are large; a teacher's call is read whole before its role is
        # checked, so this bounds what any certified party can make the guardian buffer.
        max_receive_bytes=limit,
        max_send_bytes=limit,
    )

    def changed() -> None:
        _log.warning("membership changed: stopping; start the guardian again with the new federation.yaml")
        stop.set()

    try:
        party.start_admin(
            readiness=lambda: {"grpc": (True, {"port": server.port}), "ledger": (True, str(settings.ledger))},
            routers=[
                router(
                    guardian,
                    student=StudentView(
                        settings.student_admin, ca=settings.tls.ca, party=party.config.student
                    ),
                ),
                membership_router(
                    config=party.config, ledger=ledger, on_change=changed, serials=interceptor.serials
                ),
                dashboard_router(),
            ],
        )
        _log.info("guardian ready", extra={"grpc_port": server.port, "admin_port": party.admin_port})
        stop.wait()
    finally:
        server.stop(grace=5)
        party.stop_admin()
        ledger.close()
        _log.info("guardian stopped")
