"""gRPC face of the guardian: thin methods that log, call :class:`Guardian` and map errors to statuses."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from capc_common.errors import CapcError, ProtocolError
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.errors import abort
from capc_services.common.interceptors import acting_party, peer_name
from capc_services.common.streams import FRAME_DEADLINE_S, FrameChannel
from capc_services.guardian.core import Guardian

_log = logging.getLogger(__name__)
_STATE = {
    "open": pb.BatchState.Value("BATCH_STATE_OPEN"),
    "settled": pb.BatchState.Value("BATCH_STATE_SETTLED"),
    "released": pb.BatchState.Value("BATCH_STATE_RELEASED"),
    "unknown": pb.BatchState.Value("BATCH_STATE_UNKNOWN"),
    "charged": pb.BatchState.Value("BATCH_STATE_CHARGED"),
}

# Who may call what (checked by the AuthInterceptor before any method runs).
POLICY = {
    f"/{rpc.GUARDIAN_SERVICE}/OpenBatch": frozenset({"student"}),
    f"/{rpc.GUARDIAN_SERVICE}/AbortBatch": frozenset({"student"}),
    f"/{rpc.GUARDIAN_SERVICE}/BatchStatus": frozenset({"student"}),
    f"/{rpc.GUARDIAN_SERVICE}/Reveal": frozenset({"student"}),
    f"/{rpc.GUARDIAN_SERVICE}/Compute": frozenset({"student"}),
    f"/{rpc.GUARDIAN_SERVICE}/SubmitShares": frozenset({"teacher"}),
}


class GuardianServicer(rpc.GuardianServiceServicer):
    """Implements ``capc.v1.GuardianService`` over a :class:`Guardian`.

    Args:
        guardian: the guardian's state.
        frame_deadline_s: how long, within a batch, the garbler waits for the student's next frame or for
            it to read what was sent (a stalled student then fails its batch instead of holding the
            guardian's computation lock).
    """

    def __init__(self, guardian: Guardian, *, frame_deadline_s: float = FRAME_DEADLINE_S) -> None:
        self._g = guardian
        self._deadline = frame_deadline_s

    def OpenBatch(self, request: pb.OpenBatchRequest, context: grpc.ServicerContext) -> pb.OpenBatchReply:
        try:
            status, reserved = self._g.open_batch(
                batch_id=request.batch_id,
                count=request.count,
                digest=request.query_digest,
                actor=peer_name(context),
            )
            remaining = float(self._g.ledger.summary()["remaining_rdp"])
        except CapcError as exc:
            abort(context, exc)
        return pb.OpenBatchReply(
            state=_STATE[status.state],
            reserved_rdp=reserved,
            remaining_rdp=remaining,
            answered=status.answered,
        )

    def AbortBatch(self, request: pb.AbortBatchRequest, context: grpc.ServicerContext) -> pb.BatchStatusReply:
        try:
            status = self._g.abort_batch(request.batch_id, reason=request.reason, actor=peer_name(context))
        except CapcError as exc:
            abort(context, exc)
        return pb.BatchStatusReply(state=_STATE[status.state], answered=status.answered, detail=status.detail)

    def BatchStatus(
        self, request: pb.BatchStatusRequest, context: grpc.ServicerContext
    ) -> pb.BatchStatusReply:
        status = self._g.status(request.batch_id)
        return pb.BatchStatusReply(state=_STATE[status.state], answered=status.answered, detail=status.detail)

    def Reveal(self, request: pb.RevealRequest, context: grpc.ServicerContext) -> pb.RevealReply:
        try:
            computation, count, reveal = self._g.reveal(request.batch_id, actor=peer_name(context))
        except CapcError as exc:
            abort(context, exc)
        return pb.RevealReply(computation=computation, count=count, reveal=reveal)

    def SubmitShares(
        self, request: pb.SubmitSharesRequest, context: grpc.ServicerContext
    ) -> pb.SubmitSharesReply:
        caller = acting_party(context, request.party, what="submit shares")
        try:
            received = self._g.submit_shares(
                batch_id=request.batch_id,
                attempt=request.attempt,
                party=caller,
                seed=request.seed,
                shape=tuple(request.shape),
            )
        except CapcError as exc:
            abort(context, exc)
        return pb.SubmitSharesReply(received=received)

    def Compute(
        self, request_iterator: Iterator[pb.ComputeMessage], context: grpc.ServicerContext
    ) -> Iterator[pb.ComputeMessage]:
        actor = peer_name(context)
        channel = FrameChannel(request_iterator, peer=actor, deadline=self._deadline)
        failure: list[BaseException] = []

        def serve_batches() -> None:
            session = self._g.session(channel)
            try:
                while True:
                    message = channel.next_message()
                    if message is None:
                        return  # the student closed its side: the session ends cleanly
                    if message.WhichOneof("kind") != "start":
                        raise ProtocolError(
                            f"{actor} sent {message.WhichOneof('kind')} where ComputeStart was due"
                        )
                    start = message.start
                    try:
                        agreed = self._g.agree(
                            batch_id=start.batch_id,
                            attempt=start.attempt,
                            parties=tuple(start.parties),
                            actor=actor,
                        )
                    except CapcError as exc:
                        state = _STATE[self._g.status(start.batch_id).state]
                        channel.send_message(
                            pb.ComputeMessage(
                                refused=pb.ComputeRefused(
                                    batch_id=start.batch_id, state=state, reason=str(exc)
                                )
                            )
                        )
                        continue
                    agreed_message = pb.ComputeAgreed(
                        parties=list(agreed.parties), computation=agreed.computation
                    )
                    channel.send_message(pb.ComputeMessage(agreed=agreed_message))
                    self._g.compute(
                        batch_id=start.batch_id,
                        attempt=start.attempt,
                        agreement=agreed,
                        session=session,
                        actor=actor,
                    )
            except BaseException as exc:  # reported to the student as the stream's status
                failure.append(exc)
            finally:
                channel.close()

        worker = threading.Thread(target=serve_batches, name=f"garbler-{actor}", daemon=True)
        worker.start()
        context.add_callback(channel.close)
        yield from channel.outgoing()
        worker.join()
        if failure:
            _log.warning("compute stream failed", extra={"peer": actor, "error": str(failure[0])})
            abort(context, failure[0])


def add_to_server(servicer: Any) -> Any:
    """A registration callback for :func:`~capc_services.common.runtime.start_grpc_server` (any
    ``GuardianService`` servicer: this one, or a release federation's)."""
    return lambda server: rpc.add_GuardianServiceServicer_to_server(servicer, server)
