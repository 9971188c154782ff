"""The durable, two-phase privacy budget ledger the guardian charges: a Rényi filter on SQLite.

**Two phases.** ``reserve`` records a batch's *worst case* (every query screened and answered) before any
work; it is refused with :class:`BudgetExhaustedError` if the reserved and spent total would cross the
filter's budget. ``settle`` replaces the reservation by the actual cost (≤ the reservation) and returns only
when that is on disk; ``release`` cancels a batch that revealed nothing. A reservation that is never settled
— the guardian crashed — stays counted at its worst case: a crash can over-count spend, never under-count it.

**One computation per batch.** ``begin`` records, durably and before any output of the batch is decoded, the
nonce of the one computation that may reveal it. From that row on the batch is charged: it is settled once,
by that computation's nonce, or held at its worst case for ever — never released, never computed again (a
second ``begin``, a settle with another nonce, or a repeated settle is refused). So two guardian processes
sharing one ledger cannot reveal one batch twice for one charge. ``settle`` may store an opaque *receipt*
in the same transaction (the guardian keeps there the label decoding bits it is about to send, so it can
send the same bits again to a student that crashed before storing its labels).

**Releases.** A release federation's guardian charges each release with :meth:`BudgetLedger.charge`: its
reserve, compute and settle rows and its receipt in one transaction, all of them or none. A release's params
name its round of the plan (``release: {round, planned}``); the chain's recomputation refuses a round outside
the plan or charged twice, so no ledger holds more releases than planned (:meth:`BudgetLedger.release_plan`).
:meth:`BudgetLedger.deposit` keeps, once, what the student revealed from a settled release.

**Storage.** One SQLite file in WAL mode with ``synchronous=FULL`` (each commit is fsynced before it
returns). Entries are append-only (triggers reject UPDATE and DELETE) and hash-chained: each row stores
``SHA-256(previous hash ‖ canonical JSON of the row)``, starting from the hash of the ledger's parameters, so
:meth:`BudgetLedger.verify` detects any edited, removed or reordered row and recomputes every total.

**Parameters are checked when the ledger opens.** The ``meta`` row (ε, δ, order, budget, config) must hash to
the stored genesis, its config to its config hash, and the first entry must link to that genesis:
:meth:`BudgetLedger.open` refuses (``IntegrityError``) a ledger whose parameters were edited, so neither
``capc budget show`` nor the guardian ever trusts an edited budget.

**Derived totals are recomputed, never trusted.** The ``state`` table (running totals and the chain head) is
a cache for other readers: triggers only let it move one entry at a time, to the newest entry's hash, and
every :class:`BudgetLedger` recomputes the totals itself from the chained entries — all of them when it
opens, then each new row (from any process) as it appears. A write first checks the stored totals against
the recomputed ones and refuses (``IntegrityError``, nothing charged) on any difference or broken link, so an
edited ``state`` row can neither hide spent budget nor make the filter admit a batch the entries refuse.

**A full or read-only volume is not damage.** SQLite rolls back a transaction it cannot write (SQLITE_FULL,
SQLITE_READONLY, an I/O error), so the chain stays as it was; such a write raises
:class:`~capc_common.errors.StorageError` (exit code 7) naming the volume and the space needed, never
"restore a backup". Before the commit points that must not fail half-way — a reservation (whose batch will
begin and settle), a computation's ``begin`` (whose batch must settle) and a release's ``charge`` (whose total
the student then deposits) — the ledger checks that its volume has room for the rows still to come, so a
nearly full volume refuses new work before anything is decoded. A
ledger on a volume mounted read-only opens read-only (reads and ``verify`` go on) and writes again once the
volume is read-write, without a restart.

**Concurrency.** Every write is one ``BEGIN IMMEDIATE`` transaction that reads the totals, checks the
filter and appends, so several processes (or threads) sharing the file serialise and can never overspend;
``kill -9`` at any point leaves either the whole transaction or none of it.

**Exact totals.** Costs are stored as the given float and as an integer number of units of 2^-48 nats,
rounded *up*; the filter compares integers, so sums never drift and verification is exact.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import os
import re
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from capc_common.durable import fsync_dir
from capc_common.errors import (
    BudgetExhaustedError,
    InputError,
    IntegrityError,
    StorageError,
    UnavailableError,
)
from capc_common.privacy.accountant import ConfidentGNMaxAccountant
from capc_common.privacy.analysis import rdp_budget_at_order
from capc_common.privacy.analysis._checks import count, non_negative, positive, probability
from capc_common.privacy.filter import RenyiFilter, refusal_message
from capc_common.privacy.planning import plan
from capc_common.storage import classify, read_only, require_space

__all__ = ["MAX_SEQ", "BatchRecord", "BudgetLedger", "Entry", "VerificationReport"]

FORMAT = 1
UNITS_PER_NAT = 2**48
#: The largest sequence number SQLite can store (a signed 64-bit integer).
MAX_SEQ = 2**63 - 1
_MAX_BUDGET_RDP = 2.0**14  # keeps every total far inside SQLite's signed 64-bit integers
_HEX64 = re.compile(r"[0-9a-f]{64}")

Kind = Literal["reserve", "compute", "settle", "release", "membership"]
_PHASE = {"reserve": 0, "settle": 1, "release": 1, "compute": 2, "membership": 3}

_SCHEMA = """
CREATE TABLE meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    format INTEGER NOT NULL,
    created REAL NOT NULL,
    epsilon_limit REAL NOT NULL,
    delta REAL NOT NULL,
    rdp_order REAL NOT NULL,
    budget_rdp REAL NOT NULL,
    budget_units INTEGER NOT NULL,
    config TEXT NOT NULL,
    config_hash TEXT NOT NULL,
    genesis TEXT NOT NULL
);
CREATE TABLE entries (
    seq INTEGER PRIMARY KEY,
    batch_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('reserve', 'compute', 'settle', 'release', 'membership')),
    phase INTEGER NOT NULL CHECK (phase IN (0, 1, 2, 3)),
    queries INTEGER NOT NULL,
    answered INTEGER NOT NULL,
    parties TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    params TEXT NOT NULL,
    rdp REAL NOT NULL,
    units INTEGER NOT NULL,
    detail TEXT NOT NULL,
    actor TEXT NOT NULL,
    time REAL NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    UNIQUE (batch_id, phase)
);
CREATE TABLE state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL,
    head TEXT NOT NULL,
    spent_units INTEGER NOT NULL,
    reserved_units INTEGER NOT NULL,
    queries INTEGER NOT NULL,
    answered INTEGER NOT NULL,
    settled INTEGER NOT NULL,
    open INTEGER NOT NULL,
    released INTEGER NOT NULL
);
CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
CREATE TRIGGER meta_no_update BEFORE UPDATE ON meta
    BEGIN SELECT RAISE(ABORT, 'ledger parameters are immutable'); END;
CREATE TRIGGER meta_no_delete BEFORE DELETE ON meta
    BEGIN SELECT RAISE(ABORT, 'ledger parameters are immutable'); END;
CREATE TRIGGER state_follows_entries BEFORE UPDATE ON state
    WHEN NEW.seq != OLD.seq + 1
      OR NEW.seq != (SELECT MAX(seq) FROM entries)
      OR NEW.head IS NOT (SELECT hash FROM entries WHERE seq = NEW.seq)
    BEGIN SELECT RAISE(ABORT, 'ledger totals move only with a new entry'); END;
CREATE TRIGGER state_no_delete BEFORE DELETE ON state
    BEGIN SELECT RAISE(ABORT, 'ledger totals are derived from the entries'); END;
