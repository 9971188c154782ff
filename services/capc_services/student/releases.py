"""The student of a release federation: open each round, collect the teachers' shares, add its part of the
noise, ask the guardian for its masked part of the total, reveal, deposit, learn, and publish the head.

Teacher parties dial in (they have no inbound port): each polls :meth:`ReleaseRounds.next_for` for the
release it has not contributed to yet, sends its seed to the guardian and, at the same time, its share here
(:meth:`ReleaseRounds.deliver`). The student waits for every teacher party, or after the quorum's vote
deadline for at least ``quorum.min_parties`` of them, keeps its half (those shares plus its own part of the
noise, :func:`~capc_common.mechanisms.release.student_half`) durably, then asks the guardian to release
round ``t`` over exactly those parties — the guardian waits (up to the share deadline) for their seeds, and
charges its ledger durably before it answers; a party whose seed never came is left out of the next ask. Only
``Σ V_p + z_g + z_s`` is ever reconstructed.

**Rounds, not attempts.** The guardian charges each round of the plan once and answers a round charged before
with the same bytes (its receipt). The student journals each round's total, and deposits it with the guardian;
a restarted student replays its journal, and one restarted *without* it resumes from the guardian's record:
a deposited total is fetched, a round charged but not deposited is revealed again from the half the student
kept for that attempt. Only a round whose half is gone too (a lost state directory between the charge and
the deposit) is lost: a training run goes on without it (its charge stands), a one-release plan cannot
publish. The model card's privacy figures are the guardian's ledger's (:func:`release_privacy`).

A guardian that cannot be reached, or whose ledger's volume is full or read-only, is waited out, and so is a
full or read-only volume under the student's own journal: the student asks again (capped, jittered backoff)
until the call goes through, keeping what it holds in memory meanwhile. Every call it repeats is idempotent:
the guardian answers a round it charged with the same bytes, and keeps one deposit per round.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
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
    PreconditionError,
    ProtocolError,
    StorageError,
    UnavailableError,
)
from capc_common.federation import FederationConfig
from capc_common.federation.releases import ReleaseProtocol, planned_figures
from capc_common.mechanisms import reveal
from capc_common.mechanisms.central import predict_head
from capc_common.mechanisms.release import RING_WIDTH, student_half
from capc_common.privacy import NoiseSource
from capc_common.privacy.claims import PLAN_GUARANTEE, PLAN_ODOMETER, accountant
from capc_common.storage import classify
from capc_common.wire import messages as pb
from capc_common.wire import (
    ndarray_from_proto,
    ndarray_to_proto,
    release_ledger_from_proto,
    rpc,
)
from capc_services.common.background import Background
from capc_services.common.errors import MISSING_SEEDS_KEY, error_from_rpc, trailing
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
    """What ``/api/v1/progress`` shows of a release federation.

    Attributes:
        ledger: the plan's figures as the guardian's ledger last reported them (empty before it answered).
        lost: rounds charged whose total is lost (see the module doc).
    """

    state: str = "waiting for teachers"
    rounds: int = 0
    rounds_done: int = 0
    rdp_spent: float = 0.0
    error: str = ""
    last_parties: list[str] = field(default_factory=list)
    published: dict[str, Any] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)


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
    """The student's durable record of each round: the half it kept before asking for the release (its shares
    plus its part of the noise: uniformly masked alone) and the total it revealed, each written durably
    before it is used, under the attempt that was charged. A restarted student replays its totals instead of
    paying again, and reveals a round charged before its total was written from that attempt's half.

    Args:
        directory: the student's state directory; the journal lives in ``releases-<config hash>`` below it,
            so another federation config never replays these totals.
        config_hash: the federation's config hash.
        length: coordinates of every total.
    """

    def __init__(self, directory: Path, *, config_hash: str, length: int) -> None:
        self.directory = directory / f"releases-{config_hash[:16]}"
        self.length = length

    def total(self, round: int) -> tuple[str, npt.NDArray[np.int64]] | None:
        """``(attempt, total)`` journaled for ``round``, or None.

        Raises:
            IntegrityError: a damaged file, or two totals for one round (restore or remove the journal).
        """
        found = sorted(self.directory.glob(f"{round:06d}.*.total.npy")) if self.directory.is_dir() else []
        if not found:
            return None
        if len(found) > 1:
            raise IntegrityError(
                f"release journal {self.directory} holds {len(found)} totals of round {round}; restore it "
                "from a backup"
            )
        return found[0].name.split(".")[1], self._load(found[0])

    def half(self, round: int, attempt: str, parties: Sequence[str]) -> npt.NDArray[np.int64] | None:
        """The half kept for ``attempt`` of ``round`` over ``parties``, or None."""
        path = self._half_path(round, attempt, parties)
        return self._load(path) if path.is_file() else None

    def append(self, round: int, attempt: str, total: npt.NDArray[np.int64]) -> None:
        """Write one round's total durably, then drop that round's halves (no longer needed).

        Raises:
            StorageError: the volume is full, read-only or failing (:meth:`_write`); writing the same total
                again later is harmless.
        """
        path = self._write(self.directory / f"{round:06d}.{attempt}.total.npy", total)
        try:
            for half in self.directory.glob(f"{round:06d}.*.half.npy"):
                half.unlink()
        except OSError as exc:
            raise classify(exc, path=path, what="release journal") from None

    def keep_half(
        self, round: int, attempt: str, parties: Sequence[str], half: npt.NDArray[np.int64]
    ) -> None:
        """Write one attempt's half over ``parties`` durably, before the guardian is asked to release it. An
        attempt may keep a half for each set of parties it asks for (one whose seed never reached the guardian
        is left out of the next): the guardian's receipt names the set it charged, and so the half.

        Raises:
            StorageError: the volume is full, read-only or failing; nothing was written (:meth:`_write`).
        """
        self._write(self._half_path(round, attempt, parties), half)

    def _half_path(self, round: int, attempt: str, parties: Sequence[str]) -> Path:
        named = hashlib.sha256(",".join(parties).encode()).hexdigest()[:16]
        return self.directory / f"{round:06d}.{attempt}.{named}.half.npy"

    def _load(self, path: Path) -> npt.NDArray[np.int64]:
        try:
            value = np.load(path)
        except (OSError, ValueError) as exc:
            raise IntegrityError(
                f"release journal file {path} is damaged ({exc}); restore it from a backup"
            ) from None
        if value.shape != (self.length,) or value.dtype != np.int64:
            raise IntegrityError(
                f"release journal file {path} holds {value.dtype} {value.shape}, not {self.length} int64 "
                "values; restore it from a backup"
            )
        return value

    def _write(self, path: Path, value: npt.NDArray[np.int64]) -> Path:
        """Temporary file, fsync, rename, fsync of the directory; returns ``path``.

        Raises:
            StorageError: the volume is full, read-only or failing; nothing was written (no half-written file
                is left).
        """
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as handle:
                np.save(handle, value)
                handle.flush()
                os.fsync(handle.fileno())
            tmp.replace(path)
            fsync_dir(self.directory)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise classify(exc, path=path, what="release journal", needed=value.nbytes + 4096) from None
        return path


@dataclass(frozen=True)
class RoundRecord:
    """Where a round stands on the guardian's ledger (``ReleaseRecord``).

    Attributes:
        state: ``open`` (not charged), ``charged`` or ``deposited``.
        release_id: the attempt it was charged under (empty when open).
        total: the deposited total, if deposited.
        ledger: the plan's figures as the ledger records them.
    """

    state: str
    release_id: str
    total: npt.NDArray[np.int64] | None
    ledger: dict[str, Any]


@dataclass(frozen=True)
class GuardianRelease:
    """The guardian's answer to ``Release``: its masked part of the total, the attempt and parties it was
    charged under, whether it was charged before (``replayed``), what it charged, and the ledger's figures."""

    masked: npt.NDArray[np.int64]
    release_id: str
    parties: list[str]
    replayed: bool
    charged_rdp: float
    ledger: dict[str, Any]


