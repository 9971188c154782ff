"""gRPC face of a release federation's guardian: ``SubmitContribution``, ``Release``, ``DepositRelease`` and
``ReleaseRecord`` over a :class:`ReleaseGuardian` (the batch RPCs of the selection family answer UNIMPLEMENTED
here)."""

from __future__ import annotations

import grpc

from capc_common.errors import CapcError
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_from_proto, ndarray_to_proto, release_ledger_to_proto, rpc
from capc_services.common.errors import MISSING_SEEDS_KEY, abort
from capc_services.common.interceptors import acting_party, peer_name
from capc_services.guardian.releases import (
    BeyondPlanError,
    MissingSeedsError,
    ReleaseGuardian,
    ReleaseReplayError,
)

RELEASE_POLICY = {
    f"/{rpc.GUARDIAN_SERVICE}/SubmitContribution": frozenset({"teacher"}),
    f"/{rpc.GUARDIAN_SERVICE}/Release": frozenset({"student"}),
    f"/{rpc.GUARDIAN_SERVICE}/DepositRelease": frozenset({"student"}),
    f"/{rpc.GUARDIAN_SERVICE}/ReleaseRecord": frozenset({"student"}),
}
_STATES = {
    "open": pb.ReleaseRoundState.RELEASE_ROUND_STATE_OPEN,
    "charged": pb.ReleaseRoundState.RELEASE_ROUND_STATE_CHARGED,
    "deposited": pb.ReleaseRoundState.RELEASE_ROUND_STATE_DEPOSITED,
}


def _abort(context: grpc.ServicerContext, exc: CapcError) -> None:
    """Abort with the most precise status: a second seed or total, or an attempt of another round, is
    ALREADY_EXISTS, a release whose seeds did not all arrive (its trailing metadata naming the parties,
    :data:`MISSING_SEEDS_KEY`) or a total for a round not charged FAILED_PRECONDITION, a round beyond the plan
    OUT_OF_RANGE, the rest as everywhere (:func:`~capc_services.common.errors.abort`: a full or read-only
    volume is RESOURCE_EXHAUSTED with ``capc-error: storage``)."""
    code: grpc.StatusCode | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    if isinstance(exc, ReleaseReplayError):
        code = grpc.StatusCode.ALREADY_EXISTS
    elif isinstance(exc, MissingSeedsError):
        code = grpc.StatusCode.FAILED_PRECONDITION
        metadata = ((MISSING_SEEDS_KEY, ",".join(exc.missing)),) if exc.missing else ()
    elif isinstance(exc, BeyondPlanError):
        code = grpc.StatusCode.OUT_OF_RANGE
    abort(context, exc, code=code, metadata=metadata)


class ReleaseGuardianServicer(rpc.GuardianServiceServicer):
    """Implements the release RPCs of ``capc.v1.GuardianService`` over a :class:`ReleaseGuardian`."""

    def __init__(self, guardian: ReleaseGuardian) -> None:
        self._g = guardian

    def SubmitContribution(
        self, request: pb.SubmitContributionRequest, context: grpc.ServicerContext
    ) -> pb.SubmitContributionReply:
        caller = acting_party(context, request.party, what="contribute")
        try:
            received = self._g.submit_contribution(
                release_id=request.release_id,
                round=request.round,
                party=caller,
                seed=request.seed,
                length=request.length,
            )
        except CapcError as exc:
            _abort(context, exc)
        return pb.SubmitContributionReply(received=received)

    def Release(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> pb.ReleaseReply:
        try:
            released = self._g.release(
                release_id=request.release_id,
                round=request.round,
                parties=tuple(request.parties),
                actor=peer_name(context),
            )
            figures = self._g.plan_figures()
        except CapcError as exc:
            _abort(context, exc)
        return pb.ReleaseReply(
            masked=ndarray_to_proto(released.masked),
            charged_rdp=released.charged_rdp,
            remaining_rdp=released.remaining_rdp,
            release_id=released.release_id,
            parties=list(released.parties),
            replayed=released.replayed,
            ledger=release_ledger_to_proto(figures),
        )

    def DepositRelease(
        self, request: pb.DepositReleaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseLedger:
        try:
            figures = self._g.deposit(
                round=request.round,
                release_id=request.release_id,
                total=ndarray_from_proto(request.total),
                actor=peer_name(context),
            )
        except CapcError as exc:
            _abort(context, exc)
        return release_ledger_to_proto(figures)

    def ReleaseRecord(
        self, request: pb.ReleaseRecordRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseRecordReply:
        try:
            state, release_id, total, figures = self._g.record(round=request.round)
        except CapcError as exc:
            _abort(context, exc)
        reply = pb.ReleaseRecordReply(
            state=_STATES[state], release_id=release_id, ledger=release_ledger_to_proto(figures)
        )
        if total is not None:
            reply.total.CopyFrom(ndarray_to_proto(total))
        return reply