"""
# Receipts of settled batches (see ``settle``); added to ledgers created before they existed by ``_upgrade``.
_RECEIPTS = """
CREATE TABLE IF NOT EXISTS receipts (
    batch_id TEXT PRIMARY KEY,
    computation TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE TRIGGER IF NOT EXISTS receipts_no_update BEFORE UPDATE ON receipts
    BEGIN SELECT RAISE(ABORT, 'ledger receipts are append-only'); END;
CREATE TRIGGER IF NOT EXISTS receipts_no_delete BEFORE DELETE ON receipts
    BEGIN SELECT RAISE(ABORT, 'ledger receipts are append-only'); END;
"""
_OLD_KINDS = "CHECK (kind IN ('reserve', 'settle', 'release'))"
_OLD_PHASES = "CHECK (phase IN (0, 1))"
# The schema before membership entries (``_upgrade`` widens it the same way).
_V2_KINDS = "CHECK (kind IN ('reserve', 'compute', 'settle', 'release'))"
_V2_PHASES = "CHECK (phase IN (0, 1, 2))"

_ENTRY_COLUMNS = (
    "seq, batch_id, kind, phase, queries, answered, parties, mechanism, params, rdp, units, detail, actor, "
    "time, prev_hash, hash"
)


def _canonical(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, floats in shortest round-trip form."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _units(rdp: float) -> int:
    """RDP in units of 2^-48 nats, rounded up (so the ledger can only over-count)."""
    return math.ceil(rdp * UNITS_PER_NAT)


@dataclass(frozen=True)
class Entry:
    """One append-only ledger row.

    Attributes:
        seq: position in the chain (1, 2, …).
        batch_id: the batch the row is about.
        kind: ``"reserve"``, ``"compute"``, ``"settle"`` or ``"release"``.
        queries: queries in the batch.
        answered: queries answered (settle rows; 0 otherwise).
        parties: teacher parties involved.
        mechanism: mechanism name.
        params: mechanism parameters of the batch.
        rdp: the cost at the ledger's order: worst case (reserve), actual (settle), 0 (compute, release).
        units: ``rdp`` in 2^-48-nat units, rounded up.
        detail: the computation's nonce (compute and its settle), the reason (release), else empty.
        actor: identity of whoever wrote the row.
        time: UNIX time of the write.
        prev_hash: hash of the previous row (or of the ledger parameters for the first row).
        hash: this row's hash.
    """

    seq: int
    batch_id: str
    kind: str
    queries: int
    answered: int
    parties: tuple[str, ...]
    mechanism: str
    params: dict[str, Any]
    rdp: float
    units: int
    detail: str
    actor: str
    time: float
    prev_hash: str
    hash: str

    def hashed_fields(self) -> dict[str, Any]:
        """The fields covered by :attr:`hash` (everything but the hash itself)."""
        fields = asdict(self)
        del fields["hash"]
        fields["parties"] = list(self.parties)
        return fields

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the row."""
        return {**self.hashed_fields(), "hash": self.hash}


@dataclass(frozen=True)
class BatchRecord:
    """Where one batch stands, from its rows.

    Attributes:
        batch_id: the batch.
        state: ``"reserved"`` (open, or its guardian died: counted at worst case), ``"computing"`` (a
            computation began: charged, settled by it or held at the worst case, never released),
            ``"settled"`` or ``"released"``.
        queries: queries in the batch.
        answered: queries answered (0 unless settled).
        reserved_rdp: the worst case reserved.
        actual_rdp: the settled cost (``None`` unless settled).
        parties: parties named at reservation.
        mechanism: mechanism name.
        params: mechanism parameters.
        detail: the release reason, if released.
        opened: time of the reservation.
        closed: time of the settle/release row, if any.
        computation: the nonce of the computation that began on the batch, if any.
    """

    batch_id: str
    state: str
    queries: int
    answered: int
    reserved_rdp: float
    actual_rdp: float | None
    parties: tuple[str, ...]
    mechanism: str
    params: dict[str, Any]
    detail: str
    opened: float
    closed: float | None
    computation: str | None = None


@dataclass
class VerificationReport:
    """Result of :meth:`BudgetLedger.verify`.

    Attributes:
        ok: no problem found.
        entries: rows checked.
        problems: what is wrong, one line each.
        head: hash of the last row (pin it to detect a rewritten file later).
        totals: totals recomputed from the rows.
        expected_head_at: where the pinned head given to :meth:`BudgetLedger.verify` was found (0: the
            genesis; ``None``: not asked, or not found — a problem).
    """

    ok: bool
    entries: int
    problems: list[str] = field(default_factory=list)
    head: str = ""
    totals: dict[str, Any] = field(default_factory=dict)
    expected_head_at: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the report."""
        return asdict(self)


_TOTALS = ("spent_units", "reserved_units", "queries", "answered", "settled", "open", "released")


class _Chain:
    """The totals and chain head recomputed from the entries, one row at a time, noting every inconsistency.

    The single place that knows what each kind of row does to the totals: :meth:`BudgetLedger.verify` runs
    it over every row, and each ledger instance keeps one up to date as the rows appear, instead of trusting
    the stored ``state`` row.
    """

    def __init__(
        self, genesis: str, budget_units: int, *, watch: str | None = None, config_hash: str = ""
    ) -> None:
        self.head = genesis
        #: The federation config in force: the ledger's own, then each membership entry's new one.
        self.config_hash = config_hash
        self.changes: list[Entry] = []  # the membership entries, in chain order
        self.seq = 0
        self.watch = watch
        #: Where the watched hash was found: 0 for the genesis, else its entry's sequence number.
        self.watched_at: int | None = 0 if watch == genesis else None
        self.budget_units = budget_units
        self.totals = dict.fromkeys(_TOTALS, 0)
        self.open_batches: dict[str, Entry] = {}
        self.computing: dict[str, str] = {}  # batch -> nonce of the computation that began on it
        self.closed: set[str] = set()
        self.problems: list[str] = []
        #: A release plan's size and each of its rounds' batch (reservations whose params carry
        #: ``release: {round, planned}``), and how many of them settled.
        self.releases_planned: int | None = None
        self.release_rounds: dict[int, str] = {}
        self.releases_settled = 0

    def apply(self, entry: Entry) -> None:
        """Account for the next row (appending a problem for each inconsistency it shows)."""
        problems, totals = self.problems, self.totals
        where = f"entry {entry.seq} ({entry.kind} {entry.batch_id})"
        if entry.seq != self.seq + 1:
            problems.append(f"{where}: sequence gap, expected {self.seq + 1}")
        if entry.prev_hash != self.head:
            problems.append(f"{where}: does not link to the previous entry")
        if _entry_hash(entry) != entry.hash:
            problems.append(f"{where}: hash mismatch (the row was edited)")
        self.seq, self.head = self.seq + 1, entry.hash
        if entry.hash == self.watch:
            self.watched_at = entry.seq
        if entry.units != _units(entry.rdp):
            problems.append(f"{where}: units {entry.units} do not match rdp {entry.rdp!r}")
        if entry.kind == "reserve":
            if entry.batch_id in self.open_batches or entry.batch_id in self.closed:
                problems.append(f"{where}: batch reserved twice")
            self.open_batches[entry.batch_id] = entry
            totals["reserved_units"] += entry.units
            totals["queries"] += entry.queries
            totals["open"] += 1
            if totals["spent_units"] + totals["reserved_units"] > self.budget_units:
                problems.append(f"{where}: the reservation crossed the budget")
            self._release_round(entry, where)
            return
        if entry.kind == "membership":
            self._membership(entry, where)
            return
        if entry.kind == "compute":
            if entry.batch_id not in self.open_batches:
                problems.append(f"{where}: computes a batch that is not open")
            elif entry.batch_id in self.computing:
                problems.append(f"{where}: a second computation of the batch")
            if entry.units:
                problems.append(f"{where}: a computation row must cost nothing")
            self.computing[entry.batch_id] = entry.detail
            return
        opening = self.open_batches.pop(entry.batch_id, None)
        if opening is None:
            problems.append(f"{where}: closes a batch that is not open")
            return
        self.closed.add(entry.batch_id)
        totals["reserved_units"] -= opening.units
        totals["open"] -= 1
        began = self.computing.pop(entry.batch_id, None)
        if entry.kind == "settle":
            if entry.units > opening.units or entry.answered > opening.queries:
                problems.append(f"{where}: settles above its reservation")
            if began is not None and entry.detail != began:
                problems.append(f"{where}: settled by another computation than the one that began")
            totals["spent_units"] += entry.units
            totals["answered"] += entry.answered
            totals["settled"] += 1
            self.releases_settled += _release_of(opening) is not None
        else:
            if entry.units:
                problems.append(f"{where}: a release must cost nothing")
            if began is not None:
                problems.append(f"{where}: released after its computation began (it must stay charged)")
            totals["queries"] -= opening.queries
            totals["released"] += 1
            plan = _release_of(opening)
            if plan is not None and self.release_rounds.get(plan[0]) == entry.batch_id:
                del self.release_rounds[plan[0]]  # it revealed nothing: the round may be charged again

    def _release_round(self, entry: Entry, where: str) -> None:
        """A reservation of a planned release: its round lies in the plan, the plan is the ledger's one, and
        no other live batch holds the round — so a ledger never charges more releases than planned, nor one
        round twice."""
        if "release" not in entry.params:
            return
        plan = _release_of(entry)
        if plan is None:
            self.problems.append(f"{where}: a release reservation without a valid round and plan")
            return
        round_, planned = plan
        if self.releases_planned is not None and planned != self.releases_planned:
            self.problems.append(
                f"{where}: plans {planned} releases, the ledger's plan {self.releases_planned}"
            )
        if not 0 <= round_ < planned:
            self.problems.append(f"{where}: release round {round_} is outside the plan's {planned} releases")
        held = self.release_rounds.get(round_)
        if held is not None:
            self.problems.append(f"{where}: release round {round_} is charged twice (batch {held} holds it)")
        self.releases_planned = planned if self.releases_planned is None else self.releases_planned
        self.release_rounds[round_] = entry.batch_id

    def _membership(self, entry: Entry, where: str) -> None:
        """A membership entry: it costs nothing, continues the config in force, names the new one by its
        hash, carries the admin's authorisation, and finds no batch reserved under the old membership open
        (the change releases those first; batches already computing may still settle)."""
        change, problems = entry.params, self.problems
        if entry.units or entry.rdp or entry.queries or entry.answered:
            problems.append(f"{where}: a membership entry must cost nothing")
        if change.get("from") != self.config_hash:
            problems.append(
                f"{where}: changes federation config {str(change.get('from'))[:16]}, but "
                f"{self.config_hash[:16]} is in force"
            )
        config, new = change.get("config"), change.get("to")
        if not isinstance(config, dict) or not isinstance(new, str) or _sha256(_canonical(config)) != new:
            problems.append(f"{where}: the new federation config does not match its hash")
        if not isinstance(change.get("mac"), str) or not _HEX64.fullmatch(change["mac"]):
            problems.append(f"{where}: carries no admin authorisation")
        waiting = sorted(b for b in self.open_batches if b not in self.computing)
        if waiting:
            problems.append(f"{where}: batches {waiting[:5]} reserved under the previous membership are open")
        self.config_hash = str(new)
        self.changes.append(entry)

    def state_problems(self, state: Mapping[str, Any]) -> list[str]:
        """How the stored ``state`` row differs from these recomputed figures (empty: it agrees)."""
        problems = []
        diff = {k: (state[k], self.totals[k]) for k in _TOTALS if state[k] != self.totals[k]}
        if diff:
            problems.append(f"stored totals differ from the recomputed ones (stored, recomputed): {diff}")
        if state["seq"] != self.seq or state["head"] != self.head:
            problems.append("stored chain head does not match the last entry")
        return problems


def _text(name: str, value: str, *, limit: int = 256) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise InputError(f"{name} must be a non-empty string of at most {limit} characters, got {value!r}")
    return value


def _json_object(name: str, value: Mapping[str, Any]) -> str:
    if not isinstance(value, Mapping):
        raise InputError(f"{name} must be a mapping, got {type(value).__name__}")
    try:
        return _canonical(dict(value))
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be JSON-serialisable with finite numbers: {exc}") from exc


class BudgetLedger:
    """A SQLite-backed Rényi filter with two-phase, idempotent, hash-chained charges.

    Create with :meth:`create`, open with :meth:`open` (or :meth:`open_or_create` for a service that
    restarts). One instance may be shared by threads; several processes may open the same file.
    """

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        #: Opened on a read-only volume: reads only, until the volume is read-write again (see ``_write``).
        self._read_only = read_only(path)
        self._lock = threading.RLock()
        row = self._db.execute(f"SELECT {', '.join(_META_KEYS)} FROM meta WHERE id = 1").fetchone()
        if row is None:
            raise IntegrityError(f"{path} has no ledger parameters; it is not a complete budget ledger")
        row = _typed(row, _META_TYPES, f"{path}'s ledger parameters")
        (fmt, self.created, self.epsilon_limit, self.delta, self.order, self.budget_rdp, self.budget_units,
         config, self.config_hash, self.genesis) = row  # fmt: skip
        if fmt != FORMAT:
            raise IntegrityError(f"{path} is ledger format {fmt}; this version reads format {FORMAT}")
        problems = _meta_problems(dict(zip(_META_KEYS, row, strict=True)), self._db)
        if problems:
            raise IntegrityError(
                f"ledger {path}'s parameters were edited: {'; '.join(problems)}. Its budget cannot be "
                "trusted; restore the ledger from a backup"
            )
        self.config: dict[str, Any] = json.loads(config)
        #: The filter's parameters (the ledger keeps the history on disk, not in ``filter.charges``).
        self.filter = RenyiFilter(
            order=self.order, epsilon=self.epsilon_limit, delta=self.delta, budget_rdp=self.budget_rdp
        )
        # Totals recomputed from every entry (the stored ``state`` row is checked against them, never used).
        self._chain = self._new_chain()
        try:
            self._catch_up(self._db)
        except (sqlite3.DatabaseError, IntegrityError) as exc:  # opens for `verify`; refuses every write
            self._chain.problems.append(f"the entries cannot be read past entry {self._chain.seq}: {exc}")
        #: The federation config this instance charges for: the one in force when it opened. A membership
        #: change (by this instance or another process) makes it refuse new reservations (reopen it).
        self._bound = self._chain.config_hash

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        if read_only(path):
            # SQLite cannot create a WAL index on a read-only volume. With no write-ahead log left the file is
            # complete and cannot change while the volume stays read-only: ``immutable`` reads it without an
            # index; a leftover log (a crash) is read through its index, which the crash left behind.
            wal = Path(f"{path}-wal")
            flags = "mode=ro" if wal.exists() and wal.stat().st_size else "mode=ro&immutable=1"
            return sqlite3.connect(
                f"{path.absolute().as_uri()}?{flags}",
                uri=True,
                isolation_level=None,
                timeout=60.0,
                check_same_thread=False,
            )
        db = sqlite3.connect(path, isolation_level=None, timeout=60.0, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        epsilon_limit: float,
        delta: float,
        config: Mapping[str, Any],
        order: float | None = None,
        workload: ConfidentGNMaxAccountant | None = None,
        answer_rate: float = 1.0,
    ) -> BudgetLedger:
        """Create a new ledger file for an (ε, δ) budget enforced by a Rényi filter at ``order``.

        The file is built under a temporary name and linked into place only when complete, so a crash
        leaves either no ledger or a whole one, and an existing file is never overwritten.

        Args:
            path: where the ledger file goes (must not exist).
            epsilon_limit: ε of the budget.
            delta: δ of the budget.
            config: mechanism parameters / federation identity; stored, and hashed into the chain.
            order: the filter's order; if omitted, ``workload`` must be given and the planner picks the order
                that fits the most queries at ``answer_rate``.
            workload: the mechanism's accountant (its parameters, not its history), used only when
                ``order`` is omitted.
            answer_rate: expected fraction of queries answered, for the planner.

        Raises:
            InputError: the file exists, a parameter is invalid, or (ε, δ) cannot be met at ``order``.
        """
        target = Path(path)
        eps = positive("epsilon_limit", epsilon_limit)
        d = probability("delta", delta)
        config_json = _json_object("config", config)
        if order is None:
            order = cls._planned_order(workload, epsilon=eps, delta=d, answer_rate=answer_rate)
        lam = positive("order", order)
        budget = rdp_budget_at_order(epsilon=eps, delta=d, order=lam)
        if budget > _MAX_BUDGET_RDP:
            raise InputError(
                f"the budget is {budget:g} nats of RDP at order {lam:g}; at most 2^14 is supported"
            )
        if target.exists():
            raise InputError(f"{target} already exists; open it with BudgetLedger.open, or pick a new path")
        if not target.parent.is_dir():
            raise InputError(f"directory {target.parent} does not exist; create it first")
        meta = {
            "format": FORMAT,
            "created": time.time(),
            "epsilon_limit": eps,
            "delta": d,
            "rdp_order": lam,
            "budget_rdp": budget,
            "budget_units": math.floor(budget * UNITS_PER_NAT),
            "config": config_json,
            "config_hash": _sha256(config_json),
        }
        genesis = _sha256(_canonical(meta))
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            db = cls._connect(tmp)
            db.execute("BEGIN IMMEDIATE")
            for statement in (_SCHEMA + _RECEIPTS).split(";\n"):
                if statement.strip():
                    db.execute(statement)
            db.execute(
                "INSERT INTO meta VALUES (1, :format, :created, :epsilon_limit, :delta, :rdp_order, "
                ":budget_rdp, :budget_units, :config, :config_hash, :genesis)",
                {**meta, "genesis": genesis},
            )
            db.execute("INSERT INTO state VALUES (1, 0, ?, 0, 0, 0, 0, 0, 0, 0)", (genesis,))
            db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            try:
                os.link(tmp, target)
            except FileExistsError as exc:
                raise InputError(f"{target} was created by someone else meanwhile; open it instead") from exc
            fsync_dir(target.parent)
        except (sqlite3.Error, OSError) as exc:
            raise classify(exc, path=target, what="ledger") from None
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                leftover.unlink(missing_ok=True)
        return cls.open(target)

    @staticmethod
    def _planned_order(
        workload: ConfidentGNMaxAccountant | None, *, epsilon: float, delta: float, answer_rate: float
    ) -> float:
        if not isinstance(workload, ConfidentGNMaxAccountant):
            raise InputError(
                "give the filter order, or a ConfidentGNMaxAccountant workload for the planner to pick it "
                "(capc budget plan shows the order it would pick)"
            )
        p = workload.params()
        return float(
            plan(
                teachers=p["teachers"],
                classes=p["classes"],
                sigma1=p["sigma1"],
                sigma2=p["sigma2"],
                threshold=p["threshold"],
                epsilon=epsilon,
                delta=delta,
                answer_rate=answer_rate,
                noise=p["noise"],
            )["order"]
        )

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> BudgetLedger:
        """Open an existing ledger file, checking its parameters against their genesis hash and the chain.

        Raises:
            InputError: the file does not exist.
            IntegrityError: it is not a ledger of this format, or its parameters were edited.
        """
        target = Path(path)
        if not target.is_file():
            raise InputError(f"no budget ledger at {target}; create one first (BudgetLedger.create)")
        db: sqlite3.Connection | None = None
        try:
            db = cls._connect(target)
            ledger = cls(target, db)
        except (sqlite3.DatabaseError, IntegrityError, ValueError) as exc:
            if db is not None:
                db.close()
            if isinstance(exc, IntegrityError):
                raise
            if isinstance(exc, sqlite3.Error) and isinstance(
                problem := classify(exc, path=target, what="ledger"), StorageError | UnavailableError
            ):
                raise problem from None
            raise IntegrityError(
                f"{target} is not a readable budget ledger ({exc}); the file is damaged or not a ledger: "
                "restore it from a backup"
            ) from None
        with contextlib.suppress(sqlite3.DatabaseError):  # a damaged file stays as it is, for `verify`
            ledger._upgrade()
        return ledger

    @classmethod
    def open_or_create(
        cls,
        path: str | os.PathLike[str],
        *,
        epsilon_limit: float,
        delta: float,
        order: float,
        config: Mapping[str, Any],
    ) -> BudgetLedger:
        """Open the ledger at ``path`` if it exists and matches these parameters, else create it.

        Raises:
            IntegrityError: the existing ledger was created with another budget, order or config.
        """
        target = Path(path)
        if not target.exists():
            try:
                return cls.create(
                    target, epsilon_limit=epsilon_limit, delta=delta, order=order, config=config
                )
            except InputError:
                if not target.exists():
                    raise
        ledger = cls.open(target)
        config_hash = _sha256(_json_object("config", config))
        wanted: dict[str, object] = {
            "epsilon_limit": float(epsilon_limit),
            "delta": float(delta),
            "order": float(order),
            "config_hash": config_hash,
        }
        found = {
            "epsilon_limit": ledger.epsilon_limit,
            "delta": ledger.delta,
            "order": ledger.order,
            "config_hash": ledger.config_hash_in_force,
        }
        differ = {k: (found[k], wanted[k]) for k in wanted if found[k] != wanted[k]}
        if differ:
            superseded = ledger.superseded(config_hash)
            ledger.close()
            if superseded is not None and list(differ) == ["config_hash"]:
                raise IntegrityError(
                    f"the ledger at {target}: {superseded}; this federation.yaml is the earlier config: "
                    "install the new federation.yaml"
                )
            detail = "; ".join(f"{k}: ledger has {a!r}, asked for {b!r}" for k, (a, b) in differ.items())
            raise IntegrityError(
                f"the ledger at {target} belongs to another budget or federation ({detail}); point to the "
                "right file or start a new ledger. To add or retire a teacher party while keeping this "
                "ledger, record the change with the guardian's admin API (capc guardian membership)"
            )
        return ledger

    def _upgrade(self) -> None:
        """Give a ledger created before computation (or membership) rows existed their kinds, phases and the
        receipts table.

        The change only widens two CHECK constraints (every existing row already satisfies the wider ones),
        which SQLite documents as safe to do by editing the schema text in place
        (https://www.sqlite.org/lang_altertable.html#otheralter); it touches no row, so the hash chain and
        the genesis are unchanged. A ledger that cannot be written (a read-only copy) is left as it is.
        """
        with self._lock:
            (sql,) = self._db.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'entries'"
            ).fetchone()
            wider = sql.replace(_OLD_KINDS, _V2_KINDS).replace(_OLD_PHASES, _V2_PHASES)
            wider = wider.replace(_V2_KINDS, _V2_KINDS.replace("'release'", "'release', 'membership'"))
            wider = wider.replace(_V2_PHASES, "CHECK (phase IN (0, 1, 2, 3))")
            if wider == sql:
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return
            try:
                (version,) = self._db.execute("PRAGMA schema_version").fetchone()
                self._db.execute("PRAGMA writable_schema = ON")
                self._db.execute(
                    "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'entries'", (wider,)
                )
                self._db.execute(f"PRAGMA schema_version = {int(version) + 1}")
                self._db.execute("PRAGMA writable_schema = OFF")
                for statement in _RECEIPTS.split(";\n"):
                    if statement.strip():
                        self._db.execute(statement)
            except BaseException:
                self._db.execute("PRAGMA writable_schema = OFF")
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        """Close the connection (committed data is already durable)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> BudgetLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed (fsynced) on success, rolled back on any error.

        Before the caller sees the database, the rows other writers appended are folded into the recomputed
        totals and the stored ``state`` row is checked against them; any inconsistency refuses the write.
        """
        with self._lock, _readable(self.path):
            self._writable()
            self._db.execute("BEGIN IMMEDIATE")
            seq: int | None = None
            try:
                self._catch_up(self._db)
                problems = self._chain.problems or self._chain.state_problems(self._state(self._db))
                if problems:
                    raise IntegrityError(
                        f"ledger {self.path} failed verification ({'; '.join(problems[:3])}); nothing was "
                        "charged. Run `capc budget verify` and restore the ledger from a backup"
                    )
                seq = self._chain.seq
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite rolled back by itself a commit it could not write
                    self._db.execute("ROLLBACK")
                if seq is not None and self._chain.seq != seq:  # an appended row was rolled back: recompute
                    self._chain = self._new_chain()
                    self._catch_up(self._db)
                raise

    def _writable(self) -> None:
        """Reopen for writing a ledger opened on a read-only volume, once the volume is read-write again.

        Raises:
            StorageError: the volume is still read-only (nothing is written).
        """
        if not self._read_only:
            return
        require_space(self.path, needed=0, what="ledger")  # still read-only: refused, nothing written
        self._db.close()
        self._db = self._connect(self.path)
        self._read_only = False

    def _room(self, commits: int, *, payload: int = 0) -> None:
        """Refuse to begin what the ledger's volume could not finish: ``commits`` more transactions, carrying
        ``payload`` bytes of receipts or deposits between them (beyond what a commit's pages hold: a release's
        receipt and total are as long as its vector).

        Raises:
            StorageError: the volume has less room than those commits need (or is read-only).
        """
        (page,) = self._db.execute("PRAGMA page_size").fetchone()
        pages = commits * _PAGES_PER_COMMIT + -(-payload // int(page))
        require_space(self.path, needed=pages * (int(page) + _WAL_FRAME_HEADER), what="ledger")

    def _new_chain(self, *, watch: str | None = None) -> _Chain:
        """An empty recomputation of this ledger's chain, from its genesis."""
        return _Chain(self.genesis, self.budget_units, watch=watch, config_hash=self.config_hash)

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """A read transaction: every statement inside sees the database as of its first read."""
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("ROLLBACK")

    def _catch_up(self, db: sqlite3.Connection) -> None:
        """Fold the rows appended since the last look (by anyone) into the recomputed totals."""
        for row in db.execute(
            f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE seq > ? ORDER BY seq", (self._chain.seq,)
        ):
            self._chain.apply(_row_entry(row))

    @staticmethod
    def _state(db: sqlite3.Connection) -> dict[str, Any]:
        row = db.execute(f"SELECT seq, head, {', '.join(_TOTALS)} FROM state WHERE id = 1").fetchone()
        if row is None:
            return {"seq": None, "head": None, **dict.fromkeys(_TOTALS)}
        return dict(zip(("seq", "head", *_TOTALS), row, strict=True))

    def _append(self, db: sqlite3.Connection, *, now: float, **fields: Any) -> Entry:
        draft = Entry(seq=self._chain.seq + 1, time=now, prev_hash=self._chain.head, hash="", **fields)
        entry = Entry(**{**asdict(draft), "parties": draft.parties, "hash": _entry_hash(draft)})
        db.execute(
            f"INSERT INTO entries ({_ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.seq, entry.batch_id, entry.kind, _PHASE[entry.kind], entry.queries,
                entry.answered, _canonical(list(entry.parties)), entry.mechanism, _canonical(entry.params),
                entry.rdp, entry.units, entry.detail, entry.actor, entry.time, entry.prev_hash, entry.hash,
            ),
        )  # fmt: skip
        self._chain.apply(entry)
        db.execute(
            f"UPDATE state SET seq = :seq, head = :head, {', '.join(f'{k} = :{k}' for k in _TOTALS)} "
            "WHERE id = 1",
            {"seq": self._chain.seq, "head": self._chain.head, **self._chain.totals},
        )
        return entry

    def _rows(self, db: sqlite3.Connection, batch_id: str) -> tuple[Entry | None, Entry | None, Entry | None]:
        """A batch's reserve, compute and settle/release rows (each None when absent)."""
        rows = {
            e.kind: e
            for e in map(
                _row_entry,
                db.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE batch_id = ?", (batch_id,)),
            )
        }
        return rows.get("reserve"), rows.get("compute"), rows.get("settle") or rows.get("release")

    # ------------------------------------------------------------------ the three operations
    def reserve(
        self,
        batch_id: str,
        *,
        queries: int,
        parties: Sequence[str],
        mechanism: str,
        params: Mapping[str, Any],
        worst_case_rdp: float,
        actor: str,
    ) -> Entry:
        """Reserve a batch's worst-case cost (RDP at the ledger's order) before any work on it.

        Idempotent: the same request for a known batch returns the original reservation (whatever happened
        to the batch since); a different request under the same id is refused.

        Raises:
            InputError: invalid arguments.
            IntegrityError: ``batch_id`` is already reserved with different parameters.
            BudgetExhaustedError: reserved + spent + this would cross the budget; nothing is written.
            UnavailableError: a membership change (here or by another process) replaced the federation config
                this instance was opened for; reopen it under the new one.
        """
        bid = _text("batch_id", batch_id)
        who = _text("actor", actor)
        mech = _text("mechanism", mechanism)
        n = count("queries", queries, minimum=1)
        names = tuple(_text("party", p) for p in parties)
        params_json = _json_object("params", params)
        rdp = non_negative("worst_case_rdp", worst_case_rdp)
        with self._lock, _readable(self.path):
            self._room(3)  # this reservation, the batch's begin and its settle
        with self._write() as db:
            return self._reserve(db, bid, n, names, mech, params_json, rdp, who)

    def _reserve(
        self,
        db: sqlite3.Connection,
        bid: str,
        n: int,
        names: tuple[str, ...],
        mech: str,
        params_json: str,
        rdp: float,
        who: str,
    ) -> Entry:
        """:meth:`reserve` inside the caller's write transaction."""
        units = _units(rdp)
        if self._chain.config_hash != self._bound:
            why = self.superseded(self._bound) or f"the federation config changed{self._since()}"
            raise UnavailableError(  # a guardian about to restart: the caller retries against the new one
                f"{why}; this ledger was opened for the earlier config, so it "
                "reserves nothing more: restart the guardian with the new federation.yaml"
            )
        opening, _, _ = self._rows(db, bid)
        if opening is not None:
            same = (opening.queries, opening.parties, opening.mechanism, _canonical(opening.params),
                    opening.units) == (n, names, mech, params_json, units)  # fmt: skip
            if not same:
                raise IntegrityError(
                    f"batch {bid} is already reserved with other parameters (queries {opening.queries}, "
                    f"mechanism {opening.mechanism}, rdp {opening.rdp:.6g}); use a fresh batch id"
                )
            return opening
        totals = self._chain.totals
        charged = totals["spent_units"] + totals["reserved_units"]
        if charged + units > self.budget_units:
            raise BudgetExhaustedError(
                refusal_message(
                    what=f"batch {bid} ({n} queries, worst case)",
                    requested=rdp,
                    remaining=(self.budget_units - charged) / UNITS_PER_NAT,
                    order=self.order,
                    epsilon=self.epsilon_limit,
                    delta=self.delta,
                )
            )
        return self._append(
            db, now=time.time(), batch_id=bid, kind="reserve", queries=n, answered=0,
            parties=names, mechanism=mech, params=json.loads(params_json), rdp=rdp, units=units,
            detail="", actor=who,
        )  # fmt: skip

    def begin(self, batch_id: str, *, computation: str, actor: str) -> Entry:
        """Record, durably, the one computation that may reveal a reserved batch — before it decodes anything.

        From this row on the batch is charged: settled once by ``computation`` or held at its worst case
        (a crash between decoding and settling); it can no longer be released or computed again.

        Args:
            batch_id: a reserved batch.
            computation: a fresh, unique nonce naming this computation (e.g. ``secrets.token_hex(16)``).
            actor: who computes.

        Raises:
            InputError: invalid arguments, or the batch was never reserved.
            IntegrityError: the batch was settled or released, or another computation began on it.
        """
        bid = _text("batch_id", batch_id)
        nonce = _text("computation", computation, limit=128)
        who = _text("actor", actor)
        with self._lock, _readable(self.path):
            self._room(2)  # this row and the settle it commits the batch to: refused before any decode
        with self._write() as db:
            return self._begin(db, bid, nonce, who)

    def _begin(self, db: sqlite3.Connection, bid: str, nonce: str, who: str) -> Entry:
        """:meth:`begin` inside the caller's write transaction."""
        opening, computing, closing = self._rows(db, bid)
        if opening is None:
            raise InputError(f"batch {bid} was never reserved; reserve it before computing it")
        if closing is not None:
            raise IntegrityError(
                f"batch {bid} was already {closing.kind}d; a finished batch is never computed again"
            )
        if computing is not None:
            raise IntegrityError(
                f"batch {bid} is already being computed (computation {computing.detail}, by "
                f"{computing.actor}); a batch is computed at most once"
            )
        return self._append(
            db, now=time.time(), batch_id=bid, kind="compute", queries=opening.queries, answered=0,
            parties=opening.parties, mechanism=opening.mechanism, params=opening.params, rdp=0.0, units=0,
            detail=nonce, actor=who,
        )  # fmt: skip

    def settle(
        self,
        batch_id: str,
        *,
        answered: int,
        actual_rdp: float,
        actor: str,
        computation: str | None = None,
        receipt: bytes | None = None,
    ) -> Entry:
        """Charge a reserved batch its actual cost (≤ the reservation), once; durable when this returns.

        Args:
            batch_id: the batch.
            answered: queries answered.
            actual_rdp: the cost at the ledger's order.
            actor: who settles.
            computation: the nonce given to :meth:`begin`; required once a computation began (a ledger
                driven without ``begin``, e.g. a central accounting run, passes None).
            receipt: opaque bytes kept with the settle row in the same transaction (:meth:`receipt`).

        Raises:
            InputError: unknown batch, answered > queries, or actual cost above the reservation.
            IntegrityError: the batch was released or already settled (a repeat is refused, never
                accepted silently), or ``computation`` is not the one that began on it.
        """
        bid = _text("batch_id", batch_id)
        who = _text("actor", actor)
        a = count("answered", answered)
        rdp = non_negative("actual_rdp", actual_rdp)
        nonce = None if computation is None else _text("computation", computation, limit=128)
        if receipt is not None and not isinstance(receipt, bytes | bytearray):
            raise InputError(f"receipt must be bytes, got {type(receipt).__name__}")
        with self._write() as db:
            return self._settle(db, bid, a, rdp, who, nonce, receipt)

    def _settle(
        self,
        db: sqlite3.Connection,
        bid: str,
        a: int,
        rdp: float,
        who: str,
        nonce: str | None,
        receipt: bytes | None,
    ) -> Entry:
        """:meth:`settle` inside the caller's write transaction."""
        units = _units(rdp)
        opening, computing, closing = self._rows(db, bid)
        if opening is None:
            raise InputError(f"batch {bid} was never reserved; reserve it before settling")
        if closing is not None:
            raise IntegrityError(
                f"batch {bid} was already {closing.kind}d; refusing to settle it again (a batch is "
                "settled at most once, by the computation that began on it)"
            )
        began = computing.detail if computing is not None else None
        if nonce != began:
            raise IntegrityError(
                f"batch {bid}: settle names computation {nonce or '(none)'}, but "
                + (f"computation {began} began on it" if began else "no computation began on it")
                + "; only the computation that began may settle it"
            )
        if a > opening.queries:
            raise InputError(f"batch {bid} has {opening.queries} queries; {a} cannot have been answered")
        if units > opening.units:
            raise InputError(
                f"batch {bid}: actual rdp {rdp:.6g} exceeds its reserved worst case {opening.rdp:.6g}; "
                "the reservation must cover every outcome (screening and GNMax for every query)"
            )
        entry = self._append(
            db, now=time.time(), batch_id=bid, kind="settle", queries=opening.queries, answered=a,
            parties=opening.parties, mechanism=opening.mechanism, params=opening.params, rdp=rdp,
            units=units, detail=nonce or "", actor=who,
        )  # fmt: skip
        if receipt is not None:
            db.execute("INSERT INTO receipts VALUES (?, ?, ?)", (bid, nonce or "", bytes(receipt)))
        return entry

    def charge(
        self,
        batch_id: str,
        *,
        parties: Sequence[str],
        mechanism: str,
        params: Mapping[str, Any],
        rdp: float,
        computation: str,
        actor: str,
        receipt: bytes,
    ) -> Entry:
        """Reserve, begin and settle a one-query batch in one transaction, with its receipt: a release, whose
        output no party can decode before the guardian sends it and which has no outcome to wait for. Either
        the whole charge and its receipt are durable when this returns, or nothing was written: no release is
        ever left reserved or begun without its settle.

        Raises:
            InputError: invalid arguments.
            IntegrityError: the batch is on the ledger already (a batch is charged once).
            BudgetExhaustedError: the charge would cross the budget; nothing is written.
            UnavailableError: a membership change replaced the config this instance was opened for.
            StorageError: the volume is read-only, or has no room for the charge and the deposit that follows
                it; nothing is written (and the caller sends nothing).

        Returns:
            The settle entry.
        """
        bid = _text("batch_id", batch_id)
        who = _text("actor", actor)
        mech = _text("mechanism", mechanism)
        nonce = _text("computation", computation, limit=128)
        names = tuple(_text("party", p) for p in parties)
        params_json = _json_object("params", params)
        cost = non_negative("rdp", rdp)
        if not isinstance(receipt, bytes | bytearray):
            raise InputError(f"receipt must be bytes, got {type(receipt).__name__}")
        with self._lock, _readable(self.path):
            # Before the commit point, like reserve and begin: the charge, and room for the deposit of what
            # it pays for (a total as long as its receipt), so a charged release can also be kept.
            self._room(4, payload=2 * len(receipt))
        with self._write() as db:
            opening, _, closing = self._rows(db, bid)
            if opening is not None:
                state = closing.kind + "d" if closing is not None else "open"
                raise IntegrityError(
                    f"batch {bid} is already on the ledger ({state}); a batch is charged once"
                )
            self._reserve(db, bid, 1, names, mech, params_json, cost, who)
            self._begin(db, bid, nonce, who)
            return self._settle(db, bid, 1, cost, who, nonce, receipt)

    def deposit(self, batch_id: str, *, data: bytes, actor: str) -> bool:
        """Keep, with a settled batch, what its recipient made of the output it was sent (a release's noisy
        total), under ``<batch>#total`` in the receipts table: once per batch, the same bytes again accepted
        (an idempotent retry). Durable when this returns.

        Returns:
            True when stored now, False when these very bytes were stored before.

        Raises:
            InputError: the batch is not settled, or other bytes are stored for it.
            StorageError: the volume is read-only or has no room for it; nothing is written (on a full
                volume, the same bytes deposited before are still acknowledged).
        """
        bid = _text("batch_id", batch_id)
        who = _text("actor", actor)
        if not isinstance(data, bytes | bytearray):
            raise InputError(f"a deposit must be bytes, got {type(data).__name__}")
        with self._write() as db:
            _, _, closing = self._rows(db, bid)
            if closing is None or closing.kind != "settle":
                raise InputError(
                    f"batch {bid} is not settled; only a settled batch's output can be deposited"
                )
            row = db.execute("SELECT data FROM receipts WHERE batch_id = ?", (_deposit_key(bid),)).fetchone()
            if row is not None:
                if bytes(row[0]) == bytes(data):
                    return False
                raise InputError(f"batch {bid} already holds another deposited output; it is kept once")
            self._room(1, payload=len(data))
            db.execute("INSERT INTO receipts VALUES (?, ?, ?)", (_deposit_key(bid), who, bytes(data)))
            return True

    def deposited(self, batch_id: str) -> bytes | None:
        """What :meth:`deposit` kept for ``batch_id``, or None."""
        found = self.receipt(_deposit_key(batch_id))
        return None if found is None else found[1]

    def release(self, batch_id: str, *, reason: str, actor: str) -> Entry:
        """Cancel a reserved batch that revealed nothing: it costs nothing. Idempotent.

        Raises:
            InputError: unknown batch.
            IntegrityError: the batch was already settled (its cost stands), or a computation began on it
                (it may have decoded outputs: it stays charged).
        """
        bid = _text("batch_id", batch_id)
        who = _text("actor", actor)
        why = _text("reason", reason, limit=4096)
        with self._write() as db:
            opening, computing, closing = self._rows(db, bid)
            if opening is None:
                raise InputError(f"batch {bid} was never reserved; there is nothing to release")
            if closing is not None:
                if closing.kind == "release":
                    return closing
                raise IntegrityError(f"batch {bid} was already settled; a spent charge cannot be released")
            if computing is not None:
                raise IntegrityError(
                    f"batch {bid} cannot be released: computation {computing.detail} began on it and may "
                    "have decoded outputs, so it stays charged (settled, or held at its worst case)"
                )
            return self._append(
                db, now=time.time(), batch_id=bid, kind="release", queries=opening.queries, answered=0,
                parties=opening.parties, mechanism=opening.mechanism, params=opening.params, rdp=0.0, units=0,
                detail=why, actor=who,
            )  # fmt: skip

    # ------------------------------------------------------------------ membership
    def change_membership(
        self,
        *,
        previous: str,
        config: Mapping[str, Any],
        added: Sequence[str],
        retired: Sequence[str],
        key: str,
        actor: str,
    ) -> Entry:
        """Continue this ledger under a new federation config: one hash-chained, admin-authorised entry.

        In one transaction: every batch reserved under the old config that no computation began on is
        released (it revealed nothing, so it costs nothing), then the membership entry records the old and
        new config hashes, the parties added and retired, the new config itself, and an HMAC-SHA256 of the
        entry under ``key`` (the admin token), so whoever holds the token can later check that it authorised
        this change (:meth:`check_authorisations`). The budget, its order and every charge so far carry over
        unchanged; batches already computing may still settle. From this entry on, ledger instances opened
        under the old config reserve nothing (:meth:`reserve` raises :class:`UnavailableError`: the guardian
        restarts with the new one, and its callers retry against that).

        Which changes are allowed is the federation's rule
        (:func:`capc_common.federation.membership_change`), checked by the caller; the ledger records.

        Args:
            previous: the config hash the caller runs (must be the one in force).
            config: the new config's parameters (stored whole, hashed as the genesis config is).
            added / retired: the teacher parties the change adds and retires.
            key: the admin token authorising the change (never stored; a fingerprint of it is).
            actor: who asked.

        Raises:
            InputError: invalid arguments, or ``config`` is the config already in force.
            IntegrityError: ``previous`` is not in force (the ledger moved on already), or the ledger
                failed verification.
        """
        who = _text("actor", actor)
        names = {"added": [_text("party", p) for p in added], "retired": [_text("party", p) for p in retired]}
        if not isinstance(key, str) or len(key) < 16:
            raise InputError("the membership change must be authorised by the admin token")
        config_json = _json_object("config", config)
        new = _sha256(config_json)
        with self._write() as db:
            current = self._chain.config_hash
            if previous != current:
                raise IntegrityError(
                    f"the change is from federation config {previous[:16]}…, but {current[:16]}… is in force "
                    f"on this ledger{self._since()}; reload the federation and try again"
                )
            if new == current:
                raise InputError(f"federation config {new[:16]}… is already in force; nothing to change")
            now = time.time()
            for bid in sorted(b for b in self._chain.open_batches if b not in self._chain.computing):
                opening = self._chain.open_batches[bid]
                self._append(
                    db, now=now, batch_id=bid, kind="release", queries=opening.queries, answered=0,
                    parties=opening.parties, mechanism=opening.mechanism, params=opening.params, rdp=0.0,
                    units=0, detail="released by a membership change: it revealed nothing", actor=who,
                )  # fmt: skip
            change = {"from": current, "to": new, **names, "config": json.loads(config_json),
                      "authorised_by": f"admin token {_sha256(key)[:16]}"}  # fmt: skip
            seq = self._chain.seq + 1
            draft = Entry(
                seq=seq, batch_id=f"membership-{seq}", kind="membership", queries=0, answered=0,
                parties=tuple(names["added"] + names["retired"]), mechanism="membership", params=change,
                rdp=0.0, units=0, detail=_describe(change), actor=who, time=now, prev_hash=self._chain.head,
                hash="",
            )  # fmt: skip
            signed = {**change, "mac": _mac(key, draft)}
            return self._append(
                db, now=now, batch_id=draft.batch_id, kind=draft.kind, queries=0, answered=0,
                parties=draft.parties, mechanism=draft.mechanism, params=signed, rdp=0.0, units=0,
                detail=draft.detail, actor=who,
            )  # fmt: skip

    @staticmethod
    def hash_config(config: Mapping[str, Any]) -> str:
        """The hash this ledger gives a config: its ``config_hash``, and the ``from``/``to`` of membership
        entries (SHA-256 of canonical JSON).

        Raises:
            InputError: ``config`` is not a JSON-serialisable mapping.
        """
        return _sha256(_json_object("config", config))

    def membership_changes(self) -> list[Entry]:
        """The membership entries, oldest first (each one's ``params``: from, to, added, retired, config)."""
        with self._lock, _readable(self.path):
            self._catch_up(self._db)
            return list(self._chain.changes)

    @property
    def config_hash_in_force(self) -> str:
        """The federation config hash in force: the ledger's own, or the last membership entry's new one."""
        with self._lock, _readable(self.path):
            self._catch_up(self._db)
            return self._chain.config_hash

    def _since(self) -> str:
        """`` since ledger entry N (added …)``: the latest membership entry, if any."""
        last = self._chain.changes[-1] if self._chain.changes else None
        return f" since ledger entry {last.seq} ({last.detail})" if last else ""

    def superseded(self, config_hash: str) -> str | None:
        """Why ``config_hash`` is no longer in force (``the federation changed at ledger entry N (added …)
        …``), or None if it is in force or was never this ledger's."""
        with self._lock, _readable(self.path):
            self._catch_up(self._db)
            change = next((c for c in self._chain.changes if c.params.get("from") == config_hash), None)
            now = self._chain.config_hash
        if change is None or config_hash == now:
            return None
        return (
            f"the federation changed at ledger entry {change.seq} ({change.detail}): config "
            f"{config_hash[:16]}… is no longer in force, the ledger continues as {now[:16]}…"
        )

    def check_authorisations(self, key: str) -> dict[int, str]:
        """Check that ``key`` (the admin token) authorised every membership entry.

        Returns:
            ``{seq: problem}`` for each membership entry whose HMAC does not match (written without the
            token, or under another one); empty when the token authorised them all.
        """
        problems = {}
        for entry in self.membership_changes():
            unsigned = {k: v for k, v in entry.params.items() if k != "mac"}
            draft = Entry(**{**asdict(entry), "parties": entry.parties, "params": unsigned, "hash": ""})
            if not hmac.compare_digest(_mac(key, draft), str(entry.params.get("mac", ""))):
                problems[entry.seq] = (
                    f"entry {entry.seq} ({entry.detail}): not authorised by this admin token (it names "
                    f"{entry.params.get('authorised_by', 'no token')})"
                )
        return problems

    # ------------------------------------------------------------------ reading
    def batch(self, batch_id: str) -> BatchRecord | None:
        """Where ``batch_id`` stands, or ``None`` if it was never reserved."""
        with self._lock, _readable(self.path):
            opening, computing, closing = self._rows(self._db, batch_id)
        if opening is None:
            return None
        state = "computing" if computing is not None else "reserved"
        if closing is not None:
            state = "settled" if closing.kind == "settle" else "released"
        return BatchRecord(
            batch_id=opening.batch_id,
            state=state,
            queries=opening.queries,
            answered=closing.answered if closing is not None else 0,
            reserved_rdp=opening.rdp,
            actual_rdp=closing.rdp if closing is not None and closing.kind == "settle" else None,
            parties=opening.parties,
            mechanism=opening.mechanism,
            params=opening.params,
            detail=closing.detail if closing is not None else "",
            opened=opening.time,
            closed=closing.time if closing is not None else None,
            computation=computing.detail if computing is not None else None,
        )

    def release_plan(self) -> tuple[int | None, dict[int, str], int]:
        """The release plan the ledger's entries record: how many releases it plans (None: no release was
        charged yet), each charged round's batch, and how many of them settled."""
        with self._lock, _readable(self.path):
            self._catch_up(self._db)
            chain = self._chain
            return chain.releases_planned, dict(chain.release_rounds), chain.releases_settled

    def receipt(self, batch_id: str) -> tuple[str, bytes] | None:
        """``(computation, receipt)`` stored by the settle of ``batch_id``, or None if it stored none."""
        with self._lock:
            try:
                row = self._db.execute(
                    "SELECT computation, data FROM receipts WHERE batch_id = ?", (batch_id,)
                ).fetchone()
            except sqlite3.OperationalError:  # a read-only ledger from before receipts existed
                return None
        return None if row is None else (str(row[0]), bytes(row[1]))

    def entries(
        self,
        *,
        batch_id: str | None = None,
        kinds: Collection[str] | None = None,
        after: int = 0,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[Entry]:
        """Rows in chain order (or newest first), optionally for one batch, of some kinds only (e.g. the
        rows that finish a batch: ``settle`` and ``release``) and after a sequence number."""
        query = f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE seq > ?"
        args: list[Any] = [count("after", after, maximum=MAX_SEQ)]
        if batch_id is not None:
            query += " AND batch_id = ?"
            args.append(batch_id)
        if kinds is not None:
            query += f" AND kind IN ({', '.join('?' * len(kinds))})" if kinds else " AND 0"
            args.extend(kinds)
        query += " ORDER BY seq DESC" if newest else " ORDER BY seq"
        if limit is not None:
            query += " LIMIT ?"
            args.append(count("limit", limit, maximum=MAX_SEQ))
        with self._lock, _readable(self.path):
            return [_row_entry(r) for r in self._db.execute(query, args)]

    def epsilon_of(self, rdp: float) -> float:
        """ε at the ledger's δ of an RDP total at its order (see :meth:`RenyiFilter.epsilon_of`)."""
        return self.filter.epsilon_of(rdp)

    def _figures(self, totals: Mapping[str, int]) -> dict[str, Any]:
        """What the totals mean: RDP and ε spent (settled + reserved), batch and query counts."""
        charged_units = totals["spent_units"] + totals["reserved_units"]
        spent = self.epsilon_of(charged_units / UNITS_PER_NAT)
        settled = self.epsilon_of(totals["spent_units"] / UNITS_PER_NAT)
        return {
            "epsilon_spent": spent,
            "epsilon_settled": settled,
            # What the open (or orphaned) worst-case reservations add on top: ε is not additive, so this is
            # defined as the difference, keeping epsilon_spent = epsilon_settled + epsilon_reserved.
            "epsilon_reserved": spent - settled,
            "spent_rdp": totals["spent_units"] / UNITS_PER_NAT,
            "reserved_rdp": totals["reserved_units"] / UNITS_PER_NAT,
            "remaining_rdp": (self.budget_units - charged_units) / UNITS_PER_NAT,
            "fraction_used": charged_units / self.budget_units,
            "queries": totals["queries"],
            "answered": totals["answered"],
            "batches": totals["settled"],
            "open_batches": totals["open"],
            "released_batches": totals["released"],
        }

    def history(self, *, points: int = 200) -> list[dict[str, Any]]:
        """The budget figures after each entry, for charts of ε over time.

        Replays the chain from the first entry with the same arithmetic as :meth:`summary` (so the last
        point equals it) and keeps at most ``points`` of them, evenly spaced, always the last.

        Returns:
            ``[{"seq", "time", "kind", "batch_id", **figures}]`` oldest first (figures as in the summary).
        """
        rows = self.entries()
        step = max(1, math.ceil(len(rows) / count("points", points, minimum=1)))
        chain = self._new_chain()
        kept: list[dict[str, Any]] = []
        for index, entry in enumerate(rows):
            chain.apply(entry)
            if (len(rows) - 1 - index) % step == 0:
                kept.append(
                    {
                        "seq": entry.seq,
                        "time": entry.time,
                        "kind": entry.kind,
                        "batch_id": entry.batch_id,
                        **self._figures(chain.totals),
                    }
                )
        return kept

    def summary(self) -> dict[str, Any]:
        """Budget figures, recomputed from the entries.

        ``epsilon_settled`` is what settled batches cost (it only grows); ``epsilon_spent`` also counts open
        (or orphaned) reservations at their worst case, so it can fall when a batch settles below its
        reservation; ``epsilon_reserved`` is the difference. ``chain_ok`` is false once any entry failed its
        checks (the ledger then refuses every charge).
        """
        with self._lock, _readable(self.path):
            self._catch_up(self._db)
            figures = self._figures(self._chain.totals)
            seq, head, chain_ok = self._chain.seq, self._chain.head, not self._chain.problems
        return {
            **figures,
            "epsilon_limit": self.epsilon_limit,
            "delta": self.delta,
            "order": self.order,
            "budget_rdp": self.budget_rdp,
            "entries": seq,
            "head": head,
            "chain_ok": chain_ok,
            "config_hash": self.config_hash_in_force,
            "created": self.created,
            "path": str(self.path),
        }

    # ------------------------------------------------------------------ verification
    def verify(self, *, expect_head: str | None = None) -> VerificationReport:
        """Recompute the chain and every total from the rows; report each inconsistency found.

        Never raises on a damaged file: what SQLite cannot read (a flipped byte that breaks a page or a
        text's UTF-8) is reported as a problem like any other.

        Args:
            expect_head: a head hash pinned earlier (``summary()["head"]``, logged and exported by the
                guardian after each settle). It must be the genesis or the hash of an entry of this chain —
                the current head, or an older one if the ledger grew since — otherwise entries were removed
                (a cleanly cut tail verifies on its own) or the file was replaced.

        Raises:
            InputError: ``expect_head`` is not 64 lowercase hex digits.
        """
        if expect_head is not None and not _HEX64.fullmatch(expect_head):
            raise InputError(f"the expected head must be 64 lowercase hex digits, got {expect_head!r}")
        chain = self._new_chain(watch=expect_head)
        try:
            # One read transaction: the parameters, the stored totals and the entries come from one snapshot
            # (WAL), so a row a live guardian appends meanwhile cannot look like a mismatch between them.
            with self._lock, self._snapshot():
                check = self._db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    chain.problems.append(f"SQLite quick_check: {check}")
                meta = self._db.execute(f"SELECT {', '.join(_META_KEYS)} FROM meta WHERE id = 1").fetchone()
                meta_problems = _meta_problems(dict(zip(_META_KEYS, meta, strict=True)), self._db)
                if meta[-1] != self.genesis:
                    meta_problems.append("the genesis changed since the ledger was opened")
                state = self._state(self._db)
                for row in self._db.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries ORDER BY seq"):
                    chain.apply(_row_entry(row))
        except (sqlite3.DatabaseError, IntegrityError) as exc:
            chain.problems.append(f"the file cannot be read past entry {chain.seq}: {exc}")
            return VerificationReport(ok=False, entries=chain.seq, problems=chain.problems, head=chain.head)
        chain.problems += meta_problems + chain.state_problems(state)
        if expect_head is not None and chain.watched_at is None:
            chain.problems.append(
                f"the pinned head {expect_head[:16]}… is not in the chain of {chain.seq} entries: entries "
                "were removed from its end or the file was replaced by another ledger"
            )
        figures = self._figures(chain.totals)
        totals = {k: figures[k] for k in _REPORTED}
        if chain.releases_planned is not None:
            totals |= {"releases": chain.releases_settled, "releases_planned": chain.releases_planned}
        return VerificationReport(
            ok=not chain.problems,
            entries=chain.seq,
            problems=chain.problems,
            head=chain.head,
            totals=totals,
            expected_head_at=chain.watched_at,
        )


_PAGES_PER_COMMIT = 16
"""Pages one ledger transaction may write (a row, its index entries, the totals, a receipt, a b-tree split):
each becomes a WAL frame of a page plus its header."""
_WAL_FRAME_HEADER = 24

_REPORTED = ("spent_rdp", "reserved_rdp", "epsilon_spent", "epsilon_settled", "epsilon_reserved", "queries",
             "answered", "batches", "open_batches", "released_batches")  # fmt: skip


@contextmanager
def _readable(path: Path) -> Iterator[None]:
    """Turn SQLite's errors into the library's (:func:`~capc_common.storage.classify`): a busy file is
    unavailable; a full, read-only or failing volume a :class:`StorageError`, the chain as it was; only what
    SQLite finds damaged is an :class:`IntegrityError`, and then ``capc budget verify`` says what is left."""
    try:
        yield
    except sqlite3.Error as exc:
        problem = classify(exc, path=path, what="ledger")
        if isinstance(problem, IntegrityError):
            problem = IntegrityError(
                f"{problem}; run `capc budget verify --ledger {path}`, and restore the ledger from a backup "
                "only if it fails"
            )
        raise problem from None


def _release_of(entry: Entry) -> tuple[int, int] | None:
    """``(round, planned)`` of a release reservation's ``params["release"]``, or None (not a release, or
    malformed)."""
    release = entry.params.get("release")
    if not isinstance(release, dict):
        return None
    round_, planned = release.get("round"), release.get("planned")
    if type(round_) is not int or type(planned) is not int:
        return None
    return round_, planned


def _deposit_key(batch_id: str) -> str:
    """Where a settled batch's deposited output is kept in the receipts table."""
    return f"{batch_id}#total"


def _entry_hash(entry: Entry) -> str:
    return _sha256(entry.prev_hash + _canonical(entry.hashed_fields()))


def _mac(key: str, draft: Entry) -> str:
    """HMAC-SHA256 under the admin token of a membership entry's hashed fields (its ``mac`` left out)."""
    return hmac.new(key.encode(), _canonical(draft.hashed_fields()).encode(), hashlib.sha256).hexdigest()


def _describe(change: Mapping[str, Any]) -> str:
    """``added hospital-4; retired hospital-2`` (config 1a2b… -> 3c4d…)."""
    parts = [f"{verb} {', '.join(change[verb])}" for verb in ("added", "retired") if change[verb]]
    return (
        f"{'; '.join(parts) or 'membership changed'}: config {change['from'][:16]}… -> {change['to'][:16]}…"
    )


_ENTRY_TYPES = (int, str, str, int, int, int, str, str, str, float, int, str, str, float, str, str)
_META_TYPES = (int, float, float, float, float, float, int, str, str, str)
_META_KEYS = ("format", "created", "epsilon_limit", "delta", "rdp_order", "budget_rdp", "budget_units",
              "config", "config_hash", "genesis")  # fmt: skip


def _meta_problems(meta: Mapping[str, Any], db: sqlite3.Connection) -> list[str]:
    """How the ``meta`` row disagrees with its own genesis hash, its config hash and the chain's first link.

    The genesis is the hash of the parameters (:meth:`BudgetLedger.create`) and the first entry's
    ``prev_hash``: an edited budget breaks the first, and an edited budget with a recomputed genesis breaks
    the second (once the ledger has an entry).
    """
    problems = []
    params = {k: v for k, v in meta.items() if k != "genesis"}
    if _sha256(_canonical(params)) != meta["genesis"]:
        problems.append("ledger parameters do not match the genesis hash (edited budget, order or config)")
    if _sha256(meta["config"]) != meta["config_hash"]:
        problems.append("stored config does not match its hash")
    first = db.execute("SELECT prev_hash FROM entries ORDER BY seq LIMIT 1").fetchone()
    if first is not None and first[0] != meta["genesis"]:
        problems.append("the first entry does not link to the ledger's genesis (parameters replaced)")
    return problems


def _typed(row: tuple[Any, ...], types: tuple[type, ...], what: str) -> tuple[Any, ...]:
    """``row`` if each value has its column's type (SQLite returns whatever a damaged record holds)."""
    if len(row) != len(types) or not all(type(v) is t for v, t in zip(row, types, strict=True)):
        found = ", ".join(type(v).__name__ for v in row)
        raise IntegrityError(f"{what} holds values of the wrong types ({found}): the record is damaged")
    return row


def _row_entry(row: tuple[Any, ...]) -> Entry:
    (seq, batch_id, kind, _phase, queries, answered, parties, mechanism, params, rdp, units, detail, actor,
     when, prev_hash, digest) = _typed(row, _ENTRY_TYPES, f"ledger entry {row[0]!r}")  # fmt: skip
    try:
        parties, params = tuple(json.loads(parties)), json.loads(params)
    except (TypeError, ValueError) as exc:
        raise IntegrityError(f"ledger entry {seq} cannot be decoded ({exc})") from None
    return Entry(
        seq=seq,
        batch_id=batch_id,
        kind=kind,
        queries=queries,
        answered=answered,
        parties=parties,
        mechanism=mechanism,
        params=params,
        rdp=rdp,
        units=units,
        detail=detail,
        actor=actor,
        time=when,
        prev_hash=prev_hash,
        hash=digest,
    )