class SeedsMissingError(PreconditionError):
    """The guardian waited the share deadline for seeds that some named parties never sent; nothing was
    charged.

    Attributes:
        parties: those parties.
    """

    def __init__(self, message: str, *, parties: Sequence[str]) -> None:
        super().__init__(message)
        self.parties = tuple(parties)


_ATTEMPT = re.compile(r"[A-Za-z0-9_-]{1,128}")
_ROUND_STATES = {
    pb.ReleaseRoundState.RELEASE_ROUND_STATE_OPEN: "open",
    pb.ReleaseRoundState.RELEASE_ROUND_STATE_CHARGED: "charged",
    pb.ReleaseRoundState.RELEASE_ROUND_STATE_DEPOSITED: "deposited",
}


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
        self._length = length
        limit = length * 8 + HEADROOM
        self._channel = tls.channel(
            address,
            peer=self._peer,
            interceptors=(
                FederationClientInterceptor.dialling(config, tls=tls, peer=self._peer),
                *counted(metrics, peer="guardian"),
            ),
            receive=limit,
            send=limit,  # a deposited total
        )
        self._stub = rpc.GuardianServiceStub(self._channel)

    def _call(self, method: Any, request: Any, timeout: float) -> Any:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, peer=self._peer) from None

    def _array(self, message: pb.NdArray, what: str) -> npt.NDArray[np.int64]:
        array = np.asarray(ndarray_from_proto(message))
        if array.dtype != np.int64 or array.shape != (self._length,):
            raise ProtocolError(f"guardian sent {what} of {array.dtype} {array.shape}; expected int64 "
                                f"({self._length},)")  # fmt: skip
        return array

    @staticmethod
    def _attempt(release_id: str) -> str:
        """An attempt id from the guardian, checked before it names a journal file.

        Raises:
            ProtocolError: not one of the student's own ids (letters, digits, ``-``, ``_``; at most 128).
        """
        if not _ATTEMPT.fullmatch(release_id):
            raise ProtocolError(
                f"guardian named attempt {release_id[:140]!r}; attempts are the student's own ids"
            )
        return release_id

    def release(
        self, release_id: str, round: int, parties: list[str], *, timeout: float = 300.0
    ) -> GuardianRelease:
        """Round ``round``: the guardian's masked part of the total of attempt ``release_id`` over
        ``parties``, or the receipt of the attempt the round was charged under before.

        Raises:
            SeedsMissingError: some parties' seeds never reached the guardian (nothing charged).
            CapcError: the guardian refused (budget, beyond the plan) or could not be reached.
            ProtocolError: a malformed answer.
        """
        request = pb.ReleaseRequest(release_id=release_id, round=round, parties=parties)
        try:
            reply = self._stub.Release(request, timeout=timeout)
        except grpc.RpcError as exc:
            error = error_from_rpc(exc, peer=self._peer)
            missing = trailing(exc, MISSING_SEEDS_KEY)
            if missing and isinstance(error, PreconditionError):
                raise SeedsMissingError(str(error), parties=missing.split(",")) from None
            raise error from None
        return GuardianRelease(
            masked=self._array(reply.masked, "a masked total"),
            release_id=self._attempt(reply.release_id),
            parties=list(reply.parties),
            replayed=reply.replayed,
            charged_rdp=float(reply.charged_rdp),
            ledger=release_ledger_from_proto(reply.ledger),
        )

    def deposit(
        self, round: int, release_id: str, total: npt.NDArray[np.int64], *, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Keep round ``round``'s revealed total with the guardian's ledger; returns the plan's figures."""
        request = pb.DepositReleaseRequest(round=round, release_id=release_id, total=ndarray_to_proto(total))
        return release_ledger_from_proto(self._call(self._stub.DepositRelease, request, timeout))

    def record(self, round: int, *, timeout: float = 60.0) -> RoundRecord:
        """Where round ``round`` stands on the guardian's ledger."""
        reply = self._call(self._stub.ReleaseRecord, pb.ReleaseRecordRequest(round=round), timeout)
        state = _ROUND_STATES.get(reply.state)
        if state is None:
            raise ProtocolError(
                f"guardian sent round state {reply.state}; expected open, charged or deposited"
            )
        total = self._array(reply.total, "a deposited total") if state == "deposited" else None
        attempt = self._attempt(reply.release_id) if state != "open" else ""
        return RoundRecord(state, attempt, total, release_ledger_from_proto(reply.ledger))

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def _waiting_out(
    attempt: Callable[[], T], *, what: str, progress: ReleaseProgress, stop: threading.Event
) -> T:
    """``attempt()``, again after each fault that passes — an unreachable guardian (state ``waiting for the
    guardian``) or a full or read-only volume (``waiting for storage``, as the selection student says) — until
    it succeeds or ``stop`` is set; ``error`` names ``what`` and the fault meanwhile.

    Raises:
        InputError: ``stop`` was set while waiting.
        CapcError: any other failure (a refusal is not waited out).
    """
    backoff, state = Backoff(*BACKOFF_S), progress.state
    while True:
        try:
            result = attempt()
        except (UnavailableError, StorageError) as exc:
            waiting = "waiting for storage" if isinstance(exc, StorageError) else "waiting for the guardian"
            progress.state, progress.error = waiting, f"{what}: {exc}"
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
    noise: NoiseSource,
    progress: ReleaseProgress,
    stop: threading.Event,
) -> None:
    """Every round of the plan, in order (:class:`RoundRunner`).

    Args:
        noise: the student's own source of its part of each release's noise.

    Raises:
        CapcError: the guardian refused a release (e.g. the budget is exhausted) or a total was malformed.
        IntegrityError: the only release of a one-release plan is lost.
        InputError: ``stop`` was set.
    """
    RoundRunner(protocol, rounds, guardian, journal, noise, progress, stop).run()


