"""A teacher party of a release federation: poll the student for the next release, contribute, share.

Per release the party computes its integer contribution from its own per-example features at the public state
the student sent (:meth:`~capc_common.federation.releases.ReleaseProtocol.contribute`: its per-class sums and
counts, or its clipped gradient sum over a fresh Poisson sample), splits it with a fresh seed, and sends the
seed to the guardian and the masked share to the student at the same time: the guardian waits for the seeds
of the parties the student names, so the share need not wait for the seed's acknowledgement (one round trip
less per release). Neither sees the contribution — the share is uniformly masked without the seed, and the
guardian sends nothing derived from the seed before the release is charged; the party listens on no port (it
dials both).
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import Any, NamedTuple

import grpc
import numpy as np
import numpy.typing as npt

from capc_common.errors import CapcError, InputError, UnavailableError
from capc_common.federation import FederationConfig
from capc_common.federation.releases import ReleaseProtocol
from capc_common.mechanisms import share_contribution
from capc_common.privacy import NoiseSource
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_from_proto, ndarray_to_proto, rpc
from capc_services.common.background import Background
from capc_services.common.errors import error_from_rpc
from capc_services.common.interceptors import FederationClientInterceptor
from capc_services.common.limits import HEADROOM
from capc_services.common.metrics import PartyMetrics
from capc_services.common.retry import Backoff
from capc_services.common.roundtrips import counted
from capc_services.teacher.cap import LocalCap
from capc_services.tls import TlsFiles

_log = logging.getLogger(__name__)
POLL_TIMEOUT_S = 5.0
"""Deadline of one NextRelease call: the student holds it until a release opens for the party, at most a
second less than this, then answers ``pending``. Short because a party asked to stop ends once its call
returns (the interceptor that checks the student's reply waits for it, so the call is not cancelled from
outside): 5 s bounds a stop well within ``capc local down``'s grace, where the student's own 30 s hold took
longer and got the party killed. An idle party polls every 4 s; a waiting poll is answered the moment a
release opens, so the release path gains nothing."""
KEPT_RELEASES = 4
"""Seeds and shares kept for re-offers (the student offers one release at a time; a few cover its retries)."""
DONE_POLL_S = 5.0
"""How often a party polls once the student said every release is done (a restarted student may open more)."""
BACKOFF_S = (0.5, 1.0)
"""First and longest wait between two failed polls (doubling in between; back to the first after a poll that
went through): a restarted student is polled again within about a second."""


class _Prepared(NamedTuple):
    """One release's contribution as it left: the round it was computed for, its seed and its masked share."""

    round: int
    seed: bytes
    share: npt.NDArray[np.int64]


