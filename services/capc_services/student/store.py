"""The student's durable label store (SQLite, synchronous=FULL).

A batch moves ``open`` → ``done`` (labels stored), ``aborted`` (nothing revealed, nothing charged) or
``lost`` (charged, no labels: the guardian's computation began but never settled, so it holds the batch at
its worst case and revealed nothing — over-counted spend, never under-counted). Labels of a batch and its
``done`` mark are written in one transaction, so after a restart a batch is either fully stored or not at
all; the scheduler skips every batch that is not ``open`` and resumes the open ones, so nothing is lost and
nothing is asked twice.

A full or read-only volume is a :class:`~capc_common.errors.StorageError` (the scheduler waits it out and
resumes): every write is one transaction that SQLite rolls back by itself when it cannot be written, and a
batch is begun only when the volume has room for its stash and its labels, so the volume filling up stops
the student before a batch it could not store, not half-way through one.

Labels the guardian paid for survive a crash between its settle and the label store: before the student
sends the frame that lets the guardian commit, it *stashes* what it needs to decode (the select bits of its
output labels, with the computation's nonce); after a restart it asks the guardian to send the reveal of
that computation again and decodes the labels from the two.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capc_common.errors import InputError, IntegrityError
from capc_common.mpc import pack_bits, unpack_bits
from capc_common.storage import classify, require_space

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY,
    first_index INTEGER NOT NULL,
    count INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'done', 'aborted', 'lost')),
    parties TEXT NOT NULL DEFAULT '[]',
    answered INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '',
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS labels (
    query_index INTEGER PRIMARY KEY,
    batch_id TEXT NOT NULL REFERENCES batches(batch_id),
    label INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS stashes (
    batch_id TEXT NOT NULL REFERENCES batches(batch_id),
    computation TEXT NOT NULL,
    parties TEXT NOT NULL,
    queries INTEGER NOT NULL,
    label_bits INTEGER NOT NULL,
    bits BLOB NOT NULL,
    PRIMARY KEY (batch_id, computation)
);
"""
STATES = ("open", "done", "aborted", "lost")
_BYTES_PER_QUERY = 64
"""An upper bound on what one query's label row and stashed bits take in the store (the row, its index
entry)."""
_PAGES_PER_COMMIT = 16
"""Pages a transaction touches besides its rows (b-tree splits, the batch row), each a WAL frame."""


@dataclass(frozen=True)
class BatchRecord:
    """One batch as the store knows it."""

    batch_id: str
    first_index: int
    count: int
    attempt: int
    state: str
    parties: tuple[str, ...]
    answered: int
    detail: str


