"""gRPC face of a release federation's guardian: ``SubmitContribution`` and ``Release`` over a
:class:`ReleaseGuardian` (the batch RPCs of the selection family answer UNIMPLEMENTED here)."""

from __future__ import annotations

import grpc

from capc_common.errors import CapcError
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_to_proto, rpc
from capc_services.common.errors import abort
from capc_services.common.interceptors import acting_party, peer_name
from capc_services.guardian.releases import MissingSeedsError, ReleaseGuardian, ReleaseReplayError

RELEASE_POLICY = {
    f"/{rpc.GUARDIAN_SERVICE}/SubmitContribution": frozenset({"teacher"}),
    f"/{rpc.GUARDIAN_SERVICE}/Release": frozenset({"student"}),
}


def _abort(context: grpc.ServicerContext, exc: CapcError) -> None:
    """Abort with the most precise status: a replay is ALREADY_EXISTS, a release asked too early
    FAILED_PRECONDITION, the rest as everywhere (:func:`status_for`)."""
    code = None
    if isinstance(exc, ReleaseReplayError):
        code = grpc.StatusCode.ALREADY_EXISTS
    elif isinstance(exc, MissingSeedsError):
        code = grpc.StatusCode.FAILED_PRECONDITION
    abort(context, exc, code=code)


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
                release_id=request.release_id, party=caller, seed=request.seed, length=request.length
            )
        except CapcError as exc:
            _abort(context, exc)
        return pb.SubmitContributionReply(received=received)

    def Release(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> pb.ReleaseReply:
        try:
            masked, charged, remaining = self._g.release(
                release_id=request.release_id, parties=tuple(request.parties), actor=peer_name(context)
            )
        except CapcError as exc:
            _abort(context, exc)
        return pb.ReleaseReply(masked=ndarray_to_proto(masked), charged_rdp=charged, remaining_rdp=remaining)
