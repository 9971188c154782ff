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
from capc_common.federation import ReleaseMember
from capc_common.memory import keep_freed_memory
from capc_common.wire import rpc
from capc_services.common.admin import api_router, problem_response
from capc_services.common.limits import MessageLimits
from capc_services.common.party import PartyRuntime, apply_threads
from capc_services.common.runtime import start_grpc_server
from capc_services.student.accounting import epsilon_figures, guarantee, noise_label
from capc_services.student.failure import Failure, failure_of
from capc_services.student.guardian_client import GuardianClient
from capc_services.student.links import TeacherRegistry
from capc_services.student.release_app import run_release_student
from capc_services.student.scheduler import Progress, Scheduler
from capc_services.student.servicer import POLICY, StudentServicer, add_to_server
from capc_services.student.settings import StudentSettings
from capc_services.student.store import LabelStore
from capc_services.student.training import TrainingStopped

_log = logging.getLogger(__name__)
STOP_GRACE_S = 5.0
"""How long a stopping student waits for its labelling or training thread (``capc local down`` waits 15 s
before SIGKILL)."""


def progress_router(scheduler: Scheduler, registry: TeacherRegistry, *, noise: str) -> APIRouter:
    """``/api/v1/progress`` over the student's scheduler and teacher links."""
    api = api_router()

    @api.get("/progress", tags=["student"])
    def progress() -> dict[str, Any]:
        """Labelling progress, the guarantee ``epsilon`` beside the realised ``epsilon_spent``, connected
        teacher parties, the last batches' timings (wall time, the slowest party's model work, protocol = the
        difference) and the published model once it exists."""
        p = scheduler.progress
        connected = sorted(registry.live())
        return {
            "state": p.state,
            "stopped_reason": p.stopped_reason,
            "error": p.error,
            "waiting": waiting_text(
                p.waiting_for, connected=connected, parties=len(scheduler.config.teachers)
            ),
            "queries_planned": p.queries_planned,
            **scheduler.store.counts(),
            **guarantee(scheduler.config),
            **epsilon_figures(scheduler.config, scheduler.store),
            "labels_per_s": p.labels_per_s,
            "reconnects": p.reconnects,
            "recovered_batches": p.recovered_batches,
            "last_batch": p.last_batch,
            "teachers_connected": connected,
            "published": p.published,
            "recent_batches": list(p.recent),
            "noise": noise,
        }

    @api.get(
        "/model-card",
        tags=["student"],
        responses={404: problem_response("The student has not published a model yet.")},
    )
    def model_card() -> dict[str, Any]:
        """The published model card (404 until the student has published)."""
        published = scheduler.progress.published
        if not published:
            raise HTTPException(status_code=404, detail="the student has not published a model yet")
        card: dict[str, Any] = json.loads(Path(published["model_card"]).read_text())
        return card

    return api


def waiting_text(quorum: int, *, connected: list[str], parties: int) -> str:
    """What the next batch waits for, '' when nothing: ``quorum`` teacher parties must be connected first
    (``capc local status`` shows it, so a federation that is starting reads as waiting, not as stuck)."""
    if len(connected) >= quorum:
        return ""
    return (
        f"for teacher parties: {len(connected)} of the {quorum} needed connected "
        f"({', '.join(connected) or 'none yet'}; {parties} in the federation)"
    )


def _labelling_check(progress: Progress, *, guardian: str) -> tuple[bool, dict[str, Any]]:
    """Readiness of the labelling loop: not ready while it reconnects to the guardian, nor once it failed."""
    detail: dict[str, Any] = {"state": progress.state, "guardian": guardian}
    if progress.error:
        detail["error"] = progress.error
    return progress.state not in ("failed", "reconnecting", "waiting for storage"), detail


