"""BudgetLedger.history: the figures after each entry (the dashboard's ε-over-time chart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capc_common.errors import InputError
from capc_common.privacy import BudgetLedger

CONFIG = {"federation": "test"}
_FIGURES = ("epsilon_spent", "epsilon_settled", "spent_rdp", "reserved_rdp", "queries", "answered", "batches")


def _run(ledger: BudgetLedger, batches: int) -> None:
    for i in range(batches):
        batch = f"b{i}"
        ledger.reserve(batch, queries=16, parties=["h1"], mechanism="m", params={}, worst_case_rdp=0.05,
                       actor="student")  # fmt: skip
        if i % 3 == 2:
            ledger.release(batch, reason="quorum not met", actor="guardian")
        else:
            ledger.settle(batch, answered=i % 16, actual_rdp=0.01 + 0.001 * i, actor="guardian")


def test_every_point_is_the_summary_of_its_prefix(tmp_path: Path) -> None:
    with BudgetLedger.create(
        tmp_path / "l.db", epsilon_limit=4.0, delta=1e-5, order=10.0, config=CONFIG
    ) as led:
        # Prepare: a replay reference, the summary after each entry
        after: list[dict[str, object]] = []
        _run(led, 9)
        full = led.history(points=1000)
        assert [p["seq"] for p in full] == list(range(1, 19))
        with BudgetLedger.create(
            tmp_path / "r.db", epsilon_limit=4.0, delta=1e-5, order=10.0, config=CONFIG
        ) as ref:
            for entry in led.entries():
                if entry.kind == "reserve":
                    ref.reserve(entry.batch_id, queries=16, parties=["h1"], mechanism="m", params={},
                                worst_case_rdp=entry.rdp, actor="student")  # fmt: skip
                elif entry.kind == "settle":
                    ref.settle(
                        entry.batch_id, answered=entry.answered, actual_rdp=entry.rdp, actor="guardian"
                    )
                else:
                    ref.release(entry.batch_id, reason="x", actor="guardian")
                after.append({k: ref.summary()[k] for k in _FIGURES})
        assert [{k: p[k] for k in _FIGURES} for p in full] == after
        # Execute: at most N evenly spaced points, always the last
        few = led.history(points=4)
        assert len(few) <= 4 and few[-1] == full[-1]
        assert {k: few[-1][k] for k in _FIGURES} == {k: led.summary()[k] for k in _FIGURES}
        with pytest.raises(InputError, match="points must be an integer ≥ 1"):
            led.history(points=0)


def test_an_empty_ledger_has_no_points(tmp_path: Path) -> None:
    with BudgetLedger.create(
        tmp_path / "l.db", epsilon_limit=4.0, delta=1e-5, order=10.0, config=CONFIG
    ) as led:
        assert led.history() == []
