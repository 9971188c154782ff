"""BudgetLedger: two-phase charges, idempotency, refusals, durability, tamper evidence, threads."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from capc_common.errors import BudgetExhaustedError, InputError, IntegrityError
from capc_common.privacy import BudgetLedger, ConfidentGNMaxAccountant, RenyiFilter, plan
from capc_common.privacy.analysis import epsilon_at_order
from capc_common.privacy.ledger import _canonical, _sha256

CONFIG = {"federation": "test", "teachers": 250, "sigma1": 100.0, "sigma2": 40.0, "threshold": 170.0}


@pytest.fixture
def ledger(tmp_path: Path) -> BudgetLedger:
    led = BudgetLedger.create(tmp_path / "l.db", epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG)
    yield led
    led.close()


def _reserve(led: BudgetLedger, batch: str, rdp: float, **kw: Any) -> Any:
    args = {"queries": 16, "parties": ["h1", "h2"], "mechanism": "confident-gnmax", "params": {"count": 16}}
    args.update(kw)
    return led.reserve(batch, worst_case_rdp=rdp, actor="student", **args)


def test_fresh_ledger(ledger: BudgetLedger) -> None:
    s = ledger.summary()
    budget = 2.0 - float(epsilon_at_order(10.0, 0.0, delta=1e-5))
    assert s["budget_rdp"] == pytest.approx(budget, rel=1e-15)
    assert s["epsilon_spent"] == 0.0 and s["entries"] == 0 and s["remaining_rdp"] == pytest.approx(budget)
    assert (s["epsilon_limit"], s["delta"], s["order"]) == (2.0, 1e-5, 10.0)
    assert ledger.config == CONFIG
    assert ledger.verify().ok


def test_reserve_settle_release_and_summary(ledger: BudgetLedger) -> None:
    r = _reserve(ledger, "b1", 0.2)
    assert (r.seq, r.kind, r.parties, r.actor) == (1, "reserve", ("h1", "h2"), "student")
    assert ledger.batch("b1").state == "reserved"
    # An open reservation counts at its worst case.
    assert ledger.summary()["epsilon_spent"] == pytest.approx(ledger.epsilon_of(0.2))
    s = ledger.settle("b1", answered=5, actual_rdp=0.15, actor="guardian")
    assert (s.kind, s.answered, s.rdp) == ("settle", 5, 0.15)
    _reserve(ledger, "b2", 0.3)
    rel = ledger.release("b2", reason="quorum not met", actor="guardian")
    assert (rel.kind, rel.rdp, rel.detail) == ("release", 0.0, "quorum not met")
    summary = ledger.summary()
    assert summary["spent_rdp"] == pytest.approx(0.15, abs=1e-12)
    assert summary["reserved_rdp"] == 0
    assert (summary["queries"], summary["answered"], summary["batches"]) == (16, 5, 1)
    assert (summary["open_batches"], summary["released_batches"], summary["entries"]) == (0, 1, 4)
    b1, b2 = ledger.batch("b1"), ledger.batch("b2")
    assert (b1.state, b1.answered, b1.actual_rdp, b1.reserved_rdp) == ("settled", 5, 0.15, 0.2)
    assert (b2.state, b2.detail, b2.actual_rdp) == ("released", "quorum not met", None)
    assert ledger.batch("unknown") is None
    assert [e.kind for e in ledger.entries()] == ["reserve", "settle", "reserve", "release"]
    assert [e.seq for e in ledger.entries(newest=True, limit=2)] == [4, 3]
    assert [e.kind for e in ledger.entries(batch_id="b1")] == ["reserve", "settle"]
    assert ledger.verify().ok


def test_reserve_and_release_are_idempotent_a_settle_is_not(ledger: BudgetLedger) -> None:
    first = _reserve(ledger, "b", 0.1)
    assert _reserve(ledger, "b", 0.1) == first
    ledger.settle("b", answered=3, actual_rdp=0.05, actor="g")
    # A repeated settle, even with the same figures, is refused: it would be a second reveal for one charge.
    with pytest.raises(IntegrityError, match="already settled; refusing to settle it again"):
        ledger.settle("b", answered=3, actual_rdp=0.05, actor="g")
    assert _reserve(ledger, "b", 0.1) == first  # a replayed open after the fact still returns the original
    _reserve(ledger, "c", 0.1)
    released = ledger.release("c", reason="x", actor="g")
    assert ledger.release("c", reason="other words", actor="g") == released
    assert ledger.summary()["entries"] == 4


def test_conflicting_replays_are_refused(ledger: BudgetLedger) -> None:
    _reserve(ledger, "b", 0.1)
    with pytest.raises(IntegrityError, match="already reserved with other parameters"):
        _reserve(ledger, "b", 0.2)
    with pytest.raises(IntegrityError):
        _reserve(ledger, "b", 0.1, queries=17)
    ledger.settle("b", answered=3, actual_rdp=0.05, actor="g")
    with pytest.raises(IntegrityError, match="already settled"):
        ledger.settle("b", answered=4, actual_rdp=0.05, actor="g")
    with pytest.raises(IntegrityError, match="cannot be released"):
        ledger.release("b", reason="late", actor="g")
    _reserve(ledger, "c", 0.1)
    ledger.release("c", reason="x", actor="g")
    with pytest.raises(IntegrityError, match="released"):
        ledger.settle("c", answered=0, actual_rdp=0.0, actor="g")
    assert ledger.verify().ok and ledger.summary()["entries"] == 4


def test_bad_settlements_are_refused_without_writing(ledger: BudgetLedger) -> None:
    with pytest.raises(InputError, match="never reserved"):
        ledger.settle("nope", answered=0, actual_rdp=0.0, actor="g")
    with pytest.raises(InputError, match="never reserved"):
        ledger.release("nope", reason="x", actor="g")
    _reserve(ledger, "b", 0.1)
    with pytest.raises(InputError, match="exceeds its reserved worst case"):
        ledger.settle("b", answered=1, actual_rdp=0.11, actor="g")
    with pytest.raises(InputError, match="cannot have been answered"):
        ledger.settle("b", answered=17, actual_rdp=0.01, actor="g")
    for bad in ({"answered": -1}, {"actual_rdp": float("nan")}, {"actor": ""}):
        args = {"answered": 1, "actual_rdp": 0.01, "actor": "g", **bad}
        with pytest.raises(InputError):
            ledger.settle("b", **args)
    with pytest.raises(InputError, match="JSON"):
        _reserve(ledger, "c", 0.1, params={"x": object()})
    with pytest.raises(InputError, match="queries"):
        _reserve(ledger, "c", 0.1, queries=0)
    assert ledger.summary()["entries"] == 1 and ledger.batch("b").state == "reserved"


def test_budget_refusal_says_requested_remaining_and_difference(ledger: BudgetLedger) -> None:
    budget = ledger.budget_rdp
    _reserve(ledger, "a", budget * 0.75)
    with pytest.raises(BudgetExhaustedError) as info:
        _reserve(ledger, "b", budget * 0.5)
    message = str(info.value)
    assert "needs RDP" in message and "remains" in message and "short by" in message
    assert f"{budget * 0.5:.6g}" in message and f"{budget * 0.25:.6g}" in message
    assert ledger.batch("b") is None and ledger.summary()["entries"] == 1
    # Settling below the reservation frees room; the filter then admits exactly what fits.
    ledger.settle("a", answered=0, actual_rdp=budget * 0.25, actor="g")
    _reserve(ledger, "b", budget * 0.5)
    remaining = ledger.summary()["remaining_rdp"]
    with pytest.raises(BudgetExhaustedError):
        _reserve(ledger, "c", remaining + 1e-9)
    _reserve(ledger, "c", remaining - 1e-9)
    assert ledger.summary()["epsilon_spent"] <= 2.0
    assert ledger.verify().ok


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with BudgetLedger.create(path, epsilon_limit=4.0, delta=1e-6, order=6.0, config=CONFIG) as led:
        _reserve(led, "a", 0.1)
        led.settle("a", answered=2, actual_rdp=0.07, actor="g")
        _reserve(led, "b", 0.2)
        before = led.summary()
    with BudgetLedger.open(path) as again:
        assert again.summary() == before
        assert again.batch("b").state == "reserved"
        assert again.verify().ok


def test_create_and_open_refuse_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=8.0, config={}).close()
    with pytest.raises(InputError, match="already exists"):
        BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=8.0, config={})
    with pytest.raises(InputError, match="no budget ledger"):
        BudgetLedger.open(tmp_path / "missing.db")
    with pytest.raises(InputError, match="cannot be met"):
        BudgetLedger.create(tmp_path / "x.db", epsilon_limit=0.1, delta=1e-5, order=2.0, config={})
    with pytest.raises(InputError, match="delta"):
        BudgetLedger.create(tmp_path / "y.db", epsilon_limit=2.0, delta=1.5, order=8.0, config={})
    with pytest.raises(InputError, match="workload"):
        BudgetLedger.create(tmp_path / "z.db", epsilon_limit=1.0, delta=1e-5, config={})
    with pytest.raises(InputError, match="does not exist"):
        BudgetLedger.create(tmp_path / "no" / "l.db", epsilon_limit=2.0, delta=1e-5, order=8.0, config={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.db"]  # nothing half-written
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(IntegrityError):
        BudgetLedger.open(junk)


def test_order_picked_by_the_planner(tmp_path: Path) -> None:
    workload = ConfidentGNMaxAccountant(teachers=250, classes=10, threshold=170, sigma1=100, sigma2=40)
    led = BudgetLedger.create(
        tmp_path / "l.db", epsilon_limit=10.0, delta=1e-5, config=CONFIG, workload=workload, answer_rate=0.3
    )
    expected = plan(
        teachers=250,
        classes=10,
        threshold=170,
        sigma1=100,
        sigma2=40,
        epsilon=10.0,
        delta=1e-5,
        answer_rate=0.3,
    )
    assert led.order == expected["order"]
    assert led.budget_rdp == pytest.approx(expected["budget_rdp"], rel=1e-12)
    led.close()


def test_open_or_create_checks_the_parameters(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    args = {"epsilon_limit": 5.0, "delta": 1e-5, "order": 8.0, "config": CONFIG}
    with BudgetLedger.open_or_create(path, **args) as led:
        _reserve(led, "a", 0.1)
    with BudgetLedger.open_or_create(path, **args) as led:
        assert led.batch("a") is not None
    for change in ({"epsilon_limit": 6.0}, {"order": 9.0}, {"config": {**CONFIG, "teachers": 1}}):
        with pytest.raises(IntegrityError, match="another budget or federation"):
            BudgetLedger.open_or_create(path, **{**args, **change})


def test_rows_are_append_only(ledger: BudgetLedger) -> None:
    _reserve(ledger, "a", 0.1)
    raw = sqlite3.connect(ledger.path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute("UPDATE entries SET rdp = 0 WHERE seq = 1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute("DELETE FROM entries")
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        raw.execute("UPDATE meta SET epsilon_limit = 100")
    raw.close()


def _tamper(path: Path, *statements: str) -> None:
    """What an attacker with file access would do: drop the guards and edit."""
    raw = sqlite3.connect(path, isolation_level=None)
    for trigger in ("entries_no_update", "entries_no_delete", "meta_no_update", "meta_no_delete",
                    "state_follows_entries", "state_no_delete"):  # fmt: skip
        raw.execute(f"DROP TRIGGER {trigger}")
    for statement in statements:
        raw.execute(statement)
    raw.close()


@pytest.mark.parametrize(
    ("statements", "problem"),
    [
        (["UPDATE entries SET rdp = 0.001, units = 281474976711 WHERE seq = 2"], "hash mismatch"),
        (["DELETE FROM entries WHERE seq = 2"], "sequence gap"),
        (["UPDATE state SET spent_units = 0"], "stored totals differ"),
        (["UPDATE entries SET prev_hash = hash WHERE seq = 3"], "does not link"),
    ],
)
def test_verify_detects_tampering(tmp_path: Path, statements: list[str], problem: str) -> None:
    path = tmp_path / "l.db"
    with BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG) as led:
        _reserve(led, "a", 0.1)
        led.settle("a", answered=2, actual_rdp=0.08, actor="g")
        _reserve(led, "b", 0.1)
    _tamper(path, *statements)
    with BudgetLedger.open(path) as led:
        report = led.verify()
    assert not report.ok
    assert any(problem in p for p in report.problems), report.problems


def _hundredfold(path: Path) -> None:
    """Edit the ``meta`` row to a 100× budget, as an attacker with file access would."""
    _tamper(path, "UPDATE meta SET epsilon_limit = epsilon_limit * 100, budget_rdp = budget_rdp * 100, "
            "budget_units = budget_units * 100")  # fmt: skip


def test_open_refuses_edited_parameters(tmp_path: Path) -> None:
    """Issue 25.5: an edited ``meta`` row is refused when the ledger opens, not trusted until ``verify()``."""
    path = tmp_path / "l.db"
    with BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG) as led:
        _reserve(led, "a", 0.1)
    _hundredfold(path)
    with pytest.raises(IntegrityError, match=r"parameters were edited.*genesis hash"):
        BudgetLedger.open(path)
    # Recomputing the genesis too does not help: the first entry links to the original one.
    raw = sqlite3.connect(path, isolation_level=None)
    keys = "format, created, epsilon_limit, delta, rdp_order, budget_rdp, budget_units, config, config_hash"
    meta = dict(zip(keys.split(", "), raw.execute(f"SELECT {keys} FROM meta").fetchone(), strict=True))
    raw.execute("UPDATE meta SET genesis = ?", (_sha256(_canonical(meta)),))
    raw.close()
    with pytest.raises(IntegrityError, match="first entry does not link to the ledger's genesis"):
        BudgetLedger.open(path)


def test_verify_reads_one_snapshot_while_a_guardian_appends(tmp_path: Path, monkeypatch) -> None:
    """Verify reads the stored totals and the entries in one read transaction: a row another process appends
    in between (here: deterministically, right after the totals are read) is not a mismatch."""
    path = tmp_path / "l.db"
    reader = BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG)
    writer = BudgetLedger.open(path)  # another connection: what a live guardian holds
    _reserve(writer, "a", 0.1)
    original = BudgetLedger._state
    appended: list[str] = []

    def state_then_append(db: sqlite3.Connection) -> dict[str, Any]:
        state = original(db)
        if db is reader._db and not appended:
            appended.append("b")
            _reserve(writer, "b", 0.1)
        return state

    monkeypatch.setattr(BudgetLedger, "_state", staticmethod(state_then_append))
    report = reader.verify()
    assert appended == ["b"]
    assert report.ok, report.problems
    assert report.entries == 1  # the snapshot taken before the append
    monkeypatch.undo()
    assert reader.verify().ok and reader.verify().entries == 2
    reader.close()
    writer.close()


def test_threads_sharing_one_ledger_cannot_overspend(ledger: BudgetLedger) -> None:
    cost = ledger.budget_rdp / 40.5  # exactly 40 batches fit
    won: list[int] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        mine = 0
        for i in range(30):
            try:
                _reserve(ledger, f"{name}-{i}", cost)
            except BudgetExhaustedError:
                continue
            ledger.settle(f"{name}-{i}", answered=16, actual_rdp=cost, actor=name)
            mine += 1
        with lock:
            won.append(mine)

    threads = [threading.Thread(target=worker, args=(f"t{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won) == 40
    assert ledger.verify().ok and ledger.summary()["epsilon_spent"] <= 2.0


def test_in_memory_filter() -> None:
    f = RenyiFilter.for_budget(epsilon=2.0, delta=1e-5, order=10.0)
    assert f.epsilon_spent == 0.0
    f.charge(f.budget_rdp / 2, what="first half")
    f.charge(f.budget_rdp / 2, what="second half")
    assert f.epsilon_spent == pytest.approx(2.0, rel=1e-12)
    with pytest.raises(BudgetExhaustedError, match=r"third.*short by"):
        f.charge(1e-6, what="third")
    assert len(f.charges) == 2
    with pytest.raises(InputError):
        RenyiFilter.for_budget(epsilon=0.1, delta=1e-5, order=1.5)