def run(settings: StudentSettings, *, stop: threading.Event) -> Failure | None:
    """Run the student until ``stop`` is set (or, with ``exit_when_done``, until it has published).

    Returns:
        Why its work failed (its state ended ``failed``), or ``None``: a one-shot job's caller exits non-zero
        on a failure rather than reporting success.
    """
    releases = isinstance(settings.federation_config.mechanism, ReleaseMember)  # noisy totals, no batches
    if releases:  # its start-up check builds the protocol (DPPL-Public featurises its pool)
        apply_threads(settings.torch_threads)
    party = PartyRuntime(settings, role="student")
    if releases:
        return run_release_student(settings, party, stop=stop, noise=noise_label(party.config))
    keep_freed_memory()  # the evaluator's label arrays, every batch (before the gRPC threads start)
    store = LabelStore(
        settings.store, config_hash=party.config_hash, continues=party.config.previous_hashes.keys()
    )
    registry = TeacherRegistry()
    guardian = GuardianClient(
        config=party.config,
        tls=party.tls,
        address=settings.guardian_address,
        noise=party_noise("student", seed=party.config.mechanism.insecure_noise_seed),
        metrics=party.metrics,
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
    limits = MessageLimits.of(party.config)
    server = start_grpc_server(
        bind=settings.grpc.bind,
        tls=party.tls,
        register=[add_to_server(StudentServicer(config=party.config, registry=registry))],
        services=[rpc.STUDENT_SERVICE],
        interceptors=[party.interceptor(POLICY, limits=settings.grpc.limits())],
        max_workers=max(settings.grpc.max_workers, 2 * len(party.config.teachers) + 8),
        limits=settings.grpc.limits(),
        max_receive_bytes=limits.share,
        max_send_bytes=limits.work,
    )
    worker: threading.Thread | None = None
    failures: list[Failure] = []

    def work() -> None:
        try:
            scheduler.run()
            if stop.is_set():
                return
            apply_threads(settings.torch_threads)  # torch: only once it trains
            # Importing torch takes seconds on a busy machine and cannot be interrupted: "training" (whose
            # steps look at `stop` between blocks) starts once it is done, so a shutdown sent in that state
            # is answered within a block.
            from capc_services.student.publish import publish_student

            scheduler.progress.state = "training"
            scheduler.progress.published = publish_student(
                settings, store=store, progress=scheduler.progress, stop=stop
            )
            scheduler.progress.state = "published"
            _log.info("student published", extra=scheduler.progress.published)
        except TrainingStopped as exc:
            scheduler.progress.state = "stopped"
            _log.info("training interrupted by shutdown", extra={"detail": str(exc)})
        except Exception as exc:
            # Any failure ends the work visibly (state "failed", the reason, logged), as the release student
            # does: an OSError (a full disk, an output directory that cannot be made) that escaped would end
            # this thread alone, and the student would report "training" for ever. A CapcError says what to
            # fix; anything else gets its traceback in the log. The labels stay in the store: the next start
            # trains again.
            failure = failure_of(exc)
            failures.append(failure)
            error = failure.reason
            scheduler.progress.error = error  # first: a reader never sees "failed" without its reason
            scheduler.progress.state = "stopped" if stop.is_set() else "failed"
            _log.error("student failed", extra={"error": error}, exc_info=not isinstance(exc, CapcError))
        finally:
            if settings.exit_when_done:
                stop.set()

    try:
        party.start_admin(
            readiness=lambda: {
                "grpc": (True, {"port": server.port}),
                "labelling": _labelling_check(scheduler.progress, guardian=settings.guardian_address),
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
            # Labelling ends at the batch in hand and training between two batches; one chunk's fit cannot
            # be cut short, so after STOP_GRACE_S the process exits without it (nothing durable is lost:
            # the labels are in the store and training runs again at the next start).
            worker.join(timeout=STOP_GRACE_S)
        server.stop(grace=2)
        guardian.close()
        party.stop_admin()
        if worker is None or not worker.is_alive():
            store.close()
        _log.info("student stopped", extra={"state": scheduler.progress.state})
    return failures[-1] if failures and scheduler.progress.state == "failed" else None
