"""A child process that hammers a budget ledger (run by test_ledger_processes.py, not collected by pytest).

python ledger_worker.py loop PATH NAME     reserve/settle/release forever (until killed)
python ledger_worker.py race PATH NAME RDP reserve+settle RDP-sized batches until the budget refuses
"""

from __future__ import annotations

import json
import sys
import time

from capc_common.errors import BudgetExhaustedError
from capc_common.privacy import BudgetLedger


def loop(path: str, name: str) -> None:
    ledger = BudgetLedger.open(path)
    print("ready", flush=True)
    i = 0
    while True:
        batch = f"{name}-{i}"
        worst = 1e-4 * (1 + i % 7)
        ledger.reserve(
            batch, queries=8, parties=["p1", "p2"], mechanism="confident-gnmax", params={"i": i},
            worst_case_rdp=worst, actor=name,
        )  # fmt: skip
        if i % 5 == 4:
            ledger.release(batch, reason="quorum not met", actor=name)
        else:
            ledger.settle(batch, answered=i % 9, actual_rdp=worst * (i % 3) / 2, actor=name)
        i += 1


def race(path: str, name: str, rdp: float) -> None:
    ledger = BudgetLedger.open(path)
    print("ready", flush=True)
    sys.stdin.readline()  # the parent starts every racer at once
    won = 0
    i = 0
    while True:
        batch = f"{name}-{i}"
        i += 1
        try:
            ledger.reserve(
                batch, queries=1, parties=["p"], mechanism="m", params={}, worst_case_rdp=rdp, actor=name
            )
        except BudgetExhaustedError:
            break
        ledger.settle(batch, answered=1, actual_rdp=rdp, actor=name)
        won += 1
        time.sleep(0.002)  # a real batch takes time; without it one writer can hog SQLite's lock
    print(json.dumps({"won": won}), flush=True)


if __name__ == "__main__":
    mode, path, name, *rest = sys.argv[1:]
    if mode == "loop":
        loop(path, name)
    else:
        race(path, name, float(rest[0]))
