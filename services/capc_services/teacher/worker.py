"""What a teacher party does with one work item: check it, regenerate the queries, vote, share.

The party's voter — the one the federation's mechanism asks for (:meth:`SelectionMechanism.voter`): its heads
on the backbone in current-statistics mode for PATE, its Poisson-sampled records' k nearest for Private-kNN —
turns the batch into one count vector per query. It charges its local cap, hands the mask seed to the
guardian and only then returns the student's share — so a student never holds a share the guardian cannot
complete.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import BudgetExhaustedError, CapcError, InputError
from capc_common.federation import FederationConfig, mpc_config
from capc_common.mechanisms import Voter
from capc_common.mpc import share_votes
from capc_common.wire import RawQuery, ndarray_to_proto, query_from_proto
from capc_common.wire import messages as pb
from capc_services.common import faults
from capc_services.common.metrics import PartyMetrics
from capc_services.teacher.cap import LocalCap

if TYPE_CHECKING:  # the generators load only where images are made
    from capc_common.synth import SyntheticSpec

_log = logging.getLogger(__name__)
SubmitSeed = Callable[[str, int, bytes, tuple[int, int]], None]
AwaitGuardian = Callable[[], str]
"""Waits (boundedly) until the guardian can be reached; returns '' then, or why it cannot be."""


@dataclass
class WorkerStats:
    """Counters for ``/api/v1/status``."""

    answered: int = 0
    refused: int = 0
    queries: int = 0
    last_batch: str = ""
    last_refusal: str = ""


def _refusal(item: pb.WorkItem, reason: str, detail: str) -> pb.TeacherMessage:
    return pb.TeacherMessage(
        refusal=pb.Refusal(
            batch_id=item.batch_id,
            attempt=item.attempt,
            reason=pb.RefusalReason.Value(f"REFUSAL_REASON_{reason}"),
            detail=detail,
        )
    )


class TeacherWorker:
    """Answers work items for one teacher party.

    Args:
        config: the federation config.
        voter: this party's voter under the federation's mechanism.
        cap: the party's local ε cap record.
        metrics: the party's metrics.
        allow_raw_queries: answer queries shipped as pixels (off by default: synthetic only).
        images: a synthetic query's images (None: generated here; a local federation's parties share a
            :meth:`~capc_common.models.cache.FeatureCache.images`).
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        voter: Voter,
        cap: LocalCap,
        metrics: PartyMetrics,
        allow_raw_queries: bool = False,
        images: Callable[[SyntheticSpec], npt.NDArray[np.uint8]] | None = None,
    ) -> None:
        self.config = config
        self.images = images
        self.voter = voter
        self.cap = cap
        self.metrics = metrics
        self.allow_raw = allow_raw_queries
        self.width = mpc_config(config).width
        self.stats = WorkerStats()

    def _check(self, item: pb.WorkItem) -> Any:
        """The decoded query, or an InputError saying how the item contradicts federation.yaml."""
        if item.ring_width != self.width or item.classes != self.config.classes:
            raise InputError(
                f"work item asks for ring width {item.ring_width} and {item.classes} classes; "
                f"federation.yaml gives {self.width} and {self.config.classes}"
            )
        query = query_from_proto(item.query)
        q = self.config.queries
        if isinstance(query, RawQuery):
            return query
        expected = (q.generator, q.seed, q.height, q.width, q.channels, q.bn_batch)
        got = (query.generator, query.seed, query.height, query.width, query.channels, query.bn_batch)
        if got != expected:
            raise InputError(f"synthetic spec {got} does not match federation.yaml's queries {expected}")
        if query.count % q.bn_batch or query.count < 1:
            raise InputError(
                f"batch of {query.count} queries is not a positive multiple of bn_batch {q.bn_batch}"
            )
        if query.first_index + query.count > q.total:
            raise InputError(
                f"queries [{query.first_index}, {query.first_index + query.count}) go past the "
                f"federation's {q.total} planned queries"
            )
        return query

    def answer(
        self,
        item: pb.WorkItem,
        *,
        submit_seed: SubmitSeed,
        await_guardian: AwaitGuardian | None = None,
    ) -> pb.TeacherMessage:
        """Vote on one work item and return the message for the student (a share or a refusal).

        Args:
            item: the work item.
            submit_seed: sends ``(batch_id, attempt, seed, shape)`` to the guardian; raises a CapcError on
                failure.
            await_guardian: called before anything is charged or computed: a party that cannot reach the
                guardian (it started first, or the guardian restarts) waits for it rather than charge its
                cap and vote for a seed it could not hand over; if it never comes, the refusal costs
                nothing.
        """
        try:
            query = self._check(item)
        except CapcError as exc:
            return self._refuse(item, "INVALID_QUERY", str(exc))
        if isinstance(query, RawQuery) and not self.allow_raw:
            return self._refuse(
                item,
                "RAW_QUERIES_NOT_ALLOWED",
                "this site answers synthetic queries only "
                "(set allow_raw_queries: true in its site file to change)",
            )
        unreachable = await_guardian() if await_guardian is not None else ""
        if unreachable:
            return self._refuse(item, "GUARDIAN_UNAVAILABLE", f"{unreachable}; nothing was charged")
        count = query.count
        try:
            self.cap.charge(batch_id=item.batch_id, attempt=item.attempt, count=count)
        except BudgetExhaustedError as exc:
            return self._refuse(item, "LOCAL_BUDGET_EXHAUSTED", str(exc))
        t0 = time.perf_counter()
        if isinstance(query, RawQuery):
            images = query.images
        else:
            images = query.images() if self.images is None else self.images(query)
        t1 = time.perf_counter()
        votes = self.voter.vote(images, bn_batch=query.bn_batch)
        t2 = time.perf_counter()
        seed, share = share_votes(votes, width=self.width)
        t3 = time.perf_counter()
        try:
            submit_seed(item.batch_id, item.attempt, seed, (count, self.config.classes))
        except CapcError as exc:
            return self._refuse(item, "GUARDIAN_UNAVAILABLE", str(exc))
        faults.reached("teacher.shared")
        for stage, seconds in (("generation", t1 - t0), ("inference", t2 - t1), ("sharing", t3 - t2)):
            self.metrics.stage_seconds.labels(stage=stage).observe(seconds)
        self.stats.answered += 1
        self.stats.queries += count
        self.stats.last_batch = item.batch_id
        _log.info(
            "answered", extra={"batch_id": item.batch_id, "count": count, "inference_s": round(t2 - t1, 4)}
        )
        return pb.TeacherMessage(
            share=pb.VoteShare(
                batch_id=item.batch_id,
                attempt=item.attempt,
                share=ndarray_to_proto(np.ascontiguousarray(share, dtype=np.int64)),
                generation_s=t1 - t0,
                inference_s=t2 - t1,
                sharing_s=t3 - t2,
            )
        )

    def _refuse(self, item: pb.WorkItem, reason: str, detail: str) -> pb.TeacherMessage:
        self.stats.refused += 1
        self.stats.last_refusal = f"{item.batch_id}: {detail}"
        _log.warning("refused", extra={"batch_id": item.batch_id, "reason": reason, "detail": detail})
        return _refusal(item, reason, detail)
