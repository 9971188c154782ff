"""``capc student run`` for a release federation: serve the teachers' release RPCs, run the releases, publish.

The work stream of the selection family answers UNIMPLEMENTED here (and these RPCs there): a federation runs
one mechanism family, fixed by ``federation.yaml`` and pinned by its hash.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import numpy.typing as npt
from fastapi import APIRouter

from capc_common.aggregation import party_noise
from capc_common.errors import CapcError
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_from_proto, rpc
from capc_services.common.admin import api_router
from capc_services.common.errors import status_for
from capc_services.common.interceptors import acting_party
from capc_services.common.limits import HEADROOM
from capc_services.common.party import PartyRuntime
from capc_services.common.runtime import start_grpc_server
from capc_services.student.failure import Failure, failure_of
from capc_services.student.releases import (
    ReleaseClient,
    ReleaseJournal,
    ReleaseProgress,
    ReleaseRounds,
    publish_release,
    release_privacy,
    run_releases,
)
from capc_services.student.servicer import add_to_server
from capc_services.student.settings import StudentSettings

if TYPE_CHECKING:
    from capc_common.models import Backbone

_log = logging.getLogger(__name__)
RELEASE_POLICY = {
    f"/{rpc.STUDENT_SERVICE}/NextRelease": frozenset({"teacher"}),
    f"/{rpc.STUDENT_SERVICE}/SubmitContributionShare": frozenset({"teacher"}),
}
MAX_POLL_S = 30.0
"""Longest a teacher's NextRelease call is held open before it answers ``pending``."""


def release_message_bytes(length: int) -> int:
    """The message limit of the release RPCs, either way: one int64 share of ``length`` coordinates in, one
    state out."""
    return length * 8 + HEADROOM


class ReleaseStudentServicer(rpc.StudentServiceServicer):
    """Implements the release RPCs of ``capc.v1.StudentService`` over :class:`ReleaseRounds`."""

    def __init__(self, rounds: ReleaseRounds) -> None:
        self._rounds = rounds

    def NextRelease(self, request: pb.NextReleaseRequest, context: grpc.ServicerContext) -> pb.ReleaseItem:
        party = acting_party(context, request.party, what="poll releases")
        left = context.time_remaining()
        timeout = MAX_POLL_S if left is None else max(0.0, min(MAX_POLL_S, left - 1.0))
        try:
            item = self._rounds.next_for(party, timeout=timeout)
        except CapcError as exc:
            context.abort(status_for(exc), str(exc))
        return item

    def SubmitContributionShare(
        self, request: pb.ContributionShare, context: grpc.ServicerContext
    ) -> pb.ContributionShareReply:
        party = acting_party(context, request.party, what="deliver a share")
        try:
            share = ndarray_from_proto(request.share)
            received = self._rounds.deliver(release_id=request.release_id, party=party, share=share)
        except CapcError as exc:
            context.abort(status_for(exc), str(exc))
        return pb.ContributionShareReply(received=received)


def progress_router(
    progress: ReleaseProgress, *, noise: str, privacy: Callable[[], dict[str, Any]]
) -> APIRouter:
    """``/api/v1/progress`` of a release federation; ``privacy`` gives its guarantee and realised ε."""
    api = api_router()

    @api.get("/progress", tags=["student"])
    def read() -> dict[str, Any]:
        """Releases done and planned, the guarantee ``epsilon`` beside the realised ``epsilon_spent``, the RDP
        they cost, the parties of the last one, the published model."""
        figures = privacy()
        return {
            **{k: figures[k] for k in ("epsilon", "epsilon_note", "epsilon_spent", "epsilon_spent_note")},
            "state": progress.state,
            "error": progress.error,
            "rounds": progress.rounds,
            "rounds_done": progress.rounds_done,
            "rdp_spent": progress.rdp_spent,
            "last_parties": progress.last_parties,
            "published": progress.published,
            "noise": noise,
        }

    return api


