"""The student's batches: ranges of the federation's query stream, with ids that name the range.

A batch covers queries ``[first, first + count)`` of the stream ``(generator, seed)``; its id
``q<first>+<count>`` names that range, so a restarted student (or anyone reading the ledger) maps an id back
to the same queries, and the id is bound to its query by the SHA-256 of the serialized spec the guardian is
shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from capc_common.errors import InputError
from capc_common.federation.config import FederationConfig
from capc_common.wire import digest, query_to_proto
from capc_common.wire.messages import QuerySpec

if TYPE_CHECKING:
    from capc_common.synth import SyntheticSpec


@dataclass(frozen=True)
class BatchPlan:
    """One planned batch: its id and the synthetic spec every party regenerates its queries from."""

    batch_id: str
    spec: SyntheticSpec

    @property
    def count(self) -> int:
        """Number of queries."""
        return self.spec.count

    def query_proto(self) -> QuerySpec:
        """The batch's query as it travels to the teachers."""
        return query_to_proto(self.spec)

    @property
    def digest(self) -> bytes:
        """SHA-256 binding the batch id to its query (what ``OpenBatch`` carries)."""
        return digest(self.query_proto().SerializeToString(deterministic=True))


def usable_queries(config: FederationConfig) -> int:
    """Queries of the stream that can be asked: ``total`` rounded down to a multiple of ``bn_batch``."""
    q = config.queries
    return q.total - q.total % q.bn_batch


def plan_batches(config: FederationConfig) -> list[int]:
    """The sizes of the federation's batches, in stream order (every one full but perhaps the last)."""
    total, size = usable_queries(config), config.queries.batch_size
    return [min(size, total - first) for first in range(0, total, size)]


def batch_plan(config: FederationConfig, *, first_index: int, count: int) -> BatchPlan:
    """The batch of ``count`` queries starting at ``first_index`` of the federation's stream.

    Raises:
        InputError: ``count`` is not a positive multiple of ``bn_batch`` or the range leaves the stream.
    """
    from capc_common.synth import SyntheticSpec  # the generators load only where images are made

    q = config.queries
    if first_index < 0 or first_index + count > usable_queries(config):
        raise InputError(
            f"queries [{first_index}, {first_index + count}) leave the federation's stream of "
            f"{usable_queries(config)} usable queries"
        )
    spec = SyntheticSpec(
        generator=q.generator,
        seed=q.seed,
        first_index=first_index,
        count=count,
        height=q.height,
        width=q.width,
        channels=q.channels,
        bn_batch=q.bn_batch,
    )
    return BatchPlan(batch_id=f"q{first_index:09d}+{count}", spec=spec)
