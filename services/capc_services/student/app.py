"""``capc student run``: the student process — label, train, publish."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException

from capc_common.aggregation import party_noise
from capc_common.errors import CapcError
from capc_common.wire import rpc
from capc_services.common.admin import api_router
from capc_services.common.party import PartyRuntime, apply_torch_threads
from capc_services.common.runtime import start_grpc_server
from capc_services.student.accounting import epsilon_figures
from capc_services.student.guardian_client import GuardianClient
from capc_services.student.links import TeacherRegistry
from capc_services.student.publish import noise_label, publish_student
from capc_services.student.scheduler import Scheduler
from capc_services.student.servicer import POLICY, StudentServicer, add_to_server
from capc_services.student.settings import StudentSettings
from capc_services.student.store import LabelStore

_log = logging.getLogger(__name__)


def progress_router(scheduler: Scheduler, registry: TeacherRegistry, *, noise: str) -> APIRouter:
    """``/api/v1/progress`` over the student's scheduler and teacher links."""
    api = api_router()

    @api.get("/progress", tags=["student"])
    def progress() -> dict[str, Any]:
        """Labelling progress, connected teacher parties, the last batches' timings (wall time, the slowest
        party's model work, protocol = the difference) and the published model once it exists."""
        p = scheduler.progress
        return {
            "state": p.state,
            "stopped_reason": p.stopped_reason,
            "error": p.error,
            "queries_planned": p.queries_planned,
            **scheduler.store.counts(),
            **epsilon_figures(scheduler.config, scheduler.store),
            "labels_per_s": p.labels_per_s,
            "last_batch": p.last_batch,
            "teachers_connected": sorted(registry.live()),
            "published": p.published,
            "recent_batches": list(p.recent),
            "noise": noise,
        }

    @api.get("/model-card", tags=["student"])
    def model_card() -> dict[str, Any]:
        """The published model card (404 until the student has published)."""
        published = scheduler.progress.published
        if not published:
            raise HTTPException(status_code=404, detail="the student has not published a model yet")
        card: dict[str, Any] = json.loads(Path(published["model_card"]).read_text())
        return card

    return api


def run(settings: StudentSettings, *, stop: threading.Event) -> None:
    """Run the student until ``stop`` is set (or, with ``exit_when_done``, until it has published)."""
    party = PartyRuntime(settings, role="student")
    apply_torch_threads(settings.torch_threads)
    store = LabelStore(settings.store, config_hash=party.config_hash)
    registry = TeacherRegistry()
    guardian = GuardianClient(
        config=party.config,
        tls=party.tls,
        address=settings.guardian_address,
        noise=party_noise("student", seed=party.config.mechanism.insecure_noise_seed),
    )
    scheduler = Scheduler(
        config=party.config,
        store=store,
        registry=registry,
        guardian=guardian,
        metrics=party.metrics,
        depth=settings.pipeline_depth,
        connect_timeout=settings.connect_timeout_s,
    )
    server = start_grpc_server(
        bind=settings.grpc.bind,
        tls=party.tls,
        register=[add_to_server(StudentServicer(config=party.config, registry=registry))],
        services=[rpc.STUDENT_SERVICE],
        interceptors=[party.interceptor(POLICY)],
        max_workers=max(settings.grpc.max_workers, 2 * len(party.config.teachers) + 8),
    )
    guardian_ok: dict[str, Any] = {"ok": False, "detail": "not connected yet"}
    worker: threading.Thread | None = None

    def work() -> None:
        try:
            guardian.wait_ready(timeout=settings.connect_timeout_s)
            guardian_ok.update(ok=True, detail=settings.guardian_address)
            scheduler.run()
            if stop.is_set():
                return
            scheduler.progress.state = "training"
            scheduler.progress.published = publish_student(settings, store=store, progress=scheduler.progress)
            scheduler.progress.state = "published"
            _log.info("student published", extra=scheduler.progress.published)
        except CapcError as exc:
            scheduler.progress.state = "failed"
            scheduler.progress.error = str(exc)
            _log.error("student failed", extra={"error": str(exc)})
        finally:
            if settings.exit_when_done:
                stop.set()

    try:
        party.start_admin(
            readiness=lambda: {
                "grpc": (True, {"port": server.port}),
                "guardian": (guardian_ok["ok"], guardian_ok["detail"]),
            },
            routers=[progress_router(scheduler, registry, noise=noise_label(party.config))],
        )
        worker = threading.Thread(target=work, name="scheduler", daemon=True)
        worker.start()
        stop.wait()
    finally:
        scheduler.stop()
        registry.close_all()
        if worker is not None:
            worker.join(timeout=30)
        server.stop(grace=5)
        guardian.close()
        party.stop_admin()
        store.close()
        _log.info("student stopped", extra={"state": scheduler.progress.state})