@dataclass
class RoundRunner:
    """The student's loop over the plan's rounds: each round's total from the journal, from the guardian's
    record, or from a new release; then deposited with the guardian and learnt. A round whose total is lost
    (module doc) is skipped.

    Per new round the critical path is two round trips: the teachers' waiting polls answered and their shares
    in (their seeds go to the guardian at the same time), then ``Release``. The guardian's record is asked
    only while resuming — until the first round found open, since rounds are charged in order by the one
    student — and a round's deposit goes out in the background, acknowledged before the next charge, so at
    most one charged round is ever not deposited (as when it was deposited in line).
    """

    protocol: ReleaseProtocol
    rounds: ReleaseRounds
    guardian: ReleaseClient
    journal: ReleaseJournal
    noise: NoiseSource
    progress: ReleaseProgress
    stop: threading.Event
    #: Fresh attempt ids after a restart: the guardian keeps seeds by attempt.
    prefix: str = field(default_factory=lambda: secrets.token_hex(6))
    #: Until a round is found open on the guardian's ledger, each round's record is asked first.
    resuming: bool = True
    _deposit: Background[dict[str, Any]] | None = None

    def run(self) -> None:
        """Every round, then the ledger's final figures into ``progress.ledger``; ``done`` to the teachers.

        Raises:
            IntegrityError: the only release of a one-release plan is lost.
        """
        protocol, progress = self.protocol, self.progress
        progress.rounds = protocol.rounds
        for t in range(protocol.rounds):
            found = self.journal.total(t) or self._obtain(t)
            if found is None:
                if protocol.rounds == 1:
                    raise IntegrityError(
                        "the plan's only release was charged but its total is lost: the student lost its "
                        "state directory after the guardian charged it and before the total was deposited. "
                        "Nothing can be published without another release, which the plan does not allow; "
                        "restore the student's state directory from a backup"
                    )
                _log.warning(
                    "release round lost: its charge stands, training goes on without it", extra={"round": t}
                )
                progress.lost.append(t)
                progress.rounds_done = t + 1
                continue
            attempt, total = found
            self._deposited()  # the previous round's deposit, before this one's goes out
            self._deposit = Background(
                partial(
                    self._waited,
                    partial(self.guardian.deposit, t, attempt, total),
                    what=f"release {t + 1} deposited",
                ),
                name="release-deposit",
            )
            protocol.absorb(total)
            progress.rounds_done = t + 1
        self._deposited()
        progress.ledger = self._waited(partial(self.guardian.record, 0), what="the ledger's figures").ledger
        self.rounds.finish()

    def _deposited(self) -> None:
        """Wait for the deposit in flight (if any) and take the ledger's figures from its answer.

        Raises:
            CapcError: the deposit was refused (or the student is stopping).
        """
        if self._deposit is None:
            return
        figures, self._deposit = self._deposit.result(), None
        self.progress.ledger, self.progress.rdp_spent = figures, figures["rdp_spent"]

    def _obtain(self, t: int) -> tuple[str, npt.NDArray[np.int64]] | None:
        """Round ``t``'s ``(attempt, total)`` when the journal lacks it: while resuming, the guardian's
        deposited total or the total of the charged attempt revealed again from its kept half; else (the
        round open) a new release. None when the round was charged and neither its total nor its half
        survives. Journals what it finds."""
        if self.resuming:
            record = self._waited(partial(self.guardian.record, t), what=f"release {t + 1}'s record")
            if record.state == "deposited":
                assert record.total is not None
                self._journaled(t, record.release_id, record.total)
                return record.release_id, record.total
            if record.state == "charged":
                return self._reveal(t, record.release_id, parties=[])
            self.resuming = False  # this round is open, and so is every later one until this student asks
        return self._new_release(t)

    def _new_release(self, t: int) -> tuple[str, npt.NDArray[np.int64]] | None:
        """Round ``t`` released now: open it, collect the shares, keep the half and ask the guardian. A party
        whose seed never reached the guardian is left out (a new half without its share); with fewer than
        the quorum left the round starts again under a fresh attempt."""
        quorum, again = self.rounds.config.quorum.min_parties, 0
        while True:
            attempt = f"release-{self.prefix}-{t}" + (f"-{again}" if again else "")
            again += 1
            self.rounds.open(attempt, round=t, state=self.protocol.state())
            self.progress.state = f"collecting release {t + 1} of {self.protocol.rounds}"
            shares = self.rounds.collect(stop=self.stop)
            noise = self.protocol.mechanism.noise_part(self.noise)
            parties = list(shares)
            while len(parties) >= quorum:
                half = student_half([shares[p] for p in parties], noise=noise)
                self._waited(
                    partial(self.journal.keep_half, t, attempt, parties, half),
                    what=f"release {t + 1}'s half kept",
                )
                try:
                    return self._reveal(t, attempt, parties=parties)
                except SeedsMissingError as exc:
                    left = [p for p in parties if p not in exc.parties]
                    _log.warning(
                        "seeds missing at the guardian; asking without them",
                        extra={"round": t, "release_id": attempt, "missing": list(exc.parties), "left": left},
                    )
                    if len(left) == len(parties):
                        break
                    parties = left
            _log.warning("release round started again", extra={"round": t, "release_id": attempt})

    def _waited(self, attempt: Callable[[], T], *, what: str) -> T:
        """``attempt()``, waiting out an unreachable guardian or a full or read-only volume
        (:func:`_waiting_out`)."""
        return _waiting_out(attempt, what=what, progress=self.progress, stop=self.stop)

    def _reveal(
        self, t: int, attempt: str, *, parties: list[str]
    ) -> tuple[str, npt.NDArray[np.int64]] | None:
        """Ask the guardian for round ``t`` (attempt ``attempt`` over ``parties``, or its receipt if it was
        charged before) and reveal the total with the half kept for the attempt and parties it was charged
        under; None if that half is gone. The previous round's deposit is acknowledged first.

        Raises:
            SeedsMissingError: some parties' seeds never reached the guardian (nothing charged).
        """
        self._deposited()
        answer = self._waited(
            partial(self.guardian.release, attempt, t, parties), what=f"release {t + 1} from the guardian"
        )
        self.progress.ledger, self.progress.rdp_spent = answer.ledger, answer.ledger["rdp_spent"]
        half = self.journal.half(t, answer.release_id, answer.parties)
        if half is None:
            return None
        total = reveal([half], answer.masked)
        self._journaled(t, answer.release_id, total)
        self.progress.last_parties = answer.parties
        _log.info(
            "released",
            extra={
                "release_id": answer.release_id,
                "round": t,
                "parties": answer.parties,
                "rdp": answer.charged_rdp,
            },
        )
        return answer.release_id, total

    def _journaled(self, t: int, attempt: str, total: npt.NDArray[np.int64]) -> None:
        """Journal round ``t``'s total, waiting out a full or read-only volume (the total kept in memory)."""
        self._waited(partial(self.journal.append, t, attempt, total), what=f"release {t + 1} journaled")


