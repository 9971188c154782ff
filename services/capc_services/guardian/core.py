"""The privacy guardian's state: the budget ledger, open batches, share seeds, noise and the garbler.

Lifecycle of one batch (DESIGN §3):

* ``open_batch`` reserves the batch's *worst-case* cost on the ledger (every query screened and answered);
  a batch that does not fit is refused with the requested/remaining/difference figures and nothing changes.
* ``submit_shares`` collects each teacher party's 16-byte mask seed for one attempt of the batch.
* ``agree`` fixes the parties both sides compute over (the student's responders whose seeds also arrived
  before the share deadline). Fewer than the quorum: the reservation is released — the batch costs nothing.
* ``compute`` draws the guardian's discrete Gaussian noise (z2 and its part z1_g of the threshold noise; the
  student adds its own part z1_s inside the 2PC, so the pass bits are noisy to the guardian too) and garbles.
  Before the garbler decodes the first pass bit, the ledger records the computation's nonce (``begin``,
  durable): from then on the batch is charged — settled by that nonce, or held at its worst case — and can
  never be released or computed again, by this process or another one on the same ledger. The MPC driver
  calls the commit hook with the pass bits *before* it sends the label decoding bits; the hook settles the
  ledger (durably) and keeps those decoding bits with the charge, so a student that crashed before storing
  its labels can ask for the same bits again (``reveal``). A crash can over-count spend, never under-count
  it. A failure before the ``begin`` row releases the reservation (nothing was decoded); a failure after it
  leaves the batch charged at its worst case.

Only open batches are held in memory and each is dropped when it ends, so memory stays flat however many
batches the federation runs; everything about finished batches lives in the ledger on disk.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from capc_common.errors import (
    CapcError,
    InputError,
    IntegrityError,
    PreconditionError,
    ProtocolError,
    StorageError,
    UnavailableError,
)
from capc_common.federation import (
    FederationConfig,
    batch_costs,
    check_batch_fits,
    mechanism_of,
    mpc_config,
    sampler_delta,
)
from capc_common.federation.refusals import SpendPlan, enforce, pre_spend_refusals
from capc_common.mpc import Channel, GarblerSession, Reveal
from capc_common.privacy import BudgetLedger, NoiseSource
from capc_services.common import faults
from capc_services.common.metrics import PartyMetrics
from capc_services.guardian.metrics import BudgetCollector, pinned_head

_log = logging.getLogger(__name__)
SEED_BYTES = 16
ATTEMPTS_HELD = 8
"""Attempts of one batch for which the guardian holds one party's seed: attempt numbers are the caller's, so
a party sending seeds for ever new attempts replaces its own oldest, never grows the guardian's memory (an
honest party sends one seed per attempt the student makes, and the student makes a few)."""


def pre_spend_refusal(config: FederationConfig, *, force: str | None) -> str | None:
    """Why every batch of ``config`` is refused before the first charge (None: nothing is refused).

    The pre-spend checks (:mod:`capc_common.federation.refusals`) read federation.yaml alone, including the
    examples each party declared; ``force`` (the site file's ``force``, or ``capc guardian serve --force``)
    overrides a judgement, and what it overrode is logged with the reason.

    Raises:
        InputError: ``force`` is blank.
    """
    how = 'force: "REASON" in the guardian\'s site file, or `capc guardian serve --force "REASON"`'
    try:
        overridden = enforce(pre_spend_refusals(SpendPlan.declared(config)), force=force, force_with=how)
    except PreconditionError as exc:
        _log.error("refusing every batch before any privacy is spent", extra={"reason": str(exc)})
        return str(exc)
    if overridden:
        _log.warning(
            "pre-spend refusal overridden by the operator",
            extra={"refusals": [r.text() for r in overridden], "force": force},
        )
    return None


class QuorumError(UnavailableError):
    """Too few teacher parties took part in a batch; it was released and cost nothing."""


@dataclass
class _OpenBatch:
    batch_id: str
    count: int
    digest: bytes
    opened: float
    # attempt -> party -> seed
    seeds: dict[int, dict[str, bytes]] = field(default_factory=dict)
    computing: bool = False  # agreed: no more seeds, no second agreement
    started: bool = False  # a computation took it: no second computation


def _forget_oldest(seeds: dict[int, dict[str, bytes]], party: str, *, keep: int, besides: int) -> None:
    """Drop ``party``'s seeds of its oldest attempts (not ``besides``) until at most ``keep`` remain."""
    held = sorted(a for a, by_party in seeds.items() if party in by_party and a != besides)
    for attempt in held[: max(0, len(held) - keep)]:
        del seeds[attempt][party]
        if not seeds[attempt]:
            del seeds[attempt]


@dataclass(frozen=True)
class Agreement:
    """One agreed computation of a batch: the parties both sides compute over and the computation's nonce."""

    parties: tuple[str, ...]
    computation: str


@dataclass(frozen=True)
class BatchStatus:
    """Where a batch stands: ``open``, ``charged`` (computed, never settled: held at its worst case),
    ``settled``, ``released`` or ``unknown``."""

    state: str
    answered: int = 0
    detail: str = ""


@dataclass
class PartySeen:
    """What the guardian knows about one party's activity (for ``/api/v1/parties``).

    ``batches`` counts, for a teacher party, the share sets it submitted (each attempt again) and, for the
    student, the batches it opened (each reserved once); ``queries`` counts the queries of a teacher's
    share sets: what the party's own cap charged at the worst case, as far as this guardian process has seen.
    """

    role: str
    last_seen: float | None = None
    batches: int = 0
    queries: int = 0


class Guardian:
    """Thread-safe guardian state shared by the gRPC servicer and the admin API.

    Args:
        config: the federation config.
        ledger: the durable two-phase budget ledger.
        noise: the guardian's discrete Gaussian noise source (a CSPRNG-backed one outside tests).
        metrics: this party's metrics.
        force: the operator's reason to run a federation the pre-spend checks refuse as a judgement
            (:func:`pre_spend_refusal`); None: such a federation's every batch is refused.
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        ledger: BudgetLedger,
        noise: NoiseSource,
        metrics: PartyMetrics,
        force: str | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.noise = noise
        self.metrics = metrics
        check_batch_fits(config)
        self.refusal = pre_spend_refusal(config, force=force)
        self.mechanism = mechanism_of(config)
        self._mpc = mpc_config(config)
        self._costs = batch_costs(config)
        self._sampler_delta = sampler_delta(config)
        metrics.registry.register(BudgetCollector(self.budget))
        self._lock = threading.Condition()
        self._open: dict[str, _OpenBatch] = {}
        self._compute_lock = threading.Lock()
        self.parties: dict[str, PartySeen] = {
            config.student: PartySeen(role="student"),
            **{name: PartySeen(role="teacher") for name in config.teacher_names},
        }

    # ---------------------------------------------------------------- helpers
    def _seen(self, party: str, *, queries: int = 0, batches: int = 0) -> None:
        seen = self.parties.get(party)
        if seen is not None:
            seen.last_seen = time.time()
            seen.batches += batches + int(queries > 0)
            seen.queries += queries

    def _get_open(self, batch_id: str) -> _OpenBatch:
        batch = self._open.get(batch_id)
        if batch is None:
            state = self.status(batch_id).state
            raise InputError(f"batch {batch_id!r} is not open on the guardian (state {state}); open it first")
        return batch

    def _release(self, batch_id: str, *, reason: str, actor: str) -> None:
        with self._lock:
            self._open.pop(batch_id, None)
        self.ledger.release(batch_id, reason=reason[:4000], actor=actor)
        self.metrics.batches.labels(outcome="released").inc()
        _log.info("batch released", extra={"batch_id": batch_id, "reason": reason})

    def _release_undecoded(self, batch_id: str, *, reason: str, actor: str) -> None:
        """Release a batch this process decoded nothing of — unless the ledger says another computation
        began on it (or it finished meanwhile): then its charge stands, and that is only logged.

        Raises:
            StorageError: the ledger's volume cannot take the release row; the batch stays reserved (the
                student waits, then opens it again or aborts it again), never silently orphaned.
        """
        try:
            self._release(batch_id, reason=reason, actor=actor)
        except StorageError:
            raise
        except CapcError as exc:
            _log.warning("batch not released", extra={"batch_id": batch_id, "error": str(exc)})

    # ---------------------------------------------------------------- ledger-facing operations
    def status(self, batch_id: str) -> BatchStatus:
        """Where ``batch_id`` stands: ``open`` (reserved), ``settled``, ``released`` or ``unknown``.

        A reservation the ledger holds but this process does not (the guardian restarted) is ``open``: it
        revealed nothing (settling comes before any reveal), and reopening it re-adopts it.
        """
        record = self.ledger.batch(batch_id)
        if record is None:
            return BatchStatus(state="unknown")
        state = {"reserved": "open", "computing": "charged"}.get(record.state, record.state)
        detail = record.detail
        if state == "charged":
            detail = (
                f"computation {record.computation} began but never settled; the batch stays charged at its "
                "worst case and its labels were never revealed"
            )
        return BatchStatus(state=state, answered=record.answered, detail=detail)

    def open_batch(
        self, *, batch_id: str, count: int, digest: bytes, actor: str
    ) -> tuple[BatchStatus, float]:
        """Reserve the worst-case cost of a batch; idempotent for the same id and query.

        Returns:
            The batch's status and the RDP reserved for it (0 if it was already finished).

        Raises:
            InputError: bad id/count, or the id is known with another query.
            BudgetExhaustedError: the worst case does not fit the remaining budget (nothing reserved).
        """
        if self.refusal is not None:  # before the ledger is touched: the federation would spend for nothing
            raise PreconditionError(self.refusal)
        if not batch_id or len(batch_id) > 128:
            raise InputError(f"batch id must be 1-128 characters, got {len(batch_id)}")
        if not 1 <= count <= self.config.queries.batch_size:
            raise InputError(
                f"batch {batch_id} has {count} queries; the federation allows 1 to "
                f"{self.config.queries.batch_size}"
            )
        if len(digest) != 32:
            raise InputError(f"query digest must be 32 bytes (SHA-256), got {len(digest)}")
        self._seen(actor)
        worst = self._costs.worst_case(count)
        with self._lock:
            known = self._open.get(batch_id)
            if known is not None:
                if (known.count, known.digest) != (count, digest):
                    raise InputError(f"batch id {batch_id} is already open for another query; use a fresh id")
                return BatchStatus(state="open"), worst
        finished = self.status(batch_id)
        if finished.state in ("settled", "released", "charged"):
            record = self.ledger.batch(batch_id)
            if record is None or (record.queries, record.params.get("query_digest")) != (count, digest.hex()):
                raise InputError(
                    f"batch id {batch_id} was already used for another query (now {finished.state}); a batch "
                    "id names one query for good: use a fresh id"
                )
            return finished, 0.0
        try:
            with self.metrics.stage("ledger"):
                self.ledger.reserve(
                    batch_id,
                    queries=count,
                    parties=list(self.config.teacher_names),
                    mechanism=self.mechanism.name,
                    params={**self._costs.params, "query_digest": digest.hex()},
                    worst_case_rdp=worst,
                    actor=actor,
                )
        except IntegrityError as exc:
            raise InputError(
                f"batch id {batch_id} was reserved for another query; use a fresh id ({exc})"
            ) from None
        with self._lock:
            opened = batch_id not in self._open
            self._open.setdefault(
                batch_id, _OpenBatch(batch_id=batch_id, count=count, digest=digest, opened=time.time())
            )
        self._seen(actor, batches=int(opened))
        self.metrics.batches.labels(outcome="opened").inc()
        _log.info(
            "batch opened",
            extra={
                "batch_id": batch_id,
                "count": count,
                "reserved_rdp": worst,
                "readopted": finished.state == "open",
            },
        )
        return BatchStatus(state="open"), worst

    def abort_batch(self, batch_id: str, *, reason: str, actor: str) -> BatchStatus:
        """Release an open batch that was never computed (idempotent for finished batches).

        A batch a computation began on (here or in another process sharing the ledger) is not released: its
        status says ``charged`` or ``settled``.
        """
        with self._lock:
            batch = self._open.get(batch_id)
            if batch is not None and batch.computing:
                raise InputError(f"batch {batch_id} is being computed; it can no longer be aborted")
        if self.status(batch_id).state == "open":
            self._release_undecoded(batch_id, reason=f"aborted by {actor}: {reason[:2000]}", actor=actor)
        return self.status(batch_id)

    # ---------------------------------------------------------------- shares and quorum
    def submit_shares(
        self, *, batch_id: str, attempt: int, party: str, seed: bytes, shape: Sequence[int]
    ) -> int:
        """Record a teacher party's mask seed for one attempt; returns how many parties' seeds it now holds.

        Raises:
            InputError: unknown batch, wrong seed length or shape, or the batch is already being computed.
        """
        if len(seed) != SEED_BYTES:
            raise InputError(f"{party} sent a {len(seed)}-byte seed; exactly {SEED_BYTES} bytes are required")
        with self._lock:
            batch = self._get_open(batch_id)
            expected = (batch.count, self.config.classes)
            if tuple(shape) != expected:
                raise InputError(
                    f"{party} shared votes of shape {tuple(shape)} for batch {batch_id}; expected {expected}"
                )
            if batch.computing:
                raise InputError(f"batch {batch_id} is already being computed; {party}'s seed came too late")
            _forget_oldest(batch.seeds, party, keep=ATTEMPTS_HELD - 1, besides=attempt)
            seeds = batch.seeds.setdefault(attempt, {})
            seeds[party] = bytes(seed)
            self._lock.notify_all()
            received = len(seeds)
            queries = batch.count
        self._seen(party, queries=queries)
        return received

    def agree(self, *, batch_id: str, attempt: int, parties: Sequence[str], actor: str) -> Agreement:
        """Fix the parties of one computation, waiting up to the share deadline for their seeds.

        Returns:
            The agreed parties in federation order and a fresh nonce for the computation.

        Raises:
            InputError: unknown parties or batch, or the batch was already agreed (it is being computed).
            QuorumError: fewer than the quorum; the batch was released (it cost nothing).
        """
        unknown = sorted(set(parties) - set(self.config.teacher_names))
        if unknown:
            raise InputError(f"{actor} listed parties that are not teachers of this federation: {unknown}")
        wanted = set(parties)
        deadline = time.monotonic() + self.config.quorum.share_deadline_s
        with self._lock:
            batch = self._get_open(batch_id)
            while True:
                if batch.computing:
                    # A second agreement would let the batch be computed twice: two labellings with fresh
                    # noise for one ledger charge (settling is idempotent for the same answered count).
                    raise InputError(
                        f"batch {batch_id} is already being computed; a batch is computed at most once "
                        "(open a new batch to ask its queries again)"
                    )
                have = set(batch.seeds.get(attempt, {}))
                left = deadline - time.monotonic()
                if wanted <= have or left <= 0:
                    break
                self._lock.wait(timeout=left)
            agreed = tuple(p for p in self.config.teacher_names if p in wanted and p in have)
            if len(agreed) >= self.config.quorum.min_parties:
                batch.computing = True
                # Seeds of other attempts are never used again.
                batch.seeds = {attempt: batch.seeds[attempt]}
                return Agreement(parties=agreed, computation=secrets.token_hex(16))
        missing = sorted(wanted - have)
        reason = (
            f"quorum not met: {len(agreed)} of {len(self.config.teachers)} teacher parties took part "
            f"(need {self.config.quorum.min_parties}); student offered {sorted(wanted)}, "
            f"no seed in time from {missing or 'none'}"
        )
        self._release(batch_id, reason=reason, actor=actor)
        raise QuorumError(f"batch {batch_id} aborted, nothing charged: {reason}")

    # ---------------------------------------------------------------- 2PC
    def session(self, channel: Channel) -> GarblerSession:
        """A garbler session over one student link (base OT once, then any number of batches)."""
        return GarblerSession(channel, self._mpc)

    def compute(
        self, *, batch_id: str, attempt: int, agreement: Agreement, session: GarblerSession, actor: str
    ) -> int:
        """Garble one agreed batch in ``session`` (the student evaluates); returns how many were answered.

        Raises:
            InputError: the batch was not agreed, or another computation of it already started (nothing
                changes: a batch is computed at most once).
            IntegrityError: the ledger refused this computation (another one began on the batch, perhaps
                in another guardian process: nothing was decoded) or its settle (the batch stays charged
                at its worst case; nothing was revealed).
            ProtocolError: the computation failed. If that happened before the ledger recorded the
                computation, the reservation was released (nothing decoded, nothing charged); after it, the
                batch stays charged at its worst case.
        """
        with self._lock:
            batch = self._get_open(batch_id)
            if not batch.computing or batch.started:
                raise InputError(
                    f"batch {batch_id} is already being computed, or its parties were never agreed; a batch "
                    "is computed at most once, after agree()"
                )
            batch.started = True
            seeds = [batch.seeds[attempt][p] for p in agreement.parties]
            count = batch.count
        nonce = agreement.computation
        began: list[bool] = []
        settled: dict[str, Any] = {}

        def mark() -> None:
            # Durable before the garbler reads a single pass label: from here on the batch is charged.
            try:
                with self.metrics.stage("ledger"):
                    self.ledger.begin(batch_id, computation=nonce, actor=actor)
            except StorageError:
                raise  # the volume cannot take the batch's rows: nothing was decoded, the reservation stays
            except CapcError as exc:
                raise IntegrityError(
                    f"batch {batch_id} cannot be computed here; nothing was decoded: {exc}"
                ) from None
            began.append(True)

        def commit(reveal: Reveal) -> None:
            answered = reveal.answered
            faults.reached("guardian.decoded")
            try:
                with self.metrics.stage("ledger"):
                    entry = self.ledger.settle(
                        batch_id,
                        answered=answered,
                        actual_rdp=self._costs.actual(count, answered),
                        actor=actor,
                        computation=nonce,
                        receipt=reveal.to_bytes(),
                    )
            except Exception as exc:  # a refusal (CapcError) or a failing disk (sqlite3.Error)
                # The ledger's refusal may name the answered count: a DP output of a batch that is charged
                # only at its worst case. It stays in this log; the student (who gets our error as its stream
                # status) learns only that the settle failed.
                _log.warning("settle failed", extra={"batch_id": batch_id, "error": str(exc)})
                kind = StorageError if isinstance(exc, StorageError) else IntegrityError
                raise kind(
                    f"batch {batch_id} could not be settled on the ledger"
                    + (f" ({exc})" if kind is StorageError else "")
                    + "; it stays charged at its worst case and nothing was revealed"
                ) from None
            settled.update(answered=answered, pin=pinned_head(entry))
            faults.reached("guardian.settled")

        try:
            # Noise is drawn in batch order under one lock: the canonical order a seeded source reproduces.
            with self._compute_lock:
                noise = self.mechanism.guardian_noise(self.noise, batch=count)
                with self.metrics.stage("garble"):
                    self.mechanism.garble(
                        session,
                        batch_id=batch_id,
                        seeds=seeds,
                        shape=(count, self.config.classes),
                        noise=noise,
                        commit=commit,
                        before_decode=mark,
                    )
        except BaseException as exc:
            with self._lock:
                self._open.pop(batch_id, None)
            if not began and not isinstance(exc, StorageError):
                self._release_undecoded(
                    batch_id, reason=f"computation failed before decoding: {exc}", actor=actor
                )
            elif not began:  # kept reserved: the student opens it again once the ledger can be written
                _log.warning(
                    "batch not computed: the ledger's volume", extra={"batch_id": batch_id, "error": str(exc)}
                )
            elif "answered" not in settled:
                self.metrics.batches.labels(outcome="charged").inc()
                _log.warning(
                    "batch charged at its worst case: the computation failed after it began decoding",
                    extra={"batch_id": batch_id, "computation": nonce, "error": str(exc)},
                )
            if isinstance(exc, Exception) and not isinstance(exc, CapcError):
                raise ProtocolError(f"batch {batch_id}: 2PC failed: {exc}") from exc
            raise
        with self._lock:
            self._open.pop(batch_id, None)
        self.metrics.batches.labels(outcome="settled").inc()
        _log.info(
            "batch settled",
            extra={
                "batch_id": batch_id,
                "parties": list(agreement.parties),
                "answered": settled["answered"],
                "count": count,
                "computation": nonce,
                # Pin it elsewhere: `capc budget verify --expect-head` then detects a tail cut later.
                **settled["pin"],
            },
        )
        return int(settled["answered"])

    def reveal(self, batch_id: str, *, actor: str) -> tuple[str, int, bytes]:
        """What a settled batch revealed, to send the same bits again: ``(computation, count, bytes)``.

        The student asks after a crash between this guardian's settle and its own label store; the bytes are
        exactly the pass bits and decoding bits it was sent then (or was about to be sent), so this reveals
        nothing new and charges nothing.

        Raises:
            InputError: the batch is not settled, or was settled without a receipt.
        """
        kept = self.ledger.receipt(batch_id)
        record = self.ledger.batch(batch_id)
        if kept is None or record is None or record.state != "settled":
            state = self.status(batch_id).state
            raise InputError(
                f"batch {batch_id} has no reveal to send again (state {state}); only a batch settled by a "
                "computation has one"
            )
        self._seen(actor)
        _log.info("reveal sent again", extra={"batch_id": batch_id, "computation": kept[0]})
        return kept[0], record.queries, kept[1]

    # ---------------------------------------------------------------- reporting
    def budget(self) -> dict[str, Any]:
        """The ledger summary, the kind of noise this guardian draws, and the δ the guarantee holds at once
        the samplers' statistical distance is added (``delta_total`` = ``delta`` + ``delta_sampler``)."""
        summary = dict(self.ledger.summary())
        summary["noise"] = type(self.noise).__name__
        summary["noise_secure"] = bool(getattr(self.noise, "secure", True))
        summary["delta_sampler"] = self._sampler_delta
        summary["delta_total"] = summary["delta"] + self._sampler_delta
        return summary