class LabelStore:
    """Durable record of batches and the labels they produced, bound to one federation config.

    Args:
        path: the SQLite file (created with its parent directory).
        config_hash: the federation-config hash; a store written under another config is refused.
        continues: earlier config hashes this federation continues from (``federation.yaml``'s
            ``history``: a membership change). A store written under one of them carries on under
            ``config_hash``, its batches and labels kept; the switch is noted in its ``meta`` table.

    Raises:
        IntegrityError: the store belongs to another federation config.
    """

    def __init__(self, path: str | Path, *, config_hash: str, continues: Collection[str] = ()) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        with self._failing():
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key = 'config_hash'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('config_hash', ?)", (config_hash,))
        if row is not None and row[0] in continues and row[0] != config_hash:
            with self._transaction() as db:  # the new hash and the note of where it came from, at once
                db.execute("UPDATE meta SET value = ? WHERE key = 'config_hash'", (config_hash,))
                db.execute(
                    "INSERT INTO meta VALUES (?, ?)", (f"continued:{config_hash}:{time.time()}", row[0])
                )
        elif row is not None and row[0] != config_hash:
            raise IntegrityError(
                f"label store {path} was written under federation config {row[0][:16]}, "
                f"not {config_hash[:16]}; "
                "use a fresh store path for a new federation"
            )
        (self._page,) = self._db.execute("PRAGMA page_size").fetchone()

    @contextmanager
    def _failing(self) -> Iterator[None]:
        """SQLite's errors as the library's: a full or read-only volume is a StorageError, not a traceback."""
        try:
            yield
        except sqlite3.Error as exc:
            raise classify(exc, path=self.path, what="label store") from None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction under the lock, committed or rolled back whole (SQLite rolls
        back by itself a commit the volume cannot take: then there is nothing left to roll back)."""
        with self._lock, self._failing():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _record(self, row: tuple[object, ...]) -> BatchRecord:
        batch_id, first, count, attempt, state, parties, answered, detail = row
        return BatchRecord(
            batch_id=str(batch_id),
            first_index=int(first),  # type: ignore[call-overload]
            count=int(count),  # type: ignore[call-overload]
            attempt=int(attempt),  # type: ignore[call-overload]
            state=str(state),
            parties=tuple(json.loads(str(parties))),
            answered=int(answered),  # type: ignore[call-overload]
            detail=str(detail),
        )

    def get(self, batch_id: str) -> BatchRecord | None:
        """The record of ``batch_id``, or None if it was never begun."""
        with self._lock:
            row = self._db.execute(
                "SELECT batch_id, first_index, count, attempt, state, parties, answered, detail "
                "FROM batches WHERE batch_id = ?",
                (batch_id,),
            ).fetchone()
        return None if row is None else self._record(row)

    def require_room(self, count: int) -> None:
        """Refuse a batch of ``count`` queries the volume could not stash and store (before it goes out, and
        again before its computation: the commit points the student must not fail half-way).

        Raises:
            StorageError: the volume is read-only, or has less room than the batch's two transactions need.
        """
        pages = -(-count * _BYTES_PER_QUERY // self._page) + _PAGES_PER_COMMIT
        require_space(self.path, needed=2 * pages * (self._page + 24), what="label store")

    def begin(self, batch_id: str, *, first_index: int, count: int) -> int:
        """Mark a batch open (again) and return its new attempt number (1 for a fresh batch).

        Raises:
            InputError: the batch is already finished, or known with another query range.
            StorageError: the store's volume has no room to stash and store the batch (nothing begun).
        """
        self.require_room(count)
        with self._transaction() as db:
            row = db.execute(
                "SELECT first_index, count, attempt, state FROM batches WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO batches (batch_id, first_index, count, attempt, state, updated) "
                    "VALUES (?, ?, ?, 1, 'open', ?)",
                    (batch_id, first_index, count, time.time()),
                )
                return 1
            if (row[0], row[1]) != (first_index, count):
                raise InputError(
                    f"batch {batch_id} is stored for queries [{row[0]}, +{row[1]}), "
                    f"not [{first_index}, +{count})"
                )
            if row[3] != "open":
                raise InputError(f"batch {batch_id} is already {row[3]}; it is never asked again")
            attempt = int(row[2]) + 1
            db.execute(
                "UPDATE batches SET attempt = ?, updated = ? WHERE batch_id = ?",
                (attempt, time.time(), batch_id),
            )
            return attempt

    def complete(self, batch_id: str, *, labels: np.ndarray, parties: tuple[str, ...]) -> None:
        """Store a batch's labels (−1 = not answered) and mark it done, atomically.

        Raises:
            InputError: the batch is not open or ``labels`` has the wrong length.
        """
        with self._transaction() as db:
            row = db.execute(
                "SELECT first_index, count, state FROM batches WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            if row is None or row[2] != "open":
                raise InputError(f"batch {batch_id} is not open (state {row[2] if row else 'unknown'})")
            first, count = int(row[0]), int(row[1])
            labels = np.asarray(labels, dtype=np.int64).reshape(-1)
            if labels.shape[0] != count:
                raise InputError(f"batch {batch_id} has {count} queries but {labels.shape[0]} labels")
            answered = int((labels >= 0).sum())
            db.executemany(
                "INSERT INTO labels (query_index, batch_id, label) VALUES (?, ?, ?)",
                ((first + i, batch_id, int(v)) for i, v in enumerate(labels)),
            )
            db.execute(
                "UPDATE batches SET state = 'done', parties = ?, answered = ?, updated = ? "
                "WHERE batch_id = ?",
                (json.dumps(list(parties)), answered, time.time(), batch_id),
            )
            db.execute("DELETE FROM stashes WHERE batch_id = ?", (batch_id,))

    def finish(self, batch_id: str, *, state: str, detail: str, answered: int = 0) -> None:
        """Close an open batch without labels: ``aborted`` (cost nothing) or ``lost`` (charged, labels gone).

        Raises:
            InputError: unknown state or batch not open.
        """
        if state not in ("aborted", "lost"):
            raise InputError(f"finish() takes state 'aborted' or 'lost', not {state!r}")
        with self._transaction() as db:
            cur = db.execute(
                "UPDATE batches SET state = ?, detail = ?, answered = ?, updated = ? "
                "WHERE batch_id = ? AND state = 'open'",
                (state, detail, answered, time.time(), batch_id),
            )
            if cur.rowcount != 1:
                raise InputError(f"batch {batch_id} is not open; cannot mark it {state}")
            db.execute("DELETE FROM stashes WHERE batch_id = ?", (batch_id,))

    def stash(self, batch_id: str, *, computation: str, parties: tuple[str, ...], select: np.ndarray) -> None:
        """Keep, durably, the select bits of one computation of an open batch (before the guardian commits).

        Args:
            batch_id: the open batch.
            computation: the computation's nonce (from the guardian's agreement).
            parties: the teacher parties it computes over.
            select: ``(queries, label_bits)`` bool select bits of the label outputs.

        Raises:
            InputError: the batch is not open.
        """
        select = np.asarray(select, dtype=bool)
        with self._transaction() as db:
            row = db.execute("SELECT state FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
            if row is None or row[0] != "open":
                raise InputError(f"batch {batch_id} is not open (state {row[0] if row else 'unknown'})")
            db.execute(
                "INSERT OR REPLACE INTO stashes VALUES (?, ?, ?, ?, ?, ?)",
                (batch_id, computation, json.dumps(list(parties)), *select.shape, pack_bits(select)),
            )

    def stashed(self, batch_id: str, computation: str) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """``(select bits, parties)`` stashed for one computation of a batch, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT parties, queries, label_bits, bits FROM stashes "
                "WHERE batch_id = ? AND computation = ?",
                (batch_id, computation),
            ).fetchone()
        if row is None:
            return None
        parties, queries, label_bits, bits = row
        select = unpack_bits(bytes(bits), queries * label_bits, what="stashed select bits")
        return select.reshape(queries, label_bits), tuple(json.loads(parties))

    def batches(self, *, state: str | None = None) -> list[BatchRecord]:
        """Every batch (or those in ``state``), in query order."""
        sql = "SELECT batch_id, first_index, count, attempt, state, parties, answered, detail FROM batches"
        args: tuple[object, ...] = ()
        if state is not None:
            sql += " WHERE state = ?"
            args = (state,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY first_index", args).fetchall()
        return [self._record(r) for r in rows]

    def next_index(self) -> int:
        """The first query index after every batch ever begun (where new batches start after a restart)."""
        with self._lock:
            row = self._db.execute("SELECT COALESCE(MAX(first_index + count), 0) FROM batches").fetchone()
        return int(row[0])

    def labels(self) -> tuple[np.ndarray, np.ndarray]:
        """``(query_indices, labels)`` of every answered query, in query order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT query_index, label FROM labels WHERE label >= 0 ORDER BY query_index"
            ).fetchall()
        data = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
        return data[:, 0].copy(), data[:, 1].copy()

    def all_labels(self) -> tuple[np.ndarray, np.ndarray]:
        """``(query_indices, labels)`` of every stored query, −1 for unanswered ones."""
        with self._lock:
            rows = self._db.execute("SELECT query_index, label FROM labels ORDER BY query_index").fetchall()
        data = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
        return data[:, 0].copy(), data[:, 1].copy()

    def counts(self) -> dict[str, int]:
        """Batches per state, queries asked (done + lost) and answered."""
        with self._lock:
            per_state = dict(
                self._db.execute("SELECT state, COUNT(*) FROM batches GROUP BY state").fetchall()
            )
            asked, answered = self._db.execute(
                "SELECT COALESCE(SUM(count), 0), COALESCE(SUM(answered), 0) FROM batches "
                "WHERE state IN ('done', 'lost')"
            ).fetchone()
        return {
            **{f"batches_{s}": int(per_state.get(s, 0)) for s in STATES},
            "queries": int(asked),
            "answered": int(answered),
        }
