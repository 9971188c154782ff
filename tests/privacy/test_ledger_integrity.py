"""A damaged or edited ledger file: totals are recomputed from the chained entries (never read from the
``state`` cache), a failed check refuses every charge, and real flipped bytes are reported, not crashed on."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from capc_cli.main import main
from capc_common.errors import IntegrityError
from capc_common.privacy import BudgetLedger

CONFIG = {"federation": "integrity", "teachers": 250}


def _reserve(led: BudgetLedger, batch: str, rdp: float) -> Any:
    return led.reserve(
        batch, queries=16, parties=["h1"], mechanism="confident-gnmax", params={"b": batch},
        worst_case_rdp=rdp, actor="student",
    )  # fmt: skip


def _ledger(path: Path, batches: int = 3) -> BudgetLedger:
    led = BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=CONFIG)
    for i in range(batches):
        _reserve(led, f"batch-{i}", 0.1)
        led.settle(f"batch-{i}", answered=4, actual_rdp=0.05, actor="guardian")
    return led


def test_state_moves_only_with_a_new_entry(tmp_path: Path) -> None:
    with _ledger(tmp_path / "l.db"):
        pass
    raw = sqlite3.connect(tmp_path / "l.db")
    with pytest.raises(sqlite3.IntegrityError, match="only with a new entry"):
        raw.execute("UPDATE state SET spent_units = 0")
    with pytest.raises(sqlite3.IntegrityError, match="derived from the entries"):
        raw.execute("DELETE FROM state")
    raw.close()


def test_edited_totals_are_not_trusted(tmp_path: Path) -> None:
    """The review's attack: `UPDATE state SET spent_units=0` on the file (its guard dropped first)."""
    path = tmp_path / "l.db"
    with _ledger(path) as led:
        truth = led.summary()
        big = led.budget_rdp - 0.1  # fits only if the settled 0.15 RDP were forgotten
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DROP TRIGGER IF EXISTS state_follows_entries")
    raw.execute("UPDATE state SET spent_units = 0")
    raw.close()
    with BudgetLedger.open(path) as led:
        shown = led.summary()
        assert shown["epsilon_spent"] == truth["epsilon_spent"] > 0
        assert shown["spent_rdp"] == truth["spent_rdp"]
        with pytest.raises(IntegrityError, match="stored totals differ"):
            _reserve(led, "too-big", big)
        assert led.batch("too-big") is None
        assert not led.verify().ok


def test_an_edited_entry_refuses_every_charge(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with _ledger(path):
        pass
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DROP TRIGGER entries_no_update")
    raw.execute("UPDATE entries SET rdp = 0.0, units = 0 WHERE seq = 2")
    raw.close()
    with BudgetLedger.open(path) as led:
        assert not led.summary()["chain_ok"]
        with pytest.raises(IntegrityError, match="hash mismatch"):
            _reserve(led, "next", 0.01)


def test_rows_from_another_writer_are_checked_as_they_appear(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with _ledger(path, batches=1) as first, BudgetLedger.open(path) as second:
        _reserve(second, "from-second", 0.1)
        second.settle("from-second", answered=1, actual_rdp=0.05, actor="guardian")
        assert first.summary() == second.summary()
        _reserve(first, "from-first", 0.1)
        assert second.summary()["entries"] == first.summary()["entries"] == 5
        assert first.verify().ok


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x80
    path.write_bytes(bytes(data))


def _verify(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["budget", "verify", "--ledger", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return int(info.value.code or 0), out + err


def test_a_flipped_byte_in_a_text_field_is_reported_with_exit_5(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The campaign's crash: a bit flip that leaves invalid UTF-8 in a row (sqlite3 cannot decode it)."""
    path = tmp_path / "l.db"
    with _ledger(path):
        pass
    _flip(path, path.read_bytes().index(b"batch-1"))  # 'b' | 0x80: not valid UTF-8
    code, output = _verify(capsys, path)
    assert code == 5, output
    assert "FAILED" in output or "damaged" in output or "cannot" in output


def test_flipped_bytes_anywhere_never_crash_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One bit flipped at each of many offsets of a real ledger file: exit 5 (reported) or 0 (the byte was
    unused and every entry still verifies), never a traceback or another code."""
    original = tmp_path / "original.db"
    with _ledger(original, batches=6) as led:
        head = led.summary()["head"]
    data = original.read_bytes()
    path = tmp_path / "flipped.db"
    outcomes = {0: 0, 5: 0}
    for offset in range(0, len(data), 97):
        path.write_bytes(data)
        _flip(path, offset)
        code, output = _verify(capsys, path)
        assert code in outcomes, (offset, code, output)
        outcomes[code] += 1
        if code == 0:
            assert head in output
    assert outcomes[5] > 0
