"""The student's batch scheduler: a two-stage pipeline over the planned query batches.

Stage 1 (a thread) opens batch k+1 on the guardian, sends it to every connected teacher party and collects
their vote shares while stage 2 (the caller's thread) runs the 2PC of batch k with the guardian — so the
teachers' inference overlaps the secure computation. Every batch is begun in the durable store before it is
opened and completed (labels stored) in one transaction, so a restarted student resumes open batches and
never asks a finished one again.

Budget: a batch that does not fit is refused by the guardian before anything happens. Because batches in
flight hold their *worst-case* reservation, a refusal while others are in flight waits for them to settle
(their actual cost is usually lower) and tries once more; a refusal with nothing in flight ends the run.

Failures: when the guardian cannot be reached (it crashed, or restarts) the round ends, the batches in hand
stay open in the store, and the student reconnects with capped, jittered exponential backoff and resumes
them by itself. A full or read-only volume — the guardian's ledger's or this student's label store's — ends
the round the same way (:class:`~capc_common.errors.StorageError`: nothing of the batch was decoded, its
reservation stays) and the student tries again with the same backoff until the volume can be written.
A batch whose computation failed is finished from what the guardian says of it: settled — its labels are
decoded from the student's stash and the guardian's reveal, sent again; charged (the guardian's computation
began but never settled) — lost, counted at its worst case; open — aborted (released).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capc_common.errors import BudgetExhaustedError, CapcError, InputError, StorageError, UnavailableError
from capc_common.federation import (
    BatchPlan,
    FederationConfig,
    batch_costs,
    batch_plan,
    mpc_config,
    usable_queries,
)
from capc_common.privacy.analysis import rdp_budget_at_order
from capc_common.privacy.filter import refusal_message
from capc_common.wire import messages as pb
from capc_services.common import faults
from capc_services.common.metrics import PartyMetrics
from capc_services.common.retry import Backoff
from capc_services.student.accounting import spent_rdp
from capc_services.student.guardian_client import STATE_NAMES, GuardianClient, GuardianUnavailable
from capc_services.student.links import Answer, TeacherRegistry
from capc_services.student.store import LabelStore

_log = logging.getLogger(__name__)
_DONE = object()
BACKOFF_S = (0.5, 15.0)
"""First and largest wait between attempts to reach the guardian, or to write a full volume again (doubling
in between, jittered, from the first again at each outage)."""


@dataclass
class _Collected:
    plan: BatchPlan
    attempt: int
    shares: dict[str, np.ndarray]
    started: float
    model_work_s: float


@dataclass
class Progress:
    """What the student reports at ``/api/v1/progress``."""

    state: str = "starting"
    queries_planned: int = 0
    stopped_reason: str = ""
    error: str = ""
    #: Teacher parties the next batch waits for (the quorum) while fewer are connected; 0 when not waiting.
    waiting_for: int = 0
    last_batch: str = ""
    labels_per_s: float = 0.0
    reconnects: int = 0
    recovered_batches: int = 0
    published: dict[str, Any] = field(default_factory=dict)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=64))


class Scheduler:
    """Runs the planned batches through teachers and the guardian into the label store.

    Args:
        config: the federation config.
        store: the durable label store.
        registry: connected teacher parties.
        guardian: the guardian client.
        metrics: the student's metrics.
        depth: how many collected batches may wait for the 2PC stage (1 = classic double buffering, 0 =
            one batch at a time, to measure a batch's latency).
        connect_timeout: how long to wait for a quorum of teacher parties to connect before each batch.
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        store: LabelStore,
        registry: TeacherRegistry,
        guardian: GuardianClient,
        metrics: PartyMetrics,
        depth: int = 1,
        connect_timeout: float = 600.0,
    ) -> None:
        self.config = config
        self.store = store
        self.registry = registry
        self.guardian = guardian
        self.metrics = metrics
        self.progress = Progress()
        self._width = mpc_config(config).width
        self._depth = depth
        self._connect_timeout = connect_timeout
        self._in_flight = 0
        self._flight = threading.Condition()
        self._stop = threading.Event()
        self._halt = threading.Event()  # ends the current round (set by stop() and by a failed round)

    def stop(self) -> None:
        """Ask the pipeline to finish the batch in hand and stop."""
        self._stop.set()
        self._halt.set()

    # ------------------------------------------------------------------ finishing a batch without its run
    def _recover(self, plan: BatchPlan) -> bool:
        """Store the labels of a batch the guardian settled but this student never stored (it crashed, or
        the link broke before the reveal arrived): the reveal sent again plus the stash give them.

        Returns:
            False when nothing matching was stashed (then the labels are lost).
        """
        try:
            computation, reveal = self.guardian.reveal(plan.batch_id)
        except InputError as exc:
            _log.warning("no reveal to recover", extra={"batch_id": plan.batch_id, "error": str(exc)})
            return False
        kept = self.store.stashed(plan.batch_id, computation)
        if kept is None:
            return False
        select, parties = kept
        labels = self.guardian.decode(select, reveal)
        self.store.complete(plan.batch_id, labels=labels, parties=parties)
        self.progress.recovered_batches += 1
        self.metrics.batches.labels(outcome="recovered").inc()
        _log.info(
            "labels recovered from the stash and the guardian's reveal",
            extra={"batch_id": plan.batch_id, "computation": computation, "answered": reveal.answered},
        )
        return True

    def _finish_from_guardian(self, plan: BatchPlan, state: str, *, answered: int, why: str) -> None:
        """Record a batch whose labels this attempt did not get, from where the guardian says it stands.

        Raises:
            GuardianUnavailable: the guardian cannot be asked (the batch stays open, to resume).
        """
        if state == "settled":
            if not self._recover(plan):
                self.store.finish(
                    plan.batch_id, state="lost", detail=f"charged, labels lost: {why}", answered=answered
                )
        elif state == "charged":
            # The guardian's computation began but never settled: it holds the worst case (every query
            # answered), which is what the student's record must count too. No label was ever revealed.
            self.store.finish(
                plan.batch_id,
                state="lost",
                detail=f"charged at its worst case, no label revealed (the guardian stopped mid-batch): "
                f"{why}",
                answered=plan.count,
            )
        else:
            if state == "open":
                self.guardian.abort_batch(plan.batch_id, reason=why)
            self.store.finish(plan.batch_id, state="aborted", detail=why)

    # ------------------------------------------------------------------ stage 1
    def _collect(self, plan: BatchPlan) -> _Collected | None:
        """Open, dispatch and collect one batch; None when it was aborted (and recorded as such)."""
        quorum = self.config.quorum.min_parties
        self.progress.waiting_for = quorum
        try:
            connected = self.registry.wait_for(quorum, timeout=self._connect_timeout, stop=self._halt)
        finally:
            self.progress.waiting_for = 0
        if not connected:
            if self._halt.is_set():
                return None
            raise UnavailableError(
                f"fewer than {quorum} teacher parties connected within {self._connect_timeout:.0f} s "
                f"(connected: {sorted(self.registry.live())})"
            )
        attempt = self.store.begin(plan.batch_id, first_index=plan.spec.first_index, count=plan.count)
        started = time.perf_counter()
        reply = self._open(plan)
        state = STATE_NAMES[reply.state]
        if state in ("settled", "charged", "released"):
            self._finish_from_guardian(
                plan, state, answered=reply.answered, why=f"{state} on the guardian before a restart"
            )
            return None
        item = pb.WorkItem(
            batch_id=plan.batch_id,
            attempt=attempt,
            query=plan.query_proto(),
            ring_width=self._width,
            classes=self.config.classes,
        )
        collection = self.registry.dispatch(item)
        try:
            answers = collection.wait(timeout=self.config.quorum.vote_deadline_s)
        finally:
            self.registry.finish(collection)
        # A work item out and its answer back: one round trip on each answering teacher's link.
        self.metrics.round_trips.labels(peer="teacher", call="WorkTurn").inc(len(answers))
        shares, problems = self._valid_shares(plan, answers)
        missing = sorted(set(collection.parties) - set(answers))
        if len(shares) < quorum:
            if collection.closed or self._halt.is_set():
                # Shutting down (this student, or the teachers with it): the batch stays open in the store
                # and on the guardian, as after a crash, and the next start resumes it; nothing is aborted for
                # a quorum the shutdown broke. A batch that has its quorum goes on: the batch in hand.
                return None
            reason = (
                f"quorum not met: {len(shares)} of {len(self.config.teachers)} teacher parties answered "
                f"(need {quorum}); refused: {problems or 'none'}; no answer in "
                f"{self.config.quorum.vote_deadline_s:.0f} s: {missing or 'none'}"
            )
            self.guardian.abort_batch(plan.batch_id, reason=reason)
            self.store.finish(plan.batch_id, state="aborted", detail=reason)
            self.metrics.batches.labels(outcome="aborted").inc()
            _log.warning(
                "batch aborted, nothing charged", extra={"batch_id": plan.batch_id, "reason": reason}
            )
            return None
        if problems or missing:
            _log.info(
                "batch proceeds with quorum",
                extra={
                    "batch_id": plan.batch_id,
                    "parties": sorted(shares),
                    "refused": problems,
                    "missing": missing,
                },
            )
        # A party's own model work: regenerating the queries and running its backbone and heads.
        model_work = max(
            (a.timings.get("generation", 0.0) + a.timings.get("inference", 0.0) for a in answers.values()),
            default=0.0,
        )
        for answer in answers.values():
            for stage, seconds in answer.timings.items():
                if seconds:
                    self.metrics.stage_seconds.labels(stage=f"teacher_{stage}").observe(seconds)
        self.metrics.stage_seconds.labels(stage="collect").observe(time.perf_counter() - started)
        return _Collected(plan=plan, attempt=attempt, shares=shares, started=started, model_work_s=model_work)

    def _valid_shares(
        self, plan: BatchPlan, answers: dict[str, Answer]
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        shares: dict[str, np.ndarray] = {}
        problems: dict[str, str] = {}
        shape = (plan.count, self.config.classes)
        for party, answer in answers.items():
            share = answer.share
            if share is None:
                problems[party] = answer.refusal
            elif share.shape != shape or share.dtype != np.int64:
                problems[party] = f"share of shape {share.shape} dtype {share.dtype}, expected {shape} int64"
            elif share.size and (int(share.min()) < 0 or int(share.max()) >> self._width):
                problems[party] = f"share values outside the ring Z_2^{self._width}"
            else:
                shares[party] = share
        return shares, problems

    def _open(self, plan: BatchPlan) -> pb.OpenBatchReply:
        try:
            with self.metrics.stage("open"):
                return self.guardian.open_batch(plan.batch_id, count=plan.count, digest=plan.digest)
        except BudgetExhaustedError:
            with self._flight:
                if self._in_flight == 0:
                    raise
            _log.info(
                "budget tight: waiting for batches in flight to settle", extra={"batch_id": plan.batch_id}
            )
            self._wait_idle()
            return self.guardian.open_batch(plan.batch_id, count=plan.count, digest=plan.digest)

    def _feed(self, plan: BatchPlan, out: queue.Queue[Any]) -> None:
        if self._depth == 0:
            self._wait_idle()
        collected = self._collect(plan)
        if collected is not None:
            with self._flight:
                self._in_flight += 1
            out.put(collected)

    def _remaining_rdp(self) -> float:
        """What the store's record leaves of the budget (exact when nothing is in flight)."""
        b = self.config.budget
        budget = rdp_budget_at_order(epsilon=b.epsilon, delta=b.delta, order=b.order)
        return budget - spent_rdp(self.config, self.store)

    def _shrunk(self, count: int) -> int:
        """The central runner's tail rule: halve (to multiples of bn_batch) until the worst case fits what
        remains; 0 when not even one bn_batch does. The same rule in both keeps their batches identical."""
        costs, bn = batch_costs(self.config), self.config.queries.bn_batch
        remaining = self._remaining_rdp()
        while costs.worst_case(count) > remaining and count > bn:
            count = max(bn, (count // 2) // bn * bn)
        return count if costs.worst_case(count) <= remaining else 0

    def _stage1(self, out: queue.Queue[Any], errors: list[BaseException]) -> None:
        q = self.config.queries
        costs = batch_costs(self.config)
        try:
            for record in self.store.batches(state="open"):
                if self._halt.is_set():
                    break
                plan = batch_plan(self.config, first_index=record.first_index, count=record.count)
                reply = self.guardian.status(plan.batch_id)
                state = STATE_NAMES[reply.state]
                if state in ("settled", "charged", "released"):  # finished there: no teacher is needed
                    why = f"{state} on the guardian before a restart"
                    self._finish_from_guardian(plan, state, answered=reply.answered, why=why)
                    continue
                _log.info("resuming batch", extra={"batch_id": record.batch_id})
                self._feed(plan, out)
            cursor, usable = self.store.next_index(), usable_queries(self.config)
            while cursor < usable and not self._halt.is_set():
                count = min(q.batch_size, usable - cursor)
                if costs.worst_case(count) > self._remaining_rdp():
                    self._wait_idle()  # settle what is in flight, then shrink on exact figures
                    count = self._shrunk(count)
                    if not count:
                        b = self.config.budget
                        raise BudgetExhaustedError(
                            refusal_message(
                                what=f"the smallest batch ({q.bn_batch} queries, worst case)",
                                requested=costs.worst_case(q.bn_batch),
                                remaining=self._remaining_rdp(),
                                order=b.order,
                                epsilon=b.epsilon,
                                delta=b.delta,
                            )
                        )
                plan = batch_plan(self.config, first_index=cursor, count=count)
                try:
                    self._feed(plan, out)
                except BudgetExhaustedError as exc:
                    # Refused even after the batches in flight settled: shrink as the rule says, or stop.
                    self.store.finish(plan.batch_id, state="aborted", detail=f"not opened: {exc}")
                    smaller = self._shrunk(count)
                    if not q.bn_batch <= smaller < count:
                        raise
                    plan = batch_plan(self.config, first_index=cursor, count=smaller)
                    self._feed(plan, out)
                cursor += plan.count
        except BudgetExhaustedError as exc:
            self._abort_open(str(exc))
            self.progress.stopped_reason = str(exc)
        except BaseException as exc:
            errors.append(exc)
        finally:
            out.put(_DONE)

    def _wait_idle(self) -> None:
        with self._flight:
            while self._in_flight:
                self._flight.wait()

    def _abort_open(self, reason: str) -> None:
        for record in self.store.batches(state="open"):
            try:
                self.guardian.abort_batch(record.batch_id, reason=reason)
            except CapcError as exc:
                _log.warning("could not abort", extra={"batch_id": record.batch_id, "error": str(exc)})
            self.store.finish(record.batch_id, state="aborted", detail=reason)

    # ------------------------------------------------------------------ stage 2
    def _compute(self, item: _Collected) -> None:
        plan = item.plan

        def stash(computation: str, parties: tuple[str, ...], select: np.ndarray) -> None:
            self.store.stash(plan.batch_id, computation=computation, parties=parties, select=select)

        self.store.require_room(plan.count)  # the stash and labels to come: refused before the 2PC starts
        try:
            with self.metrics.stage("2pc"):
                labels, agreed, nbytes = self.guardian.compute(
                    plan.batch_id, attempt=item.attempt, shares=item.shares, stash=stash
                )
        except CapcError as exc:
            if isinstance(exc, GuardianUnavailable | StorageError):
                raise  # the batch stays open: resumed once the guardian is back, or the volume writable
            reply = self.guardian.status(plan.batch_id)
            status = STATE_NAMES[reply.state]
            self._finish_from_guardian(plan, status, answered=reply.answered, why=str(exc))
            if status != "settled":
                self.metrics.batches.labels(outcome="aborted").inc()
            _log.warning(
                "batch failed", extra={"batch_id": plan.batch_id, "state": status, "error": str(exc)}
            )
            return
        faults.reached("student.labelled")
        with self.metrics.stage("store"):
            self.store.complete(plan.batch_id, labels=labels, parties=agreed)
        wall = time.perf_counter() - item.started
        protocol = max(wall - item.model_work_s, 0.0)
        self.metrics.stage_seconds.labels(stage="batch_wall").observe(wall)
        self.metrics.stage_seconds.labels(stage="protocol").observe(protocol)
        self.metrics.batches.labels(outcome="done").inc()
        self.progress.last_batch = plan.batch_id
        self.progress.recent.append(
            {
                "batch_id": plan.batch_id,
                "count": plan.count,
                "answered": int((labels >= 0).sum()),
                "wall_s": wall,
                "model_work_s": item.model_work_s,
                "protocol_s": protocol,
                "mpc_bytes": nbytes,
                "completed": time.time(),
            }
        )
        _log.info(
            "batch labelled",
            extra={
                "batch_id": plan.batch_id,
                "answered": int((labels >= 0).sum()),
                "parties": list(agreed),
                "mpc_bytes": nbytes,
            },
        )

    def _round(self) -> None:
        """One pass of the two-stage pipeline over every batch not finished yet.

        Raises:
            GuardianUnavailable: the guardian could not be reached (everything unfinished stays open).
            CapcError: another failure stopped the pipeline.
        """
        collected: queue.Queue[Any] = queue.Queue(maxsize=max(self._depth, 1))
        errors: list[BaseException] = []
        producer = threading.Thread(
            target=self._stage1, args=(collected, errors), name="collect", daemon=True
        )
        start = time.perf_counter()
        producer.start()
        labelled = 0
        try:
            while True:
                item = collected.get()
                if item is _DONE:
                    break
                try:
                    self._compute(item)
                    labelled += item.plan.count
                finally:
                    self._landed()
                self.progress.labels_per_s = labelled / max(time.perf_counter() - start, 1e-9)
        finally:
            # End the collecting stage too (a batch it holds stays open in the store, for the next round).
            self._halt.set()
            while producer.is_alive() or not collected.empty():
                try:
                    item = collected.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is not _DONE:
                    self._landed()
            producer.join()
        if errors:
            raise errors[0]

    def _landed(self) -> None:
        with self._flight:
            self._in_flight -= 1
            self._flight.notify_all()

    def run(self) -> Progress:
        """Label every planned batch that is not finished yet; returns the final progress.

        While the guardian cannot be reached (state ``reconnecting``), or its ledger's volume or this
        student's is full or read-only (state ``waiting for storage``), the student waits (capped, jittered
        exponential backoff) and then resumes by itself.

        Raises:
            CapcError: a failure other than budget exhaustion, a quorum abort or an unreachable guardian
                stopped the pipeline.
        """
        self.progress.queries_planned = usable_queries(self.config)
        link, storage = Backoff(*BACKOFF_S), Backoff(*BACKOFF_S)
        while True:
            self.progress.state = "labelling"
            self._halt.clear()
            if self._stop.is_set():
                self._halt.set()
            labelled = self.progress.last_batch
            try:
                self._round()
                break
            except GuardianUnavailable as exc:
                if self._stop.is_set():
                    break
                self.progress.state = "reconnecting"
                self.progress.error = str(exc)
                self.progress.reconnects += 1
                wait = link.next()
                _log.warning("guardian unreachable; reconnecting", extra={"error": str(exc), "in_s": wait})
                self._stop.wait(wait)
                while not self._stop.is_set() and not self.guardian.reachable(timeout=link.next()):
                    pass
                link.reset()  # back: the next outage starts its backoff afresh
                self.progress.error = ""  # the outage is over: its error would read as the current state
                continue
            except StorageError as exc:
                if self._stop.is_set():
                    break
                if self.progress.last_batch != labelled:
                    storage.reset()  # it labelled meanwhile: a new outage
                self.progress.state = "waiting for storage"
                self.progress.error = str(exc)
                wait = storage.next()
                _log.warning(
                    "a volume is full or read-only; waiting", extra={"error": str(exc), "in_s": wait}
                )
                self._stop.wait(wait)
                continue
            except BaseException as exc:
                self.progress.state = "failed"
                self.progress.error = str(exc)
                raise
        self.progress.error = ""
        if not self.progress.stopped_reason:
            self.progress.stopped_reason = "stopped" if self._stop.is_set() else "all planned queries asked"
        self.progress.state = "labelled"
        return self.progress
