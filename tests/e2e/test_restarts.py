"""Crashed parties, restarted with the same command, as real processes: nothing lost, nothing silent.

* kill -9 of the guardian: the student's /readyz and `capc local status` say it is not labelling, and once
  the guardian is restarted the student reconnects and resumes by itself.
* kill -9 of the student 8 times in the window between the guardian's settle and the student's label store:
  every batch the ledger settled ends up with its labels stored — none lost.
* the chaos campaign's short version (``benchmarks/chaos.py``, 5 injections, random and aimed) on the same
  federation: nothing charged twice or not at all, nothing lost, every round resumed.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from capc_common.privacy import BudgetLedger
from capc_services.local.federation import down, restart, status, token, up
from capc_services.local.processes import pid_alive, processes_of, read_state

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from chaos import campaign_options  # the chaos benchmark's federation

pytestmark = pytest.mark.slow
#: The smoke sizes: each kill is a party's start-up and a resumed batch (the benchmark's 100 injections are
#: for benchmarks/chaos.py); enough that the student dies in its window and recovers several times.
KILLS = 8
INJECTIONS = 5
CHAOS = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


class Local:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.endpoints = up(root, campaign_options(), ready_timeout=300)
        self.secret = token(_layout(root), "student")  # only the student's admin API is asked
        self.store = root / "parties" / "student" / "labels.sqlite"
        self.ledger = root / "parties" / "guardian" / "ledger.sqlite"

    def pid(self, party: str) -> int:
        return next(p.pid for p in processes_of(read_state(_layout(self.root))) if p.party == party)

    def kill(self, party: str) -> None:
        pid = self.pid(party)
        os.kill(pid, signal.SIGKILL)
        assert _wait(lambda: not pid_alive(pid), 30)

    def student(self, path: str) -> tuple[int, Any]:
        try:
            response = httpx.get(
                f"{self.endpoints['student']['admin']}{path}",
                headers={"Authorization": f"Bearer {self.secret}"},
                timeout=5,
            )
            return response.status_code, response.json()
        except httpx.HTTPError as exc:
            return 0, str(exc)

    def batches(self) -> dict[str, str]:
        with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=30) as db:
            return dict(db.execute("SELECT batch_id, state FROM batches").fetchall())

    def done(self) -> int:
        return sum(1 for state in self.batches().values() if state == "done")


def _layout(root: Path) -> Any:
    from capc_services.local.layout import Layout

    return Layout(root.resolve())


def _wait(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    running = Local(tmp_path_factory.mktemp("restarts") / "state")
    assert _wait(lambda: running.done() >= 2, 180), running.student("/api/v1/progress")
    yield running
    down(running.root)


def test_a_killed_guardian_is_visible_and_the_student_resumes_once_it_is_back(local: Local) -> None:
    local.kill("guardian")
    # The student notices, says so on /readyz, and `capc local status` calls neither party running.
    assert _wait(lambda: local.student("/readyz")[0] == 503, 60), local.student("/readyz")
    body = local.student("/readyz")[1]
    assert body["checks"]["labelling"]["detail"]["state"] == "reconnecting"
    parties = status(local.root)["parties"]
    assert parties["guardian"]["state"] == "not running" and not parties["guardian"]["running"]
    assert parties["student"]["state"] == "not ready" and not parties["student"]["running"]
    before = local.done()
    # Restarted with the same command, the guardian comes back and the student resumes without any help.
    cli = subprocess.run(
        [sys.executable, "-m", "capc_cli", "local", "restart", "guardian", "--state-dir", str(local.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert _wait(lambda: local.done() > before, 120), local.student("/api/v1/progress")
    assert _wait(lambda: local.student("/readyz")[0] == 200, 30)
    progress = local.student("/api/v1/progress")[1]
    assert progress["reconnects"] >= 1 and progress["state"] == "labelling"
    # The outage is over: its error ("guardian: failed to connect … Connection refused") is not shown as
    # the student's state any more (`capc local status` printed it while the federation labelled).
    assert progress["error"] == "", progress
    now = status(local.root)
    assert now["parties"]["student"]["state"] == "running" and now["progress"]["error"] == ""


@pytest.mark.timeout(1800)
def test_a_student_killed_repeatedly_between_settle_and_store_loses_no_label(local: Local) -> None:
    for kill in range(KILLS):
        pid = local.pid("student")
        if pid_alive(pid):
            local.kill("student")  # only the first time: afterwards it dies in the window by itself
        restart(local.root, "student", env={"CAPC_FAULTS": "student.labelled@1"})
        # It resumes, the guardian settles its next batch, and it dies right before storing the labels.
        assert _wait(lambda: not pid_alive(local.pid("student")), 120), (
            f"kill {kill}: the student never got there"
        )
    restart(local.root, "student")
    done_before = local.done()
    assert _wait(lambda: local.done() > done_before + 1, 120)
    with BudgetLedger.open(local.ledger) as ledger:
        assert ledger.verify().ok
        settled = {e.batch_id for e in ledger.entries() if e.kind == "settle"}
    # The student keeps labelling: its store is read after the ledger, so every batch settled by then has
    # begun there (read before, a batch begun in between looked missing).
    stored = local.batches()
    lost = [b for b, state in stored.items() if state == "lost" and b in settled]
    missing = [b for b in settled if b not in stored]
    assert not lost and not missing, (lost, missing)
    # Every settled batch is stored (or, for the one in flight right now, still open and recoverable).
    assert sum(1 for b in settled if stored[b] != "done") <= 2
    progress = local.student("/api/v1/progress")[1]
    assert progress["recovered_batches"] >= 1  # this student's own recoveries since its last restart
    print(json.dumps({"kills": KILLS, "settled": len(settled), "lost": len(lost)}))


@pytest.mark.timeout(1800)
def test_the_chaos_campaigns_short_version(local: Local) -> None:
    args = [
        "--injections",
        str(INJECTIONS),
        "--seed",
        "1",
        "--format",
        "json",
        "--attach",
        "--state-dir",
        str(local.root),
    ]
    proc = subprocess.run(
        [sys.executable, str(CHAOS), *args],
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["injections"] >= INJECTIONS
    assert result["resumed"] == result["rounds"]
    assert result["max_resume_s"] < 120
    assert result["ledger_verified_every_round"]  # only the campaign saw each round's ledger
    # The verdicts, re-derived here from the real files rather than taken from the campaign's own report
    # (issue 25.8): the ledger and the label store the federation left behind (it is still labelling).
    _check_ledger_against_label_store(local)


def _store(local: Local) -> dict[str, tuple[str, int, int, int]]:
    """batch id → (state, queries, label rows, answered labels) as the student's store holds them."""
    with sqlite3.connect(f"file:{local.store}?mode=ro", uri=True, timeout=30) as db:
        rows = db.execute(
            "SELECT b.batch_id, b.state, b.count, COUNT(l.label), COALESCE(SUM(l.label >= 0), 0) "
            "FROM batches b LEFT JOIN labels l ON l.batch_id = b.batch_id GROUP BY b.batch_id"
        ).fetchall()
    return {b: (state, count, rows_, answered) for b, state, count, rows_, answered in rows}


