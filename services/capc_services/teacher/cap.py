"""A teacher party's own worst-case ε cap, enforced locally (DESIGN §4).

A hospital does not have to trust the guardian's ledger to bound its exposure: before releasing any share
it charges, on a durable record of its own, the worst case the batch could cost (every query screened and
answered) at the federation's public parameters, and refuses once the cap would be crossed. Every set of
shares it hands out is counted — a re-collected batch counts again — so the record only ever over-counts.

The record is created once, by an explicit :meth:`LocalCap.init` (``capc teacher init-cap``, or
``capc teacher serve --train-missing`` setting up a new site, or ``capc local up`` for its simulated
hospitals), never on the fly: a record that went missing would otherwise restart the party at ε 0 and
silently forget what it already released. Opening a missing record is refused.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from capc_common.durable import fsync_dir
from capc_common.errors import InputError, IntegrityError
from capc_common.federation import FederationConfig, batch_costs
from capc_common.privacy import RenyiFilter


class LocalCap:
    """Durable, append-only record of the shares a teacher party released, with its ε cap.

    Args:
        path: the record (JSON lines; created with its directory).
        config: the federation config (public parameters of the cost).
        epsilon_cap: the most ε this party accepts, at the federation's δ and order.
        worst_case: the RDP one charge of ``count`` costs at most (default: a batch of ``count`` queries of
            the federation's selection mechanism; a release federation passes its release's RDP).

    Raises:
        InputError: a non-positive cap.
        IntegrityError: the record is missing (see :meth:`init`), belongs to another federation config or
            is corrupt.

    A record carries on across a membership change: lines written under a config hash that
    ``federation.yaml``'s ``history`` lists as continued from count as this federation's (each line keeps
    the RDP it charged), and new lines name the new hash.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        config: FederationConfig,
        epsilon_cap: float,
        worst_case: Callable[[int], float] | None = None,
    ) -> None:
        if not epsilon_cap > 0:
            raise InputError(f"the local epsilon cap must be > 0, got {epsilon_cap}")
        self.path = Path(path)
        self.cap = float(epsilon_cap)
        self._worst_case = worst_case or batch_costs(config).worst_case
        self._filter = RenyiFilter.for_budget(
            epsilon=epsilon_cap, delta=config.budget.delta, order=config.budget.order
        )
        self._hash = config.config_hash()
        self._accepted = {self._hash, *config.previous_hashes}
        self._lock = threading.Lock()
        self.batches = 0
        self.queries = 0
        self._load()

    @classmethod
    def init(cls, path: str | Path, *, config: FederationConfig) -> Path:
        """Create the empty record of a new site (its first line names the federation); once only.

        Raises:
            InputError: a record already exists there (it is never re-created: it holds what was spent).
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        header = {"kind": "init", "config_hash": config.config_hash(), "time": time.time()}
        try:
            with target.open("x") as handle:
                handle.write(json.dumps(header, sort_keys=True) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        except FileExistsError:
            raise InputError(
                f"the cap record {target} already exists; it is never re-created (it holds the ε this party "
                "has released)"
            ) from None
        fsync_dir(target.parent)  # a new file survives a power cut only once its directory entry does
        return target

    def _load(self) -> None:
        if not self.path.is_file():
            raise IntegrityError(
                f"the cap record {self.path} does not exist. If this party has answered queries before, "
                "restore the record from a backup: starting afresh would forget the ε it already released. "
                "For a new site, create it once with `capc teacher init-cap --site FILE`"
            )
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if entry["config_hash"] not in self._accepted:
                    raise IntegrityError(
                        f"{self.path} line {number} was written under another federation config "
                        f"({entry['config_hash'][:16]}); give this federation its own record"
                    )
                if entry.get("kind") == "init":
                    continue
                self._filter.charges.append(float(entry["rdp"]))  # admitted when it was written
                self.queries += int(entry["count"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise IntegrityError(
                    f"{self.path} line {number} is corrupt ({exc}); restore it from backup"
                ) from None
            self.batches += 1

    @property
    def epsilon(self) -> float:
        """Worst-case ε spent so far (0 before any batch)."""
        return self._filter.epsilon_spent if self._filter.charges else 0.0

    @property
    def rdp(self) -> float:
        """Worst-case RDP spent so far at the federation's order."""
        return self._filter.spent_rdp

    def charge(self, *, batch_id: str, attempt: int, count: int) -> float:
        """Durably count one batch's worst case before its shares leave; returns ε after it.

        Raises:
            BudgetExhaustedError: the batch would cross the cap (nothing is recorded); the message gives
                the requested, remaining and missing RDP.
        """
        rdp = self._worst_case(count)
        with self._lock:
            self._filter.charge(
                rdp, what=f"this party's local cap: batch {batch_id} ({count} queries, worst case)"
            )
            entry = {
                "batch_id": batch_id,
                "attempt": attempt,
                "count": count,
                "rdp": rdp,
                "time": time.time(),
                "config_hash": self._hash,
            }
            with self.path.open("a") as handle:
                handle.write(json.dumps(entry, sort_keys=True) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            self.batches += 1
            self.queries += count
            return self.epsilon
