"""The ledger under real processes: SIGKILL at random moments, and several writers racing to overspend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from capc_common.privacy import BudgetLedger
from capc_common.privacy.ledger import UNITS_PER_NAT

WORKER = Path(__file__).with_name("ledger_worker.py")


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if line != "ready":
        raise AssertionError(f"worker did not start: {line!r} {child.stderr.read() if child.stderr else ''}")


def test_sigkill_at_random_moments_leaves_a_consistent_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    BudgetLedger.create(path, epsilon_limit=50.0, delta=1e-5, order=8.0, config={"test": "kill"}).close()
    rng = np.random.default_rng(20260101)  # non-secret: only the kill timing
    rounds, writers = 2, 3
    kills = rounds * writers
    for run in range(rounds):
        # Several writers share the file, and each is killed at its own random moment.
        children = [_spawn("loop", str(path), f"run{run}.{w}") for w in range(writers)]
        for child in children:
            _wait_ready(child)
        for child in children:
            time.sleep(float(rng.uniform(0.01, 0.15)))
            os.kill(child.pid, signal.SIGKILL)
        for child in children:
            child.wait(timeout=30)
            assert child.returncode == -signal.SIGKILL
        # After every crash the file reopens, verifies, and accepts new work.
        with BudgetLedger.open(path) as ledger:
            report = ledger.verify()
            assert report.ok, report.problems
    with BudgetLedger.open(path) as ledger:
        summary = ledger.summary()
        report = ledger.verify()
        assert report.ok, report.problems
        assert summary["entries"] > 4 * kills  # the children did real work before dying
        # Each killed child can leave at most one reservation open; it stays counted at its worst case.
        assert summary["open_batches"] <= kills
        open_rdp = sum(
            e.rdp
            for e in ledger.entries()
            if e.kind == "reserve" and ledger.batch(e.batch_id).state == "reserved"
        )
        assert abs(summary["reserved_rdp"] - open_rdp) <= 1e-9
        assert summary["epsilon_spent"] >= summary["epsilon_settled"]
        assert report.totals["reserved_rdp"] == summary["reserved_rdp"]
        ledger.reserve(
            "after", queries=1, parties=["p"], mechanism="m", params={}, worst_case_rdp=0.01, actor="t"
        )
        ledger.settle("after", answered=0, actual_rdp=0.0, actor="t")
        assert ledger.verify().ok


def test_concurrent_writers_cannot_overspend(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    with BudgetLedger.create(
        path, epsilon_limit=3.0, delta=1e-5, order=8.0, config={"test": "race"}
    ) as ledger:
        budget_units = ledger.budget_units
    cost = 0.0137
    per_batch = int(np.ceil(cost * UNITS_PER_NAT))
    children = [_spawn("race", str(path), f"w{i}", repr(cost)) for i in range(3)]
    for child in children:
        _wait_ready(child)
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    won = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        won.append(json.loads(out)["won"])
    assert sum(won) == budget_units // per_batch  # every fitting batch got in, not one more
    assert sum(w > 0 for w in won) >= 2, won  # they really did race (a starved writer is allowed)
    with BudgetLedger.open(path) as ledger:
        summary = ledger.summary()
        assert ledger.verify().ok
        assert summary["remaining_rdp"] >= 0
        assert summary["batches"] == sum(won)
        assert summary["epsilon_spent"] <= 3.0
