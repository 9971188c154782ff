"""A teacher party's own worst-case ε cap, enforced locally (DESIGN §4).

A hospital does not have to trust the guardian's ledger to bound its exposure: before releasing any share
it charges, on a durable record of its own, the worst case the batch could cost (every query screened and
answered) at the federation's public parameters, and refuses once the cap would be crossed. Every set of
shares it hands out is counted — a re-collected batch counts again — so the record only ever over-counts.

The record is created once, by an explicit :meth:`LocalCap.init` (``capc teacher init-cap``, or
``capc teacher serve --train-missing`` setting up a new site, or ``capc local up`` for its simulated
hospitals), never on the fly: a record that went missing would otherwise restart the party at ε 0 and
silently forget what it already released. Opening a missing record is refused.

**One process per record.** A cap is one process's bound only if no other process charges the same record:
two teachers on one record (an overlapping restart, two containers on one volume, a hand-started copy) would
each admit up to the cap from their own view of it. So the process that charges holds an exclusive lock
(``flock``) on ``RECORD.lock`` for as long as it lives — the kernel drops it when the process exits, even by
``kill -9`` — and writes there who holds it; a second one is refused at start with that holder's pid, host
and start time (:class:`~capc_common.errors.UnavailableError`, exit code 4). It also re-reads the record
before every charge, so anything appended behind its back (a file system that ignores ``flock``) is counted.

**Its own order.** The record is a Rényi filter at the order its first line names, fixed when it is created
(:func:`~capc_common.federation.cap_order`: where the plan's worst case costs least; a record without one
charges at the federation's order, as records did before they named it). Every charge is the worst case of
its batch *at that order*, from the mechanism (:class:`~capc_common.federation.Exposure`).

**The hospital's lifetime.** When the site has a lifetime ledger, each charge is also made there
(:attr:`LocalCap.lifetime`) after this record admits it and before it is written here, so the shares leave
only once both hold it: a crash between the two over-counts the one that was written, never under-counts.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from capc_common.durable import appended_lines, create_durably
from capc_common.errors import InputError, IntegrityError, UnavailableError
from capc_common.federation import Exposure, FederationConfig, exposure_of
from capc_common.privacy import RenyiFilter
from capc_services.common.process import describe


class ChargedElsewhere(Protocol):
    """Where a charge this record admitted is also made before it is written here (the site's lifetime)."""

    def charge(self, *, batch_id: str, attempt: int, count: int, cap_lines: int) -> None:
        """Durably record the charge, or refuse it (nothing recorded)."""


@dataclass(frozen=True)
class CapLine:
    """One charge line of the record: the config it was written under, its queries, its RDP and the batch (or
    release) it charged."""

    config_hash: str
    count: int
    rdp: float
    batch_id: str = ""


class LocalCap:
    """Durable, append-only record of the shares a teacher party released, with its ε cap.

    Args:
        path: the record (JSON lines; created with its directory).
        config: the federation config (public parameters of the cost).
        epsilon_cap: the most ε this party accepts, at the federation's δ and the record's order.
        exposure: what each charge costs at any order (default: :func:`~capc_common.federation.exposure_of`
            ``config``, which a release federation cannot build without its protocol).
        exclusive: hold the record's lock until :meth:`close` (the process that charges); ``False`` opens
            a read-only view (a preflight check beside a running teacher), whose :meth:`charge` refuses.

    Raises:
        InputError: a non-positive cap.
        IntegrityError: the record is missing (see :meth:`init`), belongs to another federation config or
            is corrupt.
        UnavailableError: another process holds the record (``exclusive``); the message names it.

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
        exposure: Exposure | None = None,
        exclusive: bool = True,
    ) -> None:
        if not epsilon_cap > 0:
            raise InputError(f"the local epsilon cap must be > 0, got {epsilon_cap}")
        self.path = Path(path)
        self.cap = float(epsilon_cap)
        self.exposure = exposure or exposure_of(config)
        self._hash = config.config_hash()
        self._accepted = {self._hash, *config.previous_hashes}
        self._lock = threading.Lock()
        self.batches = 0
        self.queries = 0
        self.lines: list[CapLine] = []
        self.lifetime: ChargedElsewhere | None = None
        self._read = 0  # bytes of the record folded in so far
        self._lines = 0
        self._holder: IO[str] | None = None
        self._missing_check()
        self.order = _order_of(self.path, default=config.budget.order)
        self._filter = RenyiFilter.for_budget(
            epsilon=epsilon_cap, delta=config.budget.delta, order=self.order
        )
        if exclusive:
            self._holder = _hold(self.path)
        try:
            self._refresh()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the record's lock (another process may then charge it); safe to call twice."""
        if self._holder is not None:
            self._holder.close()  # closing the descriptor drops the flock
            self._holder = None

    def __enter__(self) -> LocalCap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def init(cls, path: str | Path, *, config: FederationConfig, order: float | None = None) -> Path:
        """Create the empty record of a new site (its first line names the federation and the order it
        charges at: ``order``, or the federation's); once only.

        Raises:
            InputError: a record already exists there (it is never re-created: it holds what was spent).
        """
        target = Path(path)
        header = {
            "kind": "init",
            "config_hash": config.config_hash(),
            "order": config.budget.order if order is None else float(order),
            "time": time.time(),
        }
        if not create_durably(target, json.dumps(header, sort_keys=True)):
            raise InputError(
                f"the cap record {target} already exists; it is never re-created (it holds the ε this party "
                "has released)"
            )
        return target

    def _missing_check(self) -> None:
        if not self.path.is_file():
            raise IntegrityError(
                f"the cap record {self.path} does not exist. If this party has answered queries before, "
                "restore the record from a backup: starting afresh would forget the ε it already released. "
                "For a new site, create it once with `capc teacher init-cap --site FILE`"
            )

    def _refresh(self) -> None:
        """Fold in the lines appended to the record since the last look (all of them the first time)."""
        self._missing_check()
        self._read, lines = appended_lines(self.path, offset=self._read)
        for line in lines:
            self._lines += 1
            number = self._lines
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
                charged = CapLine(
                    str(entry["config_hash"]),
                    int(entry["count"]),
                    float(entry["rdp"]),
                    str(entry.get("batch_id", "")),
                )
                self._filter.charges.append(charged.rdp)  # admitted when it was written
                self.lines.append(charged)
                self.queries += charged.count
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
    def answered(self) -> int:
        """How many distinct batches (or releases) of the federation's stream this record charged: a batch
        collected again after a quorum abort is charged again but answered once. The stream is handed out
        in order, so what is left of the plan is at most its charges after this many."""
        return len({line.batch_id for line in self.lines})

    @property
    def rdp(self) -> float:
        """Worst-case RDP spent so far at the record's order."""
        return self._filter.spent_rdp

    @property
    def delta(self) -> float:
        """The δ the cap is stated at (the federation's)."""
        return self._filter.delta

    def charge(self, *, batch_id: str, attempt: int, count: int) -> float:
        """Durably count one batch's worst case before its shares leave; returns ε after it.

        Raises:
            BudgetExhaustedError: the batch would cross the cap (nothing is recorded); the message gives
                the requested, remaining and missing RDP.
            InputError: this is a read-only view (``exclusive=False``).
        """
        rdp = self.exposure.rdp(count, self.order)
        with self._lock:
            if self._holder is None:
                raise InputError(
                    f"the cap record {self.path} was opened read-only (or closed); it cannot charge"
                )
            self._refresh()
            self._filter.charge(
                rdp, what=f"this party's local cap: batch {batch_id} ({count} queries, worst case)"
            )
            if self.lifetime is not None:
                try:
                    self.lifetime.charge(
                        batch_id=batch_id, attempt=attempt, count=count, cap_lines=self.batches + 1
                    )
                except BaseException:
                    self._filter.charges.pop()  # refused there: nothing is recorded here either
                    raise
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
                self._read = handle.tell()
            self._lines += 1
            self.batches += 1
            self.queries += count
            self.lines.append(CapLine(self._hash, count, rdp, batch_id))
            return self.epsilon


def _order_of(record: Path, *, default: float) -> float:
    """The order the record charges at, from its first line (``default``: a record that names none)."""
    with record.open("rb") as handle:
        first = handle.readline()
    if not first.strip():  # a record whose creation was cut short: it charged nothing yet
        return default
    try:
        return float(json.loads(first).get("order", default))
    except (ValueError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{record} line 1 is corrupt ({exc}); restore it from backup") from None


def _hold(record: Path) -> IO[str]:
    """Take the exclusive lock of ``record`` for this process and write who holds it into the lock file.

    Raises:
        UnavailableError: another process holds it (its pid, host and start time are in the message).
    """
    handle = open(record.with_name(record.name + ".lock"), "a+", encoding="utf-8")  # noqa: SIM115 (held)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not yet said who it is"
        handle.close()
        raise UnavailableError(
            f"another process of this party holds its cap record {record}: {holder}. Two processes on one "
            "cap record would each admit up to the cap; stop that process (or wait until it exits) before "
            "starting this one"
        ) from None
    handle.truncate(0)
    handle.write(describe() + "\n")
    handle.flush()  # not fsynced: the lock itself is the kernel's, and it dies with the process anyway
    return handle