def release_privacy(
    config: FederationConfig, protocol: ReleaseProtocol, progress: ReleaseProgress
) -> dict[str, Any]:
    """The privacy a release federation publishes, from the guardian's ledger (``progress.ledger``, what it
    last reported; before it first answers, the plan's own figures with nothing spent): the guarantee
    ``epsilon`` (every planned release's charge: the rounds are fixed before any data is touched, and
    :func:`~capc_common.federation.releases.protocol_for` checks they fit the budget), the charges made so
    far, ``epsilon_spent``, the neighbouring relation with each block's sensitivity, and ε per coalition."""
    ledger = progress.ledger or {
        **planned_figures(protocol, config.budget),
        "releases": 0,
        "rdp_spent": 0.0,
        "epsilon_spent": 0.0,
        "head": "",
    }
    return {
        "epsilon": ledger["epsilon"],
        "epsilon_note": PLAN_GUARANTEE,
        "epsilon_spent": ledger["epsilon_spent"],
        "epsilon_spent_note": PLAN_ODOMETER,
        "epsilon_limit": ledger["epsilon_limit"],
        "delta": ledger["delta"],
        "order": ledger["order"],
        "rdp_planned": ledger["rdp_planned"],
        "rdp_spent": ledger["rdp_spent"],
        "releases_planned": ledger["releases_planned"],
        "releases": ledger["releases"],
        "releases_lost": list(progress.lost),
        "source": "the guardian's ledger" if progress.ledger else "the plan (the guardian has not answered)",
        "ledger_head": ledger["head"],
        "accountant": accountant(protocol.mechanism),
        "neighbouring": protocol.mechanism.neighbouring,
        "sensitivity": protocol.mechanism.sensitivities(),
        "coalitions": ledger["coalitions"],
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
