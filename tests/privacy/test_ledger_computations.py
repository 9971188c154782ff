"""BudgetLedger computations: one per batch, durable before anything is decoded, settled once by its nonce."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from capc_common.errors import InputError, IntegrityError
from capc_common.privacy import BudgetLedger

CONFIG = {"federation": "test", "teachers": 250}


@pytest.fixture
def ledger(tmp_path: Path) -> BudgetLedger:
    led = BudgetLedger.create(tmp_path / "l.db", epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG)
    yield led
    led.close()


def _reserve(led: BudgetLedger, batch: str, rdp: float = 0.1) -> Any:
    return led.reserve(
        batch, queries=16, parties=["h1", "h2"], mechanism="confident-gnmax", params={}, worst_case_rdp=rdp,
        actor="student",
    )  # fmt: skip


def test_a_computation_settles_its_batch_once(ledger: BudgetLedger) -> None:
    _reserve(ledger, "b")
    row = ledger.begin("b", computation="n1", actor="guardian")
    assert (row.kind, row.detail, row.rdp) == ("compute", "n1", 0.0)
    record = ledger.batch("b")
    assert (record.state, record.computation) == ("computing", "n1")
    # A begun batch is charged at its worst case until it settles.
    assert ledger.summary()["reserved_rdp"] == pytest.approx(0.1)
    settled = ledger.settle("b", answered=4, actual_rdp=0.05, actor="guardian", computation="n1")
    assert (settled.kind, settled.detail) == ("settle", "n1")
    assert ledger.batch("b").state == "settled"
    assert [e.kind for e in ledger.entries(batch_id="b")] == ["reserve", "compute", "settle"]
    report = ledger.verify()
    assert report.ok, report.problems
    assert report.totals["batches"] == 1 and report.totals["open_batches"] == 0


def test_once_begun_a_batch_is_never_released_recomputed_or_settled_twice(ledger: BudgetLedger) -> None:
    _reserve(ledger, "b")
    ledger.begin("b", computation="n1", actor="guardian-1")
    with pytest.raises(IntegrityError, match="cannot be released: computation n1 began"):
        ledger.release("b", reason="an abort racing the settle", actor="student")
    for nonce in ("n2", "n1"):  # another guardian process, or a replay of the same computation
        with pytest.raises(IntegrityError, match="already being computed"):
            ledger.begin("b", computation=nonce, actor="guardian-2")
    with pytest.raises(IntegrityError, match=r"names computation \(none\), but computation n1 began"):
        ledger.settle("b", answered=1, actual_rdp=0.05, actor="guardian")
    with pytest.raises(IntegrityError, match="names computation n2, but computation n1 began"):
        ledger.settle("b", answered=1, actual_rdp=0.05, actor="guardian-2", computation="n2")
    assert ledger.summary()["entries"] == 2  # no refusal wrote anything
    ledger.settle("b", answered=1, actual_rdp=0.05, actor="guardian-1", computation="n1")
    for nonce in ("n1", "n2", None):
        with pytest.raises(IntegrityError, match="already settled; refusing to settle it again"):
            ledger.settle("b", answered=1, actual_rdp=0.05, actor="guardian-1", computation=nonce)
    with pytest.raises(IntegrityError, match="already settled"):
        ledger.begin("b", computation="n3", actor="guardian-1")
    assert ledger.summary()["entries"] == 3 and ledger.verify().ok


def test_begin_needs_a_reserved_unfinished_batch(ledger: BudgetLedger) -> None:
    with pytest.raises(InputError, match="never reserved"):
        ledger.begin("nope", computation="n", actor="g")
    _reserve(ledger, "r")
    ledger.release("r", reason="quorum not met", actor="g")
    with pytest.raises(IntegrityError, match="already released"):
        ledger.begin("r", computation="n", actor="g")
    _reserve(ledger, "s")
    with pytest.raises(IntegrityError, match="no computation began on it"):
        ledger.settle("s", answered=0, actual_rdp=0.0, actor="g", computation="n")
    with pytest.raises(InputError, match="computation"):
        ledger.begin("s", computation="", actor="g")
    assert ledger.summary()["entries"] == 3


def test_a_crash_between_begin_and_settle_holds_the_worst_case(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG) as led:
        _reserve(led, "b", 0.3)
        led.begin("b", computation="n1", actor="guardian")
    # The guardian died here; whatever it decoded is paid for at the worst case, for ever.
    with BudgetLedger.open(path) as led:
        assert led.batch("b").state == "computing"
        assert led.summary()["reserved_rdp"] == pytest.approx(0.3)
        with pytest.raises(IntegrityError, match="cannot be released"):
            led.release("b", reason="restart", actor="student")
        assert led.verify().ok


def test_the_receipt_is_stored_with_the_settle_and_never_rewritten(ledger: BudgetLedger) -> None:
    _reserve(ledger, "b")
    _reserve(ledger, "c")
    ledger.begin("b", computation="n1", actor="g")
    ledger.settle("b", answered=2, actual_rdp=0.05, actor="g", computation="n1", receipt=b"\x01\x02bits")
    assert ledger.receipt("b") == ("n1", b"\x01\x02bits")
    assert ledger.receipt("c") is None
    with pytest.raises(InputError, match="receipt must be bytes"):
        ledger.settle("c", answered=0, actual_rdp=0.0, actor="g", receipt="text")  # type: ignore[arg-type]
    raw = sqlite3.connect(ledger.path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute("UPDATE receipts SET data = x'00'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute("DELETE FROM receipts")
    raw.close()


def test_verify_flags_a_release_after_a_computation_began(ledger: BudgetLedger) -> None:
    # A writer that bypasses the checks (a bug, or an edited program) and appends a well-chained release of a
    # begun batch: the chain is intact, but the protocol was broken, and verify says so.
    _reserve(ledger, "b")
    ledger.begin("b", computation="n1", actor="g")
    with ledger._write() as db:
        ledger._append(
            db, now=0.0, batch_id="b", kind="release", queries=16, answered=0, parties=("h1", "h2"),
            mechanism="confident-gnmax", params={}, rdp=0.0, units=0, detail="forged", actor="g",
        )  # fmt: skip
    report = ledger.verify()
    assert not report.ok
    assert any("released after its computation began" in p for p in report.problems), report.problems
    with pytest.raises(IntegrityError, match="failed verification"):  # and the ledger charges nothing more
        _reserve(ledger, "c")


_KINDS_NOW = "CHECK (kind IN ('reserve', 'compute', 'settle', 'release', 'membership'))"
_PHASES_NOW = "CHECK (phase IN (0, 1, 2, 3))"


def _as_written_before(path: Path, *, kinds: str, phases: str, refused: tuple[str, int]) -> None:
    """Give the entries table the CHECKs an earlier version wrote (``kinds``/``phases``: the lists inside)
    and check that they refuse a row of kind and phase ``refused``."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    (version,) = raw.execute("PRAGMA schema_version").fetchone()
    raw.execute("PRAGMA writable_schema = ON")
    (sql,) = raw.execute("SELECT sql FROM sqlite_master WHERE name = 'entries'").fetchone()
    assert _KINDS_NOW in sql and _PHASES_NOW in sql
    older = sql.replace(_KINDS_NOW, f"CHECK (kind IN ({kinds}))").replace(
        _PHASES_NOW, f"CHECK (phase IN ({phases}))"
    )
    raw.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'entries'", (older,))
    raw.execute(f"PRAGMA schema_version = {version + 1}")
    raw.execute("PRAGMA writable_schema = OFF")
    raw.execute("COMMIT")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        raw.execute(
            "INSERT INTO entries SELECT seq + 10, 'x', ?, ?, queries, answered, parties, mechanism, params, "
            "rdp, units, detail, actor, time, prev_hash, hash FROM entries WHERE seq = 2",
            refused,
        )
    if "'compute'" not in kinds:  # the first version had no receipts table either
        raw.execute("DROP TABLE receipts")
    raw.close()


