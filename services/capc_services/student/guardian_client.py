"""The student's calls to the guardian: open/abort/status of batches and the evaluator side of the 2PC."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import numpy as np

from capc_common.errors import CapcError, ProtocolError, UnavailableError
from capc_common.federation import FederationConfig, mechanism_of, mpc_config
from capc_common.mpc import EvaluatorSession, Reveal, decode_labels, sum_shares
from capc_common.privacy import NoiseSource
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.errors import error_from_rpc
from capc_services.common.interceptors import FederationClientInterceptor
from capc_services.common.limits import MessageLimits
from capc_services.common.metrics import PartyMetrics
from capc_services.common.roundtrips import counted
from capc_services.common.streams import FRAME_DEADLINE_S, FrameChannel
from capc_services.tls import TlsFiles, channel_ready

_log = logging.getLogger(__name__)


class BatchRefused(UnavailableError):
    """The guardian will not compute a batch (e.g. quorum not met: released, cost nothing); stream intact."""


class GuardianUnavailable(UnavailableError):
    """The guardian cannot be reached, or the link to it broke: reconnect and resume (nothing is lost)."""


def _link_error(exc: CapcError) -> CapcError:
    """A broken or unreachable link becomes :class:`GuardianUnavailable`; every other error stays as it is."""
    return GuardianUnavailable(str(exc)) if type(exc) is UnavailableError else exc


Stash = Callable[[str, tuple[str, ...], np.ndarray], None]
"""``stash(computation, parties, select_bits)``: keeps what the student needs to decode a computation's labels
durably, before the guardian can commit it."""


STATE_NAMES = {v: k.removeprefix("BATCH_STATE_").lower() for k, v in pb.BatchState.items()}


class GuardianClient:
    """A mutual-TLS client of the guardian, pinned to the guardian's certificate name.

    Args:
        config: the federation config (its hash goes with every call).
        tls: the student's TLS files.
        address: ``host:port`` of the guardian.
        noise: the student's noise source, for its part z1_s of each batch's threshold noise (a
            :class:`~capc_common.privacy.SystemNoise` CSPRNG outside tests).
        timeout: seconds for unary calls.
        metrics: where its round trips to the guardian are counted (None: not counted).
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        tls: TlsFiles,
        address: str,
        noise: NoiseSource,
        timeout: float = 60.0,
        metrics: PartyMetrics | None = None,
    ) -> None:
        self._config = config
        self._peer = config.guardian
        limit = MessageLimits.of(config).compute
        self._channel = tls.channel(
            address,
            peer=self._peer,
            interceptors=(
                FederationClientInterceptor.dialling(config, tls=tls, peer=self._peer),
                *counted(metrics, peer="guardian"),
            ),
            receive=limit,
            send=limit,
        )
        self._metrics = metrics
        self._stub = rpc.GuardianServiceStub(self._channel)
        self._mpc = mpc_config(config)
        self._mechanism = mechanism_of(config)
        self._noise = noise
        self._timeout = timeout
        self._stream: tuple[FrameChannel, EvaluatorSession, object] | None = None

    def close(self) -> None:
        """End the Compute stream and close the channel."""
        self._drop_session()
        self._channel.close()

    def wait_ready(self, *, timeout: float) -> None:
        """Block until the channel connects (TLS handshake included).

        Raises:
            GuardianUnavailable: not within ``timeout`` seconds.
        """
        if not self.reachable(timeout=timeout):
            raise GuardianUnavailable(
                f"guardian did not accept a TLS connection within {timeout:.0f} s; check its address and "
                "that both parties' certificates come from the same CA"
            )

    def reachable(self, *, timeout: float) -> bool:
        """Whether a TLS connection to the guardian is up (or comes up within ``timeout`` seconds)."""
        return channel_ready(self._channel, timeout=timeout)

    def _call(self, method: str, request: object) -> object:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise _link_error(error_from_rpc(exc, peer=self._peer)) from None

    def open_batch(self, batch_id: str, *, count: int, digest: bytes) -> pb.OpenBatchReply:
        """Reserve a batch (raises BudgetExhaustedError when its worst case does not fit)."""
        reply = self._call(
            "OpenBatch", pb.OpenBatchRequest(batch_id=batch_id, count=count, query_digest=digest)
        )
        assert isinstance(reply, pb.OpenBatchReply)
        return reply

    def abort_batch(self, batch_id: str, *, reason: str) -> str:
        """Release an open batch; returns its state name."""
        reply = self._call("AbortBatch", pb.AbortBatchRequest(batch_id=batch_id, reason=reason))
        assert isinstance(reply, pb.BatchStatusReply)
        return STATE_NAMES[reply.state]

    def status(self, batch_id: str) -> pb.BatchStatusReply:
        """Where a batch stands on the guardian."""
        reply = self._call("BatchStatus", pb.BatchStatusRequest(batch_id=batch_id))
        assert isinstance(reply, pb.BatchStatusReply)
        return reply

    def reveal(self, batch_id: str) -> tuple[str, Reveal]:
        """A settled batch's reveal, sent again: ``(computation, reveal)`` (no new information, no charge).

        Raises:
            InputError: the batch has no reveal (not settled by a computation).
            ProtocolError: the reveal does not parse for the batch's size.
        """
        reply = self._call("Reveal", pb.RevealRequest(batch_id=batch_id))
        assert isinstance(reply, pb.RevealReply)
        reveal = Reveal.from_bytes(reply.reveal, queries=reply.count, label_bits=self._mpc.label_bits)
        return reply.computation, reveal

    def decode(self, select: np.ndarray, reveal: Reveal) -> np.ndarray:
        """Labels from stashed select bits and a reveal sent again (−1 = not answered)."""
        return decode_labels(select, reveal, classes=self._config.classes)

    def _session(self) -> tuple[FrameChannel, EvaluatorSession, object]:
        """The open Compute stream and its MPC session, opening them if needed (base OT on first use)."""
        if self._stream is None:
            channel = FrameChannel(
                None,
                peer=self._peer,
                on_error=lambda e: _link_error(error_from_rpc(e, peer=self._peer)),
                # The guardian answers ComputeStart only once the seeds arrived (up to the share deadline).
                deadline=self._config.quorum.share_deadline_s + FRAME_DEADLINE_S,
            )
            call = self._stub.Compute(channel.outgoing())
            channel.attach(call)
            self._stream = (channel, EvaluatorSession(channel, self._mpc), call)
        return self._stream

    def _drop_session(self) -> None:
        if self._stream is not None:
            channel, _, call = self._stream
            channel.close()
            call.cancel()  # type: ignore[attr-defined]
            self._stream = None

    def compute(
        self, batch_id: str, *, attempt: int, shares: dict[str, np.ndarray], stash: Stash | None = None
    ) -> tuple[np.ndarray, tuple[str, ...], int]:
        """Run the 2PC for one batch as the evaluator, on the long-lived Compute stream.

        Once the guardian has agreed to compute the batch, the student draws its part z1_s of the threshold
        noise (one N_Z(0, σ1²) per query, in batch order: the canonical order a seeded source reproduces)
        and enters it with its share. z1_s lives only in this call: it is never logged or stored, and a
        batch run again after a failure gets fresh noise (the guardian computes a batch at most once, so
        no batch is ever revealed twice).

        Args:
            batch_id: the open batch.
            attempt: the attempt whose shares these are.
            shares: the student's share of each responding party's votes, ``(count, classes)`` in Z_{2^w}.
            stash: keeps the select bits durably before the guardian can commit (see :data:`Stash`).

        Returns:
            ``(labels, agreed_parties, bytes_on_the_wire)``; labels are −1 where a query was not answered.

        Raises:
            UnavailableError: the guardian refused the batch (quorum not met: it was released and cost
                nothing); the stream stays open.
            ProtocolError: the computation failed (the stream is dropped; the next batch opens a new one).
        """
        channel, session, _ = self._session()
        before, turns = channel.bytes_sent + channel.bytes_received, channel.turns
        try:
            channel.send_message(
                pb.ComputeMessage(
                    start=pb.ComputeStart(batch_id=batch_id, attempt=attempt, parties=sorted(shares))
                )
            )
            reply = channel.recv_message()
            kind = reply.WhichOneof("kind")
            if kind == "refused":
                raise BatchRefused(f"guardian refused batch {batch_id}: {reply.refused.reason}")
            if kind != "agreed":
                raise ProtocolError(f"guardian answered ComputeStart with {kind}")
            agreed = tuple(reply.agreed.parties)
            extra = sorted(set(agreed) - set(shares))
            if extra:
                raise ProtocolError(f"guardian agreed on parties the student has no share from: {extra}")
            total = sum_shares([shares[p] for p in agreed], width=self._mpc.width)
            z1_student = self._mechanism.student_noise(self._noise, batch=total.shape[0])
            computation = reply.agreed.computation
            keep = None if stash is None else (lambda select: stash(computation, agreed, select))
            labels = session.run_batch(batch_id, share_sum=total, z1_student=z1_student, stash=keep)
        except BatchRefused:
            raise
        except CapcError:
            self._drop_session()
            raise
        except grpc.RpcError as exc:
            self._drop_session()
            raise _link_error(error_from_rpc(exc, peer=self._peer)) from None
        nbytes = channel.bytes_sent + channel.bytes_received - before
        if self._metrics is not None:
            self._metrics.round_trips.labels(peer="guardian", call="ComputeTurn").inc(channel.turns - turns)
        return np.asarray(labels, dtype=np.int64), agreed, nbytes
