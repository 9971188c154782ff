"""A teacher party's outbound links: the work stream to the student and share submission to the guardian.

The party listens on no gRPC port (hospital firewalls allow outbound connections only). It dials the
student, introduces itself, and answers work items as they arrive; when the stream breaks it reconnects
with capped exponential backoff until told to stop.

One identity answers over one stream: the hello carries this process's random instance id, and a student
that already has a live stream from another process of this party refuses the new one (``ALREADY_EXISTS``,
naming that process and since when it is connected). The refused process does not flap with it: it logs the
student's message as an error and tries again only every :data:`IDENTITY_IN_USE_BACKOFF_S` seconds, taking
over once the other process is gone (a restart whose old stream the student has not yet seen close).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from capc_common import __version__
from capc_common.errors import CapcError, ProtocolError, UnavailableError
from capc_common.federation import FederationConfig
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.errors import error_from_rpc
from capc_services.common.interceptors import FederationClientInterceptor
from capc_services.common.limits import MessageLimits
from capc_services.common.metrics import PartyMetrics
from capc_services.common.process import INSTANCE, describe
from capc_services.common.roundtrips import counted
from capc_services.teacher.worker import TeacherWorker
from capc_services.tls import TlsFiles, peer_problem

_log = logging.getLogger(__name__)
_END = object()
BACKOFF_S = (0.1, 1.0)
"""First and longest wait between two sessions with the student (doubling in between, back to the first once
a session was welcomed). After a welcomed session a new one waits for the channel to connect
(``wait_for_ready``), so a restarted student gets its teachers back at the channel's next attempt after it
listens (``RECONNECT_BACKOFF_MS``): measured here, within 0.2 s; sessions that failed at once and slept
0.5 s, then 1 s, brought them about 0.8 s after it listened, a third of each restart cycle of a student
killed again and again."""
IDENTITY_IN_USE_BACKOFF_S = 30.0
"""Wait before trying again after the student refused this process because another process of the party is
connected (see the module docstring)."""


class TeacherLinks:
    """Keeps the party connected and answering.

    Args:
        config: the federation config.
        party: this party's name (its certificate CN).
        tls: its TLS files.
        student_address: ``host:port`` of the student.
        guardian_address: ``host:port`` of the guardian.
        worker: answers work items.
        submit_timeout: seconds for a seed to reach the guardian.
        metrics: where its round trips are counted (None: not counted).
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        party: str,
        tls: TlsFiles,
        student_address: str,
        guardian_address: str,
        worker: TeacherWorker,
        submit_timeout: float = 60.0,
        metrics: PartyMetrics | None = None,
    ) -> None:
        self.config = config
        self.party = party
        self.worker = worker
        self._hash = config.config_hash()
        limits = MessageLimits.of(config)
        self._student_channel = tls.channel(
            student_address,
            peer=config.student,
            interceptors=(
                FederationClientInterceptor.dialling(config, tls=tls, peer=config.student),
                *counted(metrics, peer="student"),
            ),
            receive=limits.work,
            send=limits.share,
        )
        self._guardian_channel = tls.channel(
            guardian_address,
            peer=config.guardian,
            interceptors=(
                FederationClientInterceptor.dialling(config, tls=tls, peer=config.guardian),
                *counted(metrics, peer="guardian"),
            ),
            receive=limits.control,
            send=limits.control,
        )
        self._guardian_address, self._student_address = guardian_address, student_address
        self._student = rpc.StudentServiceStub(self._student_channel)
        self._guardian = rpc.GuardianServiceStub(self._guardian_channel)
        self._submit_timeout = submit_timeout
        self.connected = False
        self._seeds_pass = False  # the last seed reached the guardian: its link is up, no need to ask
        self.welcomes = 0  # sessions the student welcomed (a welcomed session resets the backoff)
        self.last_error = ""
        self._call: Any = None

    def submit_seed(self, batch_id: str, attempt: int, seed: bytes, shape: tuple[int, int]) -> None:
        """Send this party's mask seed for one batch attempt to the guardian.

        Raises:
            CapcError: the guardian refused or could not be reached.
        """
        request = pb.SubmitSharesRequest(
            batch_id=batch_id, attempt=attempt, party=self.party, seed=seed, shape=shape
        )
        self._seeds_pass = False
        try:
            # wait_for_ready: a link that is reconnecting delays the call instead of failing it at once
            self._guardian.SubmitShares(request, timeout=self._submit_timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, peer=self.config.guardian) from None
        except ValueError as exc:  # grpc: "Cannot invoke RPC on closed channel!" (shutting down)
            raise UnavailableError(f"not sent to guardian {self.config.guardian}: {exc}") from None
        self._seeds_pass = True

    def await_guardian(self) -> str:
        """Wait until a TLS connection to the guardian is up, at most the federation's vote deadline (the
        student waits no longer for this party's share); '' once it is, else why not.

        A party started before the guardian listens (``capc local up`` starts every party at once), or
        whose guardian restarts, otherwise fails the calls it makes while its link backs off between
        attempts, and refuses batches it could have answered a moment later. While seeds go through, the
        link is known to be up and nothing is asked: a health check before every batch would put one more
        round trip to the guardian on the batch's critical path.
        """
        if self._seeds_pass:
            return ""
        timeout = self.config.quorum.vote_deadline_s
        problem = self.guardian_problem(timeout=timeout)
        if not problem:
            return ""
        return (
            f"guardian {self.config.guardian} at {self._guardian_address} {problem} (vote_deadline_s); check "
            "that it runs, the address in this site file, and that both load the same federation.yaml"
        )

    def guardian_problem(self, *, timeout: float = 1.0) -> str:
        """Why the guardian is not usable ('' when a TLS connection is up, or comes up within ``timeout``,
        and it runs this party's federation config)."""
        return peer_problem(self._guardian_channel, timeout=timeout)

    def _session(self, stop: threading.Event) -> None:
        outgoing: queue.Queue[Any] = queue.Queue()
        outgoing.put(
            pb.TeacherMessage(
                hello=pb.TeacherHello(
                    party=self.party,
                    heads=self.worker.voter.heads,
                    software_version=__version__,
                    instance=INSTANCE,
                    process=describe(),
                )
            )
        )

        def requests() -> Iterator[pb.TeacherMessage]:
            while True:
                item = outgoing.get()
                if item is _END:
                    return
                yield item

        # Once a session was welcomed, a lost student is restarting: the next stream waits for the channel's
        # next successful connection (wait_for_ready, RECONNECT_BACKOFF_MS) instead of failing at once and
        # sleeping BACKOFF_S; close() cancels it. Before the first welcome a stream fails fast, so that a
        # wrong address or certificate is logged (and in readiness) at every try instead of waited on.
        restarting = self.welcomes > 0
        if restarting:
            self.last_error = self.last_error or f"waiting for the student at {self._student_address}"
        call = self._student.Work(requests(), wait_for_ready=restarting)
        self._call = call
        try:
            for message in call:
                kind = message.WhichOneof("kind")
                if kind == "welcome":
                    welcome = message.welcome
                    if welcome.config_hash != self._hash or welcome.student != self.config.student:
                        raise ProtocolError(
                            f"student {welcome.student!r} runs federation config {welcome.config_hash[:16]}, "
                            f"this party has {self._hash[:16]}; refusing to vote"
                        )
                    self.connected = True
                    self.welcomes += 1
                    self.last_error = ""
                    _log.info("connected to student", extra={"student": welcome.student})
                elif kind == "work":
                    if not self.connected:
                        raise ProtocolError("student sent work before its welcome")
                    outgoing.put(
                        self.worker.answer(
                            message.work, submit_seed=self.submit_seed, await_guardian=self.await_guardian
                        )
                    )
                if stop.is_set():
                    break
        finally:
            self.connected = False
            outgoing.put(_END)
            call.cancel()

    def run(self, stop: threading.Event) -> None:
        """Stay connected and answer until ``stop`` is set (reconnecting with backoff)."""
        backoff = BACKOFF_S[0]
        while not stop.is_set():
            welcomes = self.welcomes
            try:
                self._session(stop)
            except grpc.RpcError as exc:
                if stop.is_set():
                    break
                self.last_error = str(error_from_rpc(exc, peer=self.config.student))
                if exc.code() == grpc.StatusCode.ALREADY_EXISTS:  # another process of this party is live
                    _log.error(
                        "refused by the student: another process of this party is connected",
                        extra={"error": self.last_error, "in_s": IDENTITY_IN_USE_BACKOFF_S},
                    )
                    stop.wait(IDENTITY_IN_USE_BACKOFF_S)
                    backoff = BACKOFF_S[0]
                    continue
            except CapcError as exc:
                self.last_error = str(exc)
            except ValueError as exc:  # grpc: a channel closed under the stream (shutting down)
                if stop.is_set():
                    break
                self.last_error = str(exc)
            if stop.is_set():
                break
            if self.welcomes > welcomes:  # the student was there: it restarts, so try again soon
                backoff = BACKOFF_S[0]
            _log.warning("work stream ended; reconnecting", extra={"error": self.last_error, "in_s": backoff})
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])

    def close(self) -> None:
        """Cancel the stream and close both channels."""
        if self._call is not None:
            self._call.cancel()
        self._student_channel.close()
        self._guardian_channel.close()