def test_a_ledger_from_before_computations_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG) as led:
        _reserve(led, "a")
        led.settle("a", answered=3, actual_rdp=0.05, actor="g")
        _reserve(led, "b")
        head = led.summary()["head"]
    # Make the file what the first version wrote: the narrower CHECKs and no receipts table.
    _as_written_before(path, kinds="'reserve', 'settle', 'release'", phases="0, 1", refused=("compute", 2))
    with BudgetLedger.open(path) as led:
        assert led.summary()["head"] == head and led.verify().ok
        led.begin("b", computation="n", actor="g")
        led.settle("b", answered=1, actual_rdp=0.01, actor="g", computation="n", receipt=b"r")
        assert led.receipt("b") == ("n", b"r")
        assert led.verify().ok
    with BudgetLedger.open(path) as led:  # a second open finds nothing left to upgrade
        assert [e.kind for e in led.entries()] == ["reserve", "settle", "reserve", "compute", "settle"]


def test_a_ledger_from_before_membership_entries_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    with BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG) as led:
        _reserve(led, "a")
        led.settle("a", answered=3, actual_rdp=0.05, actor="g")
        head, before = led.summary()["head"], led.config_hash
    _as_written_before(
        path, kinds="'reserve', 'compute', 'settle', 'release'", phases="0, 1, 2", refused=("membership", 3)
    )
    with BudgetLedger.open(path) as led:
        assert led.summary()["head"] == head and led.verify().ok
        led.change_membership(
            previous=before, config={**CONFIG, "teachers": 260}, added=["h3"], retired=[], key="k" * 32,
            actor="admin",
        )  # fmt: skip
        assert led.verify().ok
    with BudgetLedger.open(path) as led:
        assert [e.kind for e in led.entries()] == ["reserve", "settle", "membership"]