def _check_ledger_against_label_store(local: Local) -> None:
    """Nothing charged twice, no label the ledger did not charge, no charged label lost, the filter's
    budget never crossed — from the guardian's ledger and the student's label store alone.

    The student keeps labelling meanwhile, so "stored ⇒ charged" reads the store before the ledger (what
    was stored by then was settled by then) and "charged ⇒ stored" reads it after, waiting for the batch in
    flight.
    """
    stored_before = _store(local)
    with BudgetLedger.open(local.ledger) as ledger:  # opening checks its parameters against the chain
        report = ledger.verify()
        entries = ledger.entries()
        budget_units = ledger.budget_units
    assert report.ok, report.problems
    kinds: dict[str, list[str]] = {}
    for entry in entries:
        kinds.setdefault(entry.batch_id, []).append(entry.kind)
    twice = {b: k for b, k in kinds.items() if sorted(k) not in (["reserve"], ["compute", "reserve"],
             ["release", "reserve"], ["reserve", "settle"], ["compute", "reserve", "settle"])}  # fmt: skip
    assert not twice, twice
    settles = {e.batch_id: e for e in entries if e.kind == "settle"}
    # Spent and still-reserved (worst case) units, summed from the rows: within the filter's budget.
    closed = {e.batch_id for e in entries if e.kind in ("settle", "release")}
    charged = sum(e.units for e in settles.values())
    charged += sum(e.units for e in entries if e.kind == "reserve" and e.batch_id not in closed)
    assert 0 < charged <= budget_units
    # Every batch with stored labels was settled, for exactly the labels stored.
    done = {b: v for b, v in stored_before.items() if v[0] == "done"}
    assert len(done) >= 10
    uncharged = {b: v for b, v in done.items() if b not in settles or settles[b].answered != v[3]}
    assert not uncharged and all(v[2] == v[1] for v in done.values()), uncharged
    # Every settled batch ends up with its labels stored (never lost), the one in flight included.
    assert _wait(lambda: all(_store(local).get(b, ("",))[0] == "done" for b in settles), 120), [
        (b, _store(local).get(b)) for b in settles if _store(local).get(b, ("",))[0] != "done"
    ]
