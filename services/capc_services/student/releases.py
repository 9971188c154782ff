"""The student of a release federation: open each release, collect the teachers' shares, ask the guardian for
its masked noisy total, reveal, learn, and publish the head.

Teacher parties dial in (they have no inbound port): each polls :meth:`ReleaseRounds.next_for` for the
release it has not contributed to yet, sends its seed to the guardian and then its share here
(:meth:`ReleaseRounds.deliver`). The student waits for every teacher party, or after the quorum's vote
deadline for at least ``quorum.min_parties`` of them, then asks the guardian to release exactly those
parties' total — the guardian charges its ledger durably before it answers. Only ``Σ V_p + z`` is ever
reconstructed.

A guardian that cannot be reached, or whose ledger's volume is full or read-only, is waited out: the student
asks again for the same release (capped, jittered backoff) until it answers. The guardian answers a release
it already charged with the same masked total, so a reply lost on the way costs nothing more. A full volume
under the student's own journal is waited out the same way, the revealed total kept in memory meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from capc_common.durable import fsync_dir
from capc_common.errors import (
    InputError,
    IntegrityError,
    ProtocolError,
    StorageError,
    UnavailableError,
)
from capc_common.federation import FederationConfig
from capc_common.federation.releases import ReleaseProtocol
from capc_common.mechanisms import reveal
from capc_common.mechanisms.central import predict_head
from capc_common.mechanisms.release import RING_WIDTH
from capc_common.privacy.analysis import epsilon_at_order
from capc_common.privacy.claims import PLAN_GUARANTEE, PLAN_ODOMETER, accountant
from capc_common.storage import classify
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_from_proto, ndarray_to_proto, rpc
from capc_services.common.errors import error_from_rpc
from capc_services.common.interceptors import FederationClientInterceptor
from capc_services.common.limits import HEADROOM
from capc_services.common.metrics import PartyMetrics
from capc_services.common.retry import Backoff
from capc_services.common.roundtrips import counted
from capc_services.tls import TlsFiles

_log = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S = 1.0
"""How often a waiting round looks at the stop request."""
BACKOFF_S = (0.5, 15.0)
"""First and longest wait before asking the guardian again (or writing the journal again) after a fault."""


@dataclass
class ReleaseProgress:
    """What ``/api/v1/progress`` shows of a release federation."""

    state: str = "waiting for teachers"
    rounds: int = 0
    rounds_done: int = 0
    rdp_spent: float = 0.0
    error: str = ""
    last_parties: list[str] = field(default_factory=list)
    published: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Open:
    release_id: str
    round: int
    state: npt.NDArray[np.float64]
    opened: float
    shares: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    closed: bool = False


class ReleaseRounds:
    """The releases teacher parties poll for and deliver shares to (thread-safe).

    Args:
        config: the federation config.
        length: coordinates of every contribution.
    """

    def __init__(self, config: FederationConfig, *, length: int) -> None:
        self.config = config
        self.length = length
        self._cond = threading.Condition()
        self._open: _Open | None = None
        self._done = False

    def open(self, release_id: str, *, round: int, state: npt.NDArray[np.float64]) -> None:
        """Open the next release for contributions at public ``state``."""
        with self._cond:
            self._open = _Open(release_id=release_id, round=round, state=state, opened=time.monotonic())
            self._cond.notify_all()

    def finish(self) -> None:
        """No more releases: waiting and later polls answer ``done``."""
        with self._cond:
            self._done, self._open = True, None
            self._cond.notify_all()

    def next_for(self, party: str, *, timeout: float) -> pb.ReleaseItem:
        """The open release ``party`` has not contributed to, ``done``, or ``pending`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                current = self._open
                if self._done:
                    return pb.ReleaseItem(done=True)
                if current is not None and not current.closed and party not in current.shares:
                    return pb.ReleaseItem(
                        release_id=current.release_id,
                        round=current.round,
                        # float64 travels as its int64 bit pattern: exact, and the wire takes no floats
                        state=ndarray_to_proto(
                            np.ascontiguousarray(current.state, dtype=np.float64).view(np.int64)
                        ),
                        length=self.length,
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    return pb.ReleaseItem(pending=True)
                self._cond.wait(timeout=left)

    def deliver(self, *, release_id: str, party: str, share: npt.NDArray[np.int64]) -> int:
        """Keep ``party``'s share of the open release; returns how many parties' shares it now holds.

        Raises:
            InputError: not the open release (or it closed), a second share, or a malformed share.
        """
        if share.dtype != np.int64 or share.shape != (self.length,):
            raise InputError(
                f"{party}'s share of release {release_id} is {share.dtype} {share.shape}; expected int64 "
                f"({self.length},)"
            )
        if share.size and (share.min() < 0 or share.max() >= 1 << RING_WIDTH):
            raise InputError(
                f"{party}'s share of release {release_id} has values outside [0, 2^{RING_WIDTH})"
            )
        with self._cond:
            current = self._open
            if current is None or current.release_id != release_id or current.closed:
                raise InputError(
                    f"release {release_id} is not open for shares (open: "
                    f"{current.release_id if current and not current.closed else 'none'}); poll NextRelease"
                )
            if party in current.shares:
                raise InputError(f"{party} already delivered its share of release {release_id}")
            current.shares[party] = share
            self._cond.notify_all()
            return len(current.shares)

    def collect(self, *, stop: threading.Event) -> dict[str, npt.NDArray[np.int64]]:
        """Wait for every teacher party's share, or after the vote deadline for a quorum; close the release.

        Returns:
            The shares by party, in federation order.

        Raises:
            InputError: ``stop`` was set first.
        """
        q = self.config.quorum
        everyone = len(self.config.teachers)
        with self._cond:
            current = self._open
            assert current is not None, "collect() after open()"
            while not stop.is_set():
                have = len(current.shares)
                until_deadline = q.vote_deadline_s - (time.monotonic() - current.opened)
                if have == everyone or (until_deadline <= 0 and have >= q.min_parties):
                    current.closed = True
                    return {p: current.shares[p] for p in self.config.teacher_names if p in current.shares}
                self._cond.wait(timeout=min(POLL_S, max(until_deadline, 0.0)) or POLL_S)
        raise InputError(f"release {current.release_id} was not collected: the student is stopping")


class ReleaseJournal:
    """The revealed totals, each durable before the student uses it: a restarted student replays them instead
    of paying for them again (what was paid for is never lost; a crash between the guardian's charge and this
    write loses that one total — an over-count, never an under-count).

    Args:
        directory: the student's state directory; the journal lives in ``releases-<config hash>`` below it,
            so another federation config never replays these totals.
        config_hash: the federation's config hash.
        length: coordinates of every total.
    """

    def __init__(self, directory: Path, *, config_hash: str, length: int) -> None:
        self.directory = directory / f"releases-{config_hash[:16]}"
        self.length = length

    def totals(self) -> list[npt.NDArray[np.int64]]:
        """The journaled totals in release order.

        Raises:
            IntegrityError: a gap in the rounds or a total of the wrong shape (restore or remove the journal).
        """
        files = sorted(self.directory.glob("*.npy")) if self.directory.is_dir() else []
        totals = []
        for expected, path in enumerate(files):
            total = np.load(path)
            if path.stem != f"{expected:06d}" or total.shape != (self.length,) or total.dtype != np.int64:
                raise IntegrityError(
                    f"release journal {self.directory} is damaged at {path.name} (round {expected} expected, "
                    f"{self.length} int64 values); restore it from a backup"
                )
            totals.append(total)
        return totals

    def append(self, round: int, total: npt.NDArray[np.int64]) -> None:
        """Write one round's total durably (temporary file, fsync, rename, fsync of the directory).

        Raises:
            StorageError: the volume is full or read-only; nothing was written (no half-written file is left).
        """
        path = self.directory / f"{round:06d}.npy"
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as handle:
                np.save(handle, total)
                handle.flush()
                os.fsync(handle.fileno())
            tmp.replace(path)
            fsync_dir(self.directory)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise classify(exc, path=path, what="release journal", needed=total.nbytes + 4096) from None


class ReleaseClient:
    """The student's link to the guardian for releases (mTLS, the federation hash on every call)."""

    def __init__(
        self,
        *,
        config: FederationConfig,
        tls: TlsFiles,
        address: str,
        length: int,
        metrics: PartyMetrics | None = None,
    ) -> None:
        self._peer = config.guardian
        limit = length * 8 + HEADROOM
        self._channel = tls.channel(
            address,
            peer=self._peer,
            interceptors=(
                FederationClientInterceptor.dialling(config, tls=tls, peer=self._peer),
                *counted(metrics, peer="guardian"),
            ),
            receive=limit,
            send=HEADROOM,
        )
        self._stub = rpc.GuardianServiceStub(self._channel)

    def release(
        self, release_id: str, parties: list[str], *, timeout: float = 300.0
    ) -> tuple[npt.NDArray[np.int64], float]:
        """The guardian's masked noisy total of ``parties``' contributions and the RDP it charged.

        Raises:
            CapcError: the guardian refused (budget, replay, missing seeds) or could not be reached.
        """
        try:
            reply = self._stub.Release(
                pb.ReleaseRequest(release_id=release_id, parties=parties), timeout=timeout
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, peer=self._peer) from None
        return np.asarray(ndarray_from_proto(reply.masked), dtype=np.int64), float(reply.charged_rdp)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def _waiting_out(
    attempt: Callable[[], T], *, what: str, progress: ReleaseProgress, stop: threading.Event
) -> T:
    """``attempt()``, again after each fault that passes — an unreachable guardian or a full or read-only
    volume — until it succeeds or ``stop`` is set (the state says what it waits for meanwhile).

    Raises:
        InputError: ``stop`` was set while waiting.
        CapcError: any other failure (a refusal is not waited out).
    """
    backoff, state = Backoff(*BACKOFF_S), progress.state
    while True:
        try:
            result = attempt()
        except (UnavailableError, StorageError) as exc:
            progress.state, progress.error = f"waiting: {what}", str(exc)
            wait = backoff.next()
            _log.warning("waiting to try again", extra={"what": what, "error": str(exc), "in_s": wait})
            if stop.wait(wait):
                raise InputError(f"{what}: not done, the student is stopping ({exc})") from None
            continue
        progress.state, progress.error = state, ""
        return result


def run_releases(
    *,
    protocol: ReleaseProtocol,
    rounds: ReleaseRounds,
    guardian: ReleaseClient,
    journal: ReleaseJournal,
    order: float,
    progress: ReleaseProgress,
    stop: threading.Event,
) -> None:
    """Every planned release not in the journal, one after another: open, collect, release, reveal, journal,
    learn. Journaled totals are replayed first (no new release, no new charge).

    Raises:
        CapcError: the guardian refused a release (e.g. the budget is exhausted) or a total was malformed.
        InputError: ``stop`` was set.
    """
    prefix = secrets.token_hex(6)  # fresh ids after a restart: the ledger never answers one id twice
    progress.rounds = protocol.rounds
    done = journal.totals()[: protocol.rounds]
    for total in done:
        protocol.absorb(total)
    progress.rounds_done, progress.rdp_spent = len(done), len(done) * protocol.release_rdp(order)
    for t in range(len(done), protocol.rounds):
        release_id = f"release-{prefix}-{t}"
        rounds.open(release_id, round=t, state=protocol.state())
        progress.state = f"collecting release {t + 1} of {protocol.rounds}"
        shares = rounds.collect(stop=stop)
        masked, charged = _waiting_out(
            partial(guardian.release, release_id, list(shares)),
            what=f"release {t + 1} from the guardian",
            progress=progress,
            stop=stop,
        )
        if masked.shape != (rounds.length,):
            raise ProtocolError(f"guardian sent a total of shape {masked.shape}; expected ({rounds.length},)")
        total = reveal(list(shares.values()), masked)
        _waiting_out(
            partial(journal.append, t, total), what=f"release {t + 1} journaled", progress=progress, stop=stop
        )
        protocol.absorb(total)
        progress.rounds_done, progress.rdp_spent = t + 1, progress.rdp_spent + charged
        progress.last_parties = list(shares)
        _log.info("released", extra={"release_id": release_id, "parties": list(shares), "rdp": charged})
    rounds.finish()


def release_privacy(
    config: FederationConfig, protocol: ReleaseProtocol, progress: ReleaseProgress
) -> dict[str, Any]:
    """The guarantee ``epsilon`` (every planned release's charge: the rounds are fixed before any data is
    touched, :func:`~capc_common.federation.releases.protocol_for` checks they fit the budget) and the
    releases charged so far, ``epsilon_spent``, at the federation's order and δ."""
    b = config.budget

    def epsilon(rdp: float) -> float:
        return max(0.0, float(epsilon_at_order(b.order, rdp, delta=b.delta))) if rdp > 0 else 0.0

    planned = protocol.rounds * protocol.release_rdp(b.order)
    return {
        "epsilon": epsilon(planned),
        "epsilon_note": PLAN_GUARANTEE,
        "epsilon_spent": epsilon(progress.rdp_spent),
        "epsilon_spent_note": PLAN_ODOMETER,
        "epsilon_limit": b.epsilon,
        "delta": b.delta,
        "order": b.order,
        "rdp_planned": planned,
        "rdp_spent": progress.rdp_spent,
        "releases_planned": protocol.rounds,
        "releases": progress.rounds_done,
        "accountant": accountant(protocol.mechanism),
    }


def publish_release(
    *,
    config: FederationConfig,
    protocol: ReleaseProtocol,
    progress: ReleaseProgress,
    output_dir: Path,
    evaluate: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], str] | None,
) -> dict[str, Any]:
    """Write ``head.npy`` (the linear head over normalised per-example features) and ``model_card.json``.

    Args:
        config: the federation config.
        protocol: the protocol after its last release.
        progress: what was released (its RDP goes into the card's ``epsilon_spent``).
        output_dir: where to write.
        evaluate: held-out per-example features, labels and their name, or None.
    """
    head = protocol.head()
    privacy = release_privacy(config, protocol, progress)
    evaluation: dict[str, Any] = {}
    if evaluate is not None:
        features, truth, name = evaluate
        evaluation = {
            "dataset": name,
            "examples": len(truth),
            "accuracy": float((predict_head(head, features) == truth).mean()),
            "bn_mode": "running",
        }
    card = {
        "model": "linear head over L2-normalised per-example backbone features (DIET-CaPC release)",
        "federation": config.name,
        "config_hash": config.config_hash(),
        "mechanism": protocol.mechanism.params(),
        "privacy": {
            **privacy,
            "delta_sampler": protocol.sampler_delta(epsilon=privacy["epsilon"]),
            "noise": "seeded: INSECURE, NOT private" if config.insecure_noise else "CSPRNG",
        },
        "backbone": {"name": config.backbone.name, "sha256": config.backbone.sha256},
        "bn": {"mode": "running"},
        "parties": {
            "guardian": config.guardian,
            "student": config.student,
            "teachers": progress.last_parties,
        },
        "evaluation": evaluation,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    model_path, card_path = output_dir / "head.npy", output_dir / "model_card.json"
    for path, write in (
        (model_path, lambda f: np.save(f, head)),
        (card_path, lambda f: f.write(json.dumps(card, indent=2).encode())),
    ):
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as handle:
            write(handle)
        tmp.replace(path)
    return {
        "model": str(model_path),
        "model_card": str(card_path),
        "epsilon": privacy["epsilon"],
        "epsilon_spent": privacy["epsilon_spent"],
        "releases": progress.rounds_done,
        "accuracy": evaluation.get("accuracy"),
    }