def evaluation_set(
    settings: StudentSettings, backbone: Backbone
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], str] | None:
    """Held-out per-example features, labels and name for the model card, or None when not configured.

    Public test images: their features go through the site's shared feature cache (``feature_cache:``), so
    what reads the same set on this machine (the demo's hospitals alone) reads them there.
    """
    evaluate = settings.train.evaluate
    if evaluate is None:
        return None
    from capc_common.data import load_dataset
    from capc_common.federation.releases import Featuriser
    from capc_common.models.cache import FeatureCache

    q = settings.federation_config.queries
    cache = None if settings.feature_cache is None else FeatureCache(settings.feature_cache)
    featurise = Featuriser(backbone, (q.height, q.width, q.channels), cache)
    test = load_dataset(evaluate.dataset, split="test")
    limit = evaluate.limit or len(test.labels)
    labels = np.asarray(test.labels[:limit], dtype=np.int64)
    return featurise(test.images[:limit]), labels, f"{evaluate.dataset}/test"


def run_release_student(
    settings: StudentSettings, party: PartyRuntime, *, stop: threading.Event, noise: str
) -> Failure | None:
    """Run a release federation's student until ``stop`` is set (or, with ``exit_when_done``, published).

    Returns:
        Why its work failed (its state ended ``failed``), or ``None``.
    """
    config = party.config
    protocol = party.runnable.release_protocol()
    rounds = ReleaseRounds(config, length=protocol.length)
    progress = ReleaseProgress(rounds=protocol.rounds)
    guardian = ReleaseClient(
        config=config,
        tls=party.tls,
        address=settings.guardian_address,
        length=protocol.length,
        metrics=party.metrics,
    )
    message = release_message_bytes(protocol.length)
    failures: list[Failure] = []
    server = start_grpc_server(
        bind=settings.grpc.bind,
        tls=party.tls,
        register=[add_to_server(ReleaseStudentServicer(rounds))],
        services=[rpc.STUDENT_SERVICE],
        interceptors=[party.interceptor(RELEASE_POLICY, limits=settings.grpc.limits())],
        max_workers=max(settings.grpc.max_workers, 2 * len(config.teachers) + 8),
        limits=settings.grpc.limits(),
        max_receive_bytes=message,
        max_send_bytes=message,
    )

    def work() -> None:
        try:
            protocol.precompute()  # while the teachers featurise their records
            run_releases(
                protocol=protocol,
                rounds=rounds,
                guardian=guardian,
                journal=ReleaseJournal(
                    settings.store.parent, config_hash=party.config_hash, length=protocol.length
                ),
                # the student's part of every release's noise, from its own CSPRNG
                noise=party_noise("student", seed=config.mechanism.insecure_noise_seed),
                progress=progress,
                stop=stop,
            )
            progress.state = "publishing"
            progress.published = publish_release(
                config=config,
                protocol=protocol,
                progress=progress,
                output_dir=settings.output_dir,
                evaluate=evaluation_set(settings, party.backbone),
            )
            progress.state = "published"
            _log.info("student published", extra=progress.published)
        except Exception as exc:
            # Any failure ends the releases visibly (state "failed", the reason, logged): an OSError (a full
            # disk, an unusable feature cache) that escaped would end this thread alone, and the student would
            # serve on as if it waited for its teachers. A CapcError says what to fix; anything else gets its
            # traceback in the log.
            failure = failure_of(exc)
            failures.append(failure)
            error = failure.reason
            progress.error = error  # first: a reader never sees "failed" without its reason
            progress.state = "stopped" if stop.is_set() else "failed"
            rounds.finish()
            _log.error("student failed", extra={"error": error}, exc_info=not isinstance(exc, CapcError))
        finally:
            if settings.exit_when_done:
                stop.set()

    worker = threading.Thread(target=work, name="releases", daemon=True)
    try:
        party.start_admin(
            readiness=lambda: {
                "grpc": (True, {"port": server.port}),
                "releases": (progress.state != "failed", {"state": progress.state, "error": progress.error}),
            },
            routers=[
                progress_router(
                    progress, noise=noise, privacy=lambda: release_privacy(config, protocol, progress)
                )
            ],
        )
        worker.start()
        stop.wait()
    finally:
        rounds.finish()
        if worker.is_alive():
            worker.join(timeout=5)
        server.stop(grace=2)
        guardian.close()
        party.stop_admin()
        _log.info("student stopped", extra={"state": progress.state})
    return failures[-1] if failures and progress.state == "failed" else None
