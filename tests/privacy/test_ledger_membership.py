"""Membership entries: a ledger continues under a new federation config through one hash-chained,
admin-authorised entry; the budget carries over, the old config reserves nothing more, and `verify` (and the
admin token) catch an edited, forged or unauthorised change."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from capc_cli.main import main
from capc_common.errors import InputError, IntegrityError, UnavailableError
from capc_common.privacy import BudgetLedger

OLD = {"federation": "test", "teachers": ["h1", "h2"]}
NEW = {"federation": "test", "teachers": ["h1", "h2", "h3"]}
TOKEN = "admin-token-" + "x" * 32


def _hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _reserve(led: BudgetLedger, batch: str, rdp: float = 0.1) -> Any:
    return led.reserve(
        batch, queries=16, parties=["h1", "h2"], mechanism="confident-gnmax", params={}, worst_case_rdp=rdp,
        actor="student",
    )  # fmt: skip


def _change(led: BudgetLedger, *, previous: str | None = None, key: str = TOKEN) -> Any:
    return led.change_membership(
        previous=previous or _hash(OLD), config=NEW, added=["h3"], retired=[], key=key, actor="admin"
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def ledger(path: Path) -> BudgetLedger:
    led = BudgetLedger.create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=OLD)
    yield led
    led.close()


def test_the_budget_carries_over_and_the_new_config_is_in_force(ledger: BudgetLedger, path: Path) -> None:
    _reserve(ledger, "a")
    ledger.settle("a", answered=3, actual_rdp=0.05, actor="guardian")
    before = ledger.summary()
    entry = _change(ledger)
    assert (entry.seq, entry.kind, entry.rdp, entry.parties) == (3, "membership", 0.0, ("h3",))
    assert entry.params["from"] == _hash(OLD) and entry.params["to"] == _hash(NEW)
    assert entry.params["config"] == NEW and entry.params["added"] == ["h3"]
    assert "added h3" in entry.detail
    after = ledger.summary()
    assert after["spent_rdp"] == before["spent_rdp"] and after["epsilon_spent"] == before["epsilon_spent"]
    assert after["config_hash"] == ledger.config_hash_in_force == _hash(NEW)
    assert ledger.config_hash == _hash(OLD)  # the genesis config is unchanged
    report = ledger.verify()
    assert report.ok, report.problems
    assert ledger.check_authorisations(TOKEN) == {}
    # A ledger opened under the new config charges on, from where the old one stopped.
    with BudgetLedger.open_or_create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=NEW) as led:
        _reserve(led, "b")
        led.settle("b", answered=1, actual_rdp=0.02, actor="guardian")
        assert led.summary()["spent_rdp"] == pytest.approx(0.07)
        assert [e.kind for e in led.membership_changes()] == ["membership"]
        assert led.verify().ok


def test_open_reservations_are_released_and_computing_ones_still_settle(ledger: BudgetLedger) -> None:
    _reserve(ledger, "open")
    _reserve(ledger, "busy")
    ledger.begin("busy", computation="n1", actor="guardian")
    entry = _change(ledger)
    assert ledger.batch("open").state == "released"
    assert "membership change" in ledger.batch("open").detail
    assert ledger.batch("busy").state == "computing"
    # The computation that began before the change settles after it (its worst case was reserved).
    ledger.settle("busy", answered=2, actual_rdp=0.04, actor="guardian", computation="n1")
    kinds = [(e.kind, e.batch_id) for e in ledger.entries()]
    assert kinds[-3:] == [("release", "open"), ("membership", entry.batch_id), ("settle", "busy")]
    assert ledger.verify().ok


def test_the_old_config_reserves_nothing_more(ledger: BudgetLedger, path: Path) -> None:
    with BudgetLedger.open(path) as other:  # e.g. a second guardian process on the same ledger
        _change(ledger)
        for led in (ledger, other):
            with pytest.raises(UnavailableError, match=r"federation changed at ledger entry 1 \(added h3"):
                _reserve(led, "late")
    with pytest.raises(IntegrityError, match=r"changed at ledger entry 1.*install the new federation\.yaml"):
        BudgetLedger.open_or_create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config=OLD)
    with pytest.raises(IntegrityError, match=r"another budget or federation.*capc guardian membership"):
        BudgetLedger.open_or_create(path, epsilon_limit=2.0, delta=1e-5, order=10.0, config={"other": 1})
    with pytest.raises(IntegrityError, match="is in force on this ledger since ledger entry 1"):
        _change(ledger)  # the same change again: the ledger moved on already
    with pytest.raises(InputError, match="admin token"):
        _change(ledger, previous=_hash(NEW), key="")


def _edit(path: Path, sql: str, *args: Any) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DROP TRIGGER entries_no_update")
    raw.execute(sql, args)
    raw.close()


def test_an_edited_membership_entry_fails_verify(ledger: BudgetLedger, path: Path) -> None:
    _reserve(ledger, "a")
    ledger.settle("a", answered=3, actual_rdp=0.05, actor="guardian")
    entry = _change(ledger)
    # The change smuggles in a larger budget: the config inside the entry is edited after the fact.
    params = {**entry.params, "config": {**NEW, "epsilon": 20.0}}
    _edit(path, "UPDATE entries SET params = ? WHERE seq = ?", json.dumps(params), entry.seq)
    with BudgetLedger.open(path) as led:
        report = led.verify()
    assert not report.ok
    assert any(f"entry {entry.seq} (membership" in p and "hash mismatch" in p for p in report.problems)
    assert any("does not match its hash" in p for p in report.problems), report.problems


def test_a_forged_membership_entry_fails_verify_or_the_token_check(ledger: BudgetLedger) -> None:
    """Whoever can write the file could append a well-formed row; the chain shows a row that continues no
    config in force, and the admin token shows a row it did not authorise."""
    with ledger._write() as db:
        ledger._append(
            db, now=0.0, batch_id="m", kind="membership", queries=0, answered=0, parties=("h3",),
            mechanism="membership", params={"from": "0" * 64, "to": _hash(NEW), "config": NEW,
                                            "added": ["h3"], "retired": [], "mac": "f" * 64},
            rdp=0.0, units=0, detail="forged", actor="intruder",
        )  # fmt: skip
    report = ledger.verify()
    assert not report.ok
    assert any("changes federation config 0000000000000000, but" in p for p in report.problems)


def test_a_change_the_token_did_not_authorise_is_found(ledger: BudgetLedger, path: Path) -> None:
    _change(ledger, key="another-token-" + "y" * 32)
    assert ledger.verify().ok  # well-formed and chained …
    problems = ledger.check_authorisations(TOKEN)  # … but not signed off by this federation's admin token
    assert list(problems) == [1] and "entry 1 (added h3" in problems[1] and "not authorised" in problems[1]
    assert ledger.check_authorisations("another-token-" + "y" * 32) == {}


def _verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["budget", "verify", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out + err


def test_budget_verify_checks_chains_with_membership_entries(
    ledger: BudgetLedger, path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _reserve(ledger, "a")
    ledger.settle("a", answered=3, actual_rdp=0.05, actor="guardian")
    _change(ledger)
    token, other = tmp_path / "admin.token", tmp_path / "other.token"
    for file, secret in ((token, TOKEN), (other, "another-token-" + "y" * 32)):
        file.write_text(secret)
        file.chmod(0o600)
    code, out = _verify(capsys, "--ledger", str(path))
    assert code == 0 and "verification OK: 3 entries" in out
    assert "membership entry 3: added h3" in out and "authorisation not checked" in out
    code, out = _verify(capsys, "--ledger", str(path), "--admin-token-file", str(token))
    assert code == 0 and "(authorised by the admin token)" in out
    code, out = _verify(capsys, "--ledger", str(path), "--admin-token-file", str(other))
    assert code == 5 and "NOT authorised by this admin token" in out
    _edit(path, "UPDATE entries SET detail = 'added nobody' WHERE seq = 3")
    code, out = _verify(capsys, "--ledger", str(path), "--format", "json")
    assert code == 5
    report = json.loads(out.splitlines()[0])
    assert not report["ok"] and any("entry 3 (membership" in p for p in report["problems"])