class ReleaseContributor:
    """Keeps the party contributing to every release the student opens.

    Args:
        config: the federation config.
        party: this party's name (its certificate CN).
        tls: its TLS files.
        student_address / guardian_address: ``host:port`` of the student and the guardian.
        protocol: the federation's release protocol.
        features: the party's per-example features ``(n, dim)`` (running statistics).
        labels: their labels ``(n,)``.
        source: the party's own sampling randomness (a CSPRNG outside tests).
        cap: the party's own ε cap record; each release is charged on it before anything leaves.
        metrics: where its round trips are counted (None: not counted).
        consume: ``features`` are handed over: the protocol may overwrite them while it prepares them.
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        party: str,
        tls: TlsFiles,
        student_address: str,
        guardian_address: str,
        protocol: ReleaseProtocol,
        features: npt.ArrayLike,
        labels: npt.NDArray[np.int64],
        source: NoiseSource,
        cap: LocalCap,
        metrics: PartyMetrics | None = None,
        consume: bool = False,
    ) -> None:
        self.config, self.party, self.protocol, self.cap = config, party, protocol, cap
        # The protocol's per-record map (secagg-dpsgd: the public basis) runs once, not every release.
        self._features = protocol.prepare(features, consume=consume)
        self._labels, self._source = labels, source
        message = protocol.length * 8 + HEADROOM
        self._student_channel = tls.channel(
            student_address,
            peer=config.student,
            interceptors=(
                FederationClientInterceptor.dialling(config, tls=tls, peer=config.student),
                *counted(metrics, peer="student"),
            ),
            receive=message,
            send=message,
        )
        self._guardian_channel = tls.channel(
            guardian_address,
            peer=config.guardian,
            interceptors=(
                FederationClientInterceptor.dialling(config, tls=tls, peer=config.guardian),
                *counted(metrics, peer="guardian"),
            ),
            receive=HEADROOM,
            send=HEADROOM,
        )
        self._student = rpc.StudentServiceStub(self._student_channel)
        self._guardian = rpc.GuardianServiceStub(self._guardian_channel)
        self.connected = False
        self.done = False
        self.contributed = 0
        self.last_error = ""
        self._prepared: dict[str, _Prepared] = {}

    def contribute(self, item: pb.ReleaseItem, *, stop: threading.Event | None = None) -> None:
        """Compute, split and send this party's contribution to one release (seed and share at once).

        The item is checked and the contribution computed before the party's cap is charged, so a malformed
        offer costs nothing. Each release id is charged once: a re-offer of the same release (the guardian
        or the student was unreachable, or refused the share) re-sends the *same* seed and share, which
        reveals nothing new, instead of a fresh sample charged again. A restarted party, which kept no
        shares, charges a re-offered release once more (an over-count, never an under-count), and so does a
        round the student starts again under a fresh attempt (the seeds of the first never all reached the
        guardian). A seed that fails on a broken link while the share went through is sent again (the same
        bytes) until the guardian takes it or the quorum's share deadline, after which the guardian no longer
        waits for it, has passed: the student, holding the share, is not going to offer the release again.

        A release id is bound to the round it was first offered for, and its seed names that round to the
        guardian. A re-offer of a kept release for another round is refused — nothing sent, nothing charged:
        re-sending the same seed would let the guardian decode the same sample in a second round for one
        charge here, and a fresh sample under the same id is no use to an honest student (its attempt ids
        are fresh per round and per attempt) while the guardian refuses a second seed for an attempt it
        still holds. Only a student that is broken or hostile re-offers so; the refusal says what it did.

        Raises:
            InputError: the item's length or state does not match the federation's mechanism, or it re-offers
                a release this party contributed to for another round.
            BudgetExhaustedError: the release would cross this party's own ε cap (nothing was sent).
            CapcError: the guardian or the student refused, or could not be reached.
        """
        prepared = self._prepared.get(item.release_id)
        if prepared is None:
            prepared = self._prepare(item)
        elif prepared.round != item.round:
            raise InputError(
                f"the student re-offered release {item.release_id}, which this party contributed to for "
                f"round {prepared.round}, as round {item.round}: a release belongs to one round (sending its "
                "seed again would let its sample be released twice for one charge); nothing was sent or "
                "charged"
            )
        _, seed, share = prepared
        request = pb.SubmitContributionRequest(
            release_id=item.release_id, round=prepared.round, party=self.party, seed=seed, length=item.length
        )
        delivery = pb.ContributionShare(
            release_id=item.release_id, party=self.party, share=ndarray_to_proto(share)
        )
        sending = Background(partial(self._seed, request), name=f"{self.party}-seed")
        try:
            self._student.SubmitContributionShare(delivery, timeout=60)
        except grpc.RpcError as exc:  # offered again, both go again (the same bytes; the guardian keeps one)
            raise error_from_rpc(exc, peer=self.config.student) from None
        self._seed_through(sending, request, stop=stop or threading.Event())
        self.contributed += 1
        _log.info("contributed", extra={"release_id": item.release_id, "round": item.round})

    def _seed(self, request: pb.SubmitContributionRequest) -> None:
        """Send one seed to the guardian.

        Raises:
            CapcError: the guardian refused it or could not be reached.
        """
        try:
            self._guardian.SubmitContribution(request, timeout=60)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, peer=self.config.guardian) from None

    def _seed_through(
        self, sending: Background[None], request: pb.SubmitContributionRequest, *, stop: threading.Event
    ) -> None:
        """Wait for the seed's call, sending it again after a broken link until the share deadline has passed.

        Raises:
            CapcError: the guardian refused the seed, or could not be reached before the deadline.
        """
        deadline, backoff = time.monotonic() + self.config.quorum.share_deadline_s, Backoff(*BACKOFF_S)
        while True:
            try:
                sending.result()
                return
            except UnavailableError as error:
                wait = backoff.next()
                if time.monotonic() + wait > deadline:
                    raise
                _log.warning("seed not through; sending it again", extra={"error": str(error), "in_s": wait})
                if stop.wait(wait):
                    raise
            sending = Background(partial(self._seed, request), name=f"{self.party}-seed")

    def _prepare(self, item: pb.ReleaseItem) -> _Prepared:
        """Check the offer, compute and split the contribution, then charge the cap (durable before anything
        leaves) and keep the round, seed and share for re-offers of this release."""
        if item.length != self.protocol.length:
            raise InputError(
                f"release {item.release_id} asks for {item.length} coordinates; federation.yaml's "
                f"{self.protocol.mechanism.name} has {self.protocol.length}"
            )
        bits = ndarray_from_proto(item.state)
        if bits.dtype != np.int64:
            raise InputError(f"release {item.release_id} state is {bits.dtype}; float64 bits travel as int64")
        state = bits.view(np.float64)
        if not np.isfinite(state).all():
            raise InputError(f"release {item.release_id} state holds inf or NaN; refusing to contribute")
        vector = self.protocol.contribute(state, self._features, self._labels, self._source)
        seed, share = share_contribution(vector)
        self.cap.charge(batch_id=item.release_id, attempt=item.round, count=1)
        prepared = self._prepared[item.release_id] = _Prepared(item.round, seed, share)
        while len(self._prepared) > KEPT_RELEASES:
            del self._prepared[next(iter(self._prepared))]
        return prepared

    def run(self, stop: threading.Event) -> None:
        """Poll and contribute until ``stop`` is set (backing off while the student is away or a
        contribution fails; the backoff resets only after a poll that needed nothing or a contribution
        that went through)."""
        backoff = BACKOFF_S[0]
        while not stop.is_set():
            try:
                item = self._student.NextRelease(
                    pb.NextReleaseRequest(party=self.party), timeout=POLL_TIMEOUT_S
                )
                self.connected, self.done = True, item.done
                if item.done:
                    stop.wait(DONE_POLL_S)
                elif not item.pending:
                    self.contribute(item, stop=stop)
                self.last_error, backoff = "", BACKOFF_S[0]
                continue
            except grpc.RpcError as exc:
                self.connected = False
                self.last_error = str(error_from_rpc(exc, peer=self.config.student))
            except CapcError as exc:
                self.last_error = str(exc)
            _log.warning("release poll failed; retrying", extra={"error": self.last_error, "in_s": backoff})
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])

    def status(self) -> dict[str, Any]:
        """For ``/api/v1/status``."""
        return {
            "party": self.party,
            "mechanism": self.protocol.mechanism.name,
            "connected_to_student": self.connected,
            "releases_contributed": self.contributed,
            "done": self.done,
            "last_error": self.last_error,
            "records": len(self._labels),
            "local_cap": {"epsilon_spent": self.cap.epsilon, "epsilon_cap": self.cap.cap},
        }

    def close(self) -> None:
        """Close both channels."""
        self._student_channel.close()
        self._guardian_channel.close()
