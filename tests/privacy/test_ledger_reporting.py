"""What the ledger reports: ε settled and reserved apart (settled never falls), and pinned heads that expose
a cleanly cut tail."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import pytest

from capc_cli.main import main
from capc_common.errors import InputError
from capc_common.privacy import BudgetLedger
from capc_services.local.demo import budget_line

CONFIG = {"federation": "reporting"}


def _reserve(led: BudgetLedger, batch: str, rdp: float) -> Any:
    return led.reserve(
        batch, queries=16, parties=["h1"], mechanism="confident-gnmax", params={}, worst_case_rdp=rdp,
        actor="student",
    )  # fmt: skip


@pytest.fixture
def ledger(tmp_path: Path) -> BudgetLedger:
    led = BudgetLedger.create(tmp_path / "l.db", epsilon_limit=8.0, delta=1e-5, order=10.0, config=CONFIG)
    yield led
    led.close()


def test_settled_and_reserved_add_up_and_settled_never_falls(ledger: BudgetLedger) -> None:
    """The demo's "ε spent" fell (3.92 → 6.92 → 7.88 → 7.64) as worst-case reservations settled lower."""
    spent, settled = [], []
    for i in range(4):
        _reserve(ledger, f"a{i}", 0.4)
        _reserve(ledger, f"b{i}", 0.4)  # two in flight, as the student's pipeline keeps them
        for batch in (f"a{i}", f"b{i}"):
            s = ledger.summary()
            assert s["epsilon_settled"] + s["epsilon_reserved"] == pytest.approx(
                s["epsilon_spent"], abs=1e-12
            )
            assert s["epsilon_reserved"] >= 0
            spent.append(s["epsilon_spent"])
            settled.append(s["epsilon_settled"])
            ledger.settle(batch, answered=3, actual_rdp=0.1, actor="guardian")
    assert any(b < a for a, b in itertools.pairwise(spent))  # what the demo used to print
    assert settled == sorted(settled) and settled[-1] > 0
    final = ledger.summary()
    assert final["epsilon_reserved"] == 0 and final["epsilon_spent"] == final["epsilon_settled"]
    totals = ledger.verify().totals
    assert (totals["epsilon_settled"], totals["epsilon_reserved"]) == (final["epsilon_settled"], 0.0)
    assert budget_line(final) == f"ε settled {final['epsilon_settled']:.3f} of 8"
    _reserve(ledger, "open", 0.4)
    assert "reserved) of 8" in budget_line(ledger.summary())


def test_a_pinned_head_exposes_a_cut_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, old = tmp_path / "l.db", tmp_path / "restored-old-copy.db"
    with BudgetLedger.create(path, epsilon_limit=8.0, delta=1e-5, order=10.0, config=CONFIG) as led:
        genesis = led.summary()["head"]
        _reserve(led, "a", 0.2)
        led.settle("a", answered=1, actual_rdp=0.1, actor="guardian")
    shutil.copy(path, old)  # the ledger as it was after batch a: later a clean tail cut
    with BudgetLedger.open(path) as led:
        middle = led.summary()["head"]
        _reserve(led, "b", 0.2)
        led.settle("b", answered=1, actual_rdp=0.1, actor="guardian")
        pinned = led.summary()["head"]
        assert [led.verify(expect_head=h).expected_head_at for h in (genesis, middle, pinned)] == [0, 2, 4]
    with BudgetLedger.open(old) as led:
        assert led.verify().ok  # the cut chain is consistent on its own
        report = led.verify(expect_head=pinned)
        assert not report.ok and "is not in the chain" in report.problems[0]
        with pytest.raises(InputError, match="64 lowercase hex"):
            led.verify(expect_head="abc")

    def verify(ledger: Path, head: str) -> tuple[int, str]:
        with pytest.raises(SystemExit) as info:
            main(["budget", "verify", "--ledger", str(ledger), "--expect-head", head])
        return int(info.value.code or 0), "".join(capsys.readouterr())

    code, out = verify(path, middle)
    assert code == 0 and "pinned head found at entry 2 of 4" in out
    code, out = verify(old, pinned)
    assert code == 5 and "removed from its end" in out
    assert verify(path, "not-a-hash")[0] == 2
