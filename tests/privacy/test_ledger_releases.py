"""A release plan on the ledger: each release is charged in one transaction with its receipt (all of it or
nothing, a full disk included), its round lies within the plan and is charged once — the chain's
recomputation (``capc budget verify``) checks both — and what the student made of it is kept once."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from capc_cli.main import cli
from capc_common.errors import BudgetExhaustedError, InputError, IntegrityError, StorageError
from capc_common.privacy import BudgetLedger

PLAN = 3


def _ledger(path: Path) -> BudgetLedger:
    return BudgetLedger.create(path, epsilon_limit=4.0, delta=1e-5, order=10.0, config={"plan": "releases"})


def _charge(led: BudgetLedger, round: int, *, planned: int = PLAN, receipt: bytes = b"masked", rdp=0.1):
    return led.charge(
        f"release-{round:06d}", parties=["h1", "h2"], mechanism="dp-prototypes",
        params={"rho": 0.01, "release": {"round": round, "planned": planned}}, rdp=rdp,
        computation=f"nonce-{round}", actor="guardian", receipt=receipt,
    )  # fmt: skip


def test_a_charge_is_three_rows_and_a_receipt_or_nothing(tmp_path: Path) -> None:
    with _ledger(tmp_path / "l.db") as led:
        entry = _charge(led, 0, receipt=b"x" * 200_000)
        assert entry.kind == "settle" and [e.kind for e in led.entries()] == ["reserve", "compute", "settle"]
        assert led.receipt("release-000000") == ("nonce-0", b"x" * 200_000)
        with pytest.raises(IntegrityError, match="charged once"):
            _charge(led, 0)
        # SQLite's own SQLITE_FULL: the file may not grow by the next receipt. SQLite rolled the charge back
        # by itself: a full volume, named as such (never "damaged", never "restore a backup").
        (pages,) = led._db.execute("PRAGMA page_count").fetchone()
        led._db.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StorageError, match="is full") as refused:
            _charge(led, 1, receipt=b"y" * 200_000)
        assert "backup" not in str(refused.value)
        led._db.execute("PRAGMA max_page_count = 1073741823")
        assert led.batch("release-000001") is None and led.summary()["entries"] == 3
        _charge(led, 1)  # the rolled-back charge left the instance's totals as the file's
        assert led.verify().ok and led.summary()["spent_rdp"] == pytest.approx(0.2)
        with pytest.raises(BudgetExhaustedError):
            _charge(led, 2, rdp=led.budget_rdp)
        assert led.batch("release-000002") is None


def test_the_chain_counts_the_plans_rounds(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with _ledger(path) as led:
        for round in range(2):
            _charge(led, round)
        assert led.release_plan() == (PLAN, {0: "release-000000", 1: "release-000001"}, 2)
        report = led.verify()
        assert report.ok and (report.totals["releases"], report.totals["releases_planned"]) == (2, PLAN)
    shown = CliRunner().invoke(cli, ["budget", "verify", "--ledger", str(path)])
    assert shown.exit_code == 0 and "releases: 2 of the plan's 3, each round charged once" in shown.output
    # A row the guardian never writes: round 0 again under another id, and a round beyond the plan.
    for forged, problem in (("again", "round 0 is charged twice"), ("beyond", "outside the plan")):
        copy = tmp_path / f"{forged}.db"
        copy.write_bytes(path.read_bytes())
        with BudgetLedger.open(copy) as led:
            led.reserve(
                f"release-{forged}", queries=1, parties=["h1"], mechanism="dp-prototypes",
                params={"release": {"round": 0 if forged == "again" else PLAN, "planned": PLAN}},
                worst_case_rdp=0.1, actor="someone",
            )  # fmt: skip
            report = led.verify()
            assert not report.ok and any(problem in p for p in report.problems), report.problems
            with pytest.raises(IntegrityError, match="failed verification"):
                _charge(led, 2)  # a ledger that fails its checks charges nothing more


def test_a_deposit_is_kept_once_with_a_settled_release(tmp_path: Path) -> None:
    with _ledger(tmp_path / "l.db") as led:
        with pytest.raises(InputError, match="not settled"):
            led.deposit("release-000000", data=b"total", actor="student")
        _charge(led, 0)
        entries = led.summary()["entries"]
        assert led.deposit("release-000000", data=b"total", actor="student") is True
        assert led.deposit("release-000000", data=b"total", actor="student") is False  # a retry
        with pytest.raises(InputError, match="another deposited output"):
            led.deposit("release-000000", data=b"other", actor="student")
        assert led.deposited("release-000000") == b"total" and led.deposited("release-000001") is None
        assert led.summary()["entries"] == entries and led.verify().ok  # no chained row: it costs nothing
