"""What must hold on a federation's files after any fault: the ledger verifies, nothing is charged twice or
not at all, nothing paid for is lost (shared by the kill campaign and the network and disk campaign)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from capc_common.privacy import BudgetLedger


def store_rows(store: Path) -> list[tuple[str, str, int]]:
    """(batch id, state, answered) of every batch in a student's label store (read-only)."""
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
        return db.execute("SELECT batch_id, state, answered FROM batches").fetchall()


def check_files(ledger_path: Path, store_path: Path) -> dict[str, Any]:
    """The invariants, on a ledger and a label store as they are now.

    The federation keeps labelling meanwhile, so each invariant reads the two files in the order that makes
    it exact: labels stored ⇒ charged reads the store *before* the ledger (a batch stored before the first
    read was settled before it), charged ⇒ labels kept reads the store *after* the ledger.
    """
    rows = store_rows(store_path)
    with BudgetLedger.open(ledger_path) as ledger:
        report = ledger.verify()
        summary = ledger.summary()
        kinds: dict[str, list[str]] = {}
        answered: dict[str, int] = {}
        for entry in ledger.entries():
            kinds.setdefault(entry.batch_id, []).append(entry.kind)
            if entry.kind == "settle":
                answered[entry.batch_id] = entry.answered
    later = store_rows(store_path)
    double = sum(
        1 for k in kinds.values() if k.count("settle") + k.count("release") > 1 or k.count("compute") > 1
    )
    uncharged = lost = unrevealed = 0
    for batch_id, state, stored in rows:
        settled = batch_id in answered
        if state == "done" and (not settled or answered[batch_id] != stored):
            uncharged += 1  # labels the ledger did not charge (or charged for fewer answers)
    for batch_id, state, _ in later:
        ledger_kinds = kinds.get(batch_id, [])
        settled = "settle" in ledger_kinds
        if state == "lost":
            if settled:
                lost += 1  # paid for, labels gone
            elif "compute" in ledger_kinds:
                unrevealed += 1  # held at its worst case, no label ever revealed
    return {
        "ledger_ok": report.ok,
        "problems": report.problems,
        "double_charged": double,
        "uncharged": uncharged,
        "lost": lost,
        "charged_unrevealed": unrevealed,
        "epsilon_spent": float(summary["epsilon_spent"]),
        "epsilon_limit": float(summary["epsilon_limit"]),
        # Settled, labels not stored yet: the batch in flight, or one the student recovers on resuming.
        "settled_open_at_student": {b for b, state, _ in later if state == "open" and b in answered},
    }
