"""A local consortium grows from three hospitals to four and back with `capc local` alone, and resumes, as
real processes.

Three hospitals label a batch; `capc local add-party hospital-4` does the whole documented flow while they run
(the new federation.yaml, hospital-4's certificate, site file, data, cap record and heads, the
guardian's admin-authorised membership entry, the new file in place, every party restarted), and every
batch after it has hospital-4's votes (quorum 4 of 4). With the federation down, `capc local retire-party
hospital-4` records the second change (the guardian starts alone for it) and revokes hospital-4's
certificate; `capc local up` resumes the same ledger, label store and cap records under the three-party file
and labels on, and the ledger verifies, both membership entries authorised by the admin token.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from federation_harness import federation_options

from capc_common.federation import FederationConfig
from capc_common.privacy import BudgetLedger
from capc_services.local.federation import ensure_provisioned, status, up
from capc_services.local.layout import Layout
from capc_services.local.processes import processes_of, read_state, token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NEW = "hospital-4"
# Neither the budget nor the stream ends the run (about 85 RDP a batch of 64; 64 batches planned): the student
# labels while `capc local up` waits for every party, and is frozen after one batch of each membership.
EPSILON = 5000.0


def _settled_since_the_change(layout: Layout) -> int:
    """Batches the guardian's ledger settled that were computed after its last membership entry, read from
    the file (an HTTPS probe is too slow on a busy machine: the student settles several batches meanwhile)."""
    ledger = layout.party_dir("guardian") / "ledger.sqlite"
    with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=30)) as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM entries WHERE kind = 'settle' AND batch_id IN "
            "(SELECT batch_id FROM entries "
            "WHERE kind = 'compute' AND seq > (SELECT COALESCE(MAX(seq), 0) FROM entries "
            "WHERE kind = 'membership'))"
        ).fetchone()
    return int(count)


def _freeze_after_a_batch(layout: Layout, *, timeout: float = 240) -> None:
    """Wait until the guardian settled a batch computed under the membership in force, then freeze the
    student (SIGSTOP) so that it does not label on before the next change: `capc local` stops it with SIGTERM
    and SIGCONT."""
    deadline = time.monotonic() + timeout
    while not _settled_since_the_change(layout):
        assert time.monotonic() < deadline, "no batch settled on the guardian"
        time.sleep(0.01)
    (student,) = [p.pid for p in processes_of(read_state(layout)) if p.role == "student"]
    os.kill(student, signal.SIGSTOP)


def test_a_consortium_grows_to_four_hospitals_and_back_with_capc_local_alone(tmp_path: Path, capc) -> None:
    root = tmp_path / "state"
    options = federation_options(train_limit=400, epsilon=EPSILON, queries=4096)
    layout, three = ensure_provisioned(root, options)
    local = ["--state-dir", str(root)]
    up(root, options, ready_timeout=240)
    try:
        _freeze_after_a_batch(layout)
        added = capc("local", "add-party", NEW, "--min-parties", "4", *local, "--format", "json", timeout=600)
        assert added.returncode == 0, added.stderr
        grown = json.loads(added.stdout)
        four = FederationConfig.load(layout.federation)
        assert grown["added"] == [NEW] and grown["running"] and grown["config_hash"] == four.config_hash()
        assert four.teacher_names == (*three.teacher_names, NEW) and four.quorum.min_parties == 4
        parties = status(root)["parties"]
        assert parties[NEW]["state"] == "running" and all(p["running"] for p in parties.values()), parties
        _freeze_after_a_batch(layout)  # a batch with hospital-4's votes
    finally:
        down = capc("local", "down", *local)
    assert down.returncode == 0 and f"{NEW} stopped" in down.stdout, down.stdout + down.stderr

    # Retired while the federation is down: the guardian starts alone to record it; nothing else starts.
    retired = capc("local", "retire-party", NEW, "--min-parties", "3", *local, timeout=600)
    assert retired.returncode == 0, retired.stderr
    assert "retired hospital-4" in retired.stdout and "the federation is down" in retired.stdout
    back = FederationConfig.load(layout.federation)
    assert back.teacher_names == three.teacher_names and back.revoked[-1].party == NEW
    assert not any(p["running"] for p in status(root)["parties"].values())
    assert NEW not in status(root)["parties"]
    # `capc local up` resumes: the same ledger, label store and cap records, under the three-party file.
    try:
        resumed = capc("local", "up", *local, "--format", "json", timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["config_hash"] == back.config_hash()
        _freeze_after_a_batch(layout)
    finally:
        assert capc("local", "down", *local).returncode == 0

    with BudgetLedger.open(layout.party_dir("guardian") / "ledger.sqlite") as ledger:
        report = ledger.verify()
        assert report.ok, report.problems
        grow, shrink = ledger.membership_changes()
        assert (grow.params["from"], grow.params["to"], grow.params["added"]) == (
            three.config_hash(), four.config_hash(), [NEW]
        )  # fmt: skip
        assert (shrink.params["from"], shrink.params["to"], shrink.params["retired"]) == (
            four.config_hash(), back.config_hash(), [NEW]
        )  # fmt: skip
        assert ledger.check_authorisations(token(layout)) == {}  # the guardian's admin token
        entries = list(ledger.entries())
    settled = [e for e in entries if e.kind == "settle"]
    # A batch whose votes were counted before a change may settle after it, with the earlier parties' votes:
    # what must have hospital-4's are the batches computed while it was a party.
    computed_with_four = {
        e.batch_id for e in entries if e.kind == "compute" and grow.seq < e.seq < shrink.seq
    }
    assert any(e.seq < grow.seq for e in settled) and computed_with_four
    assert any(e.seq > shrink.seq for e in settled)  # the resumed federation labelled on
    assert report.totals["spent_rdp"] == pytest.approx(sum(e.rdp for e in settled), rel=1e-12)
    db = sqlite3.connect(layout.party_dir("student") / "labels.sqlite")
    try:
        done = dict(db.execute("SELECT batch_id, parties FROM batches WHERE state = 'done'").fetchall())
    finally:
        db.close()
    assert all(NEW in done[batch] for batch in computed_with_four if batch in done)
    # Each old hospital's cap record holds its charges under every config; hospital-4's only the new one,
    # and it stays (its own account of what it released).
    lines = (layout.party_dir("hospital-1") / "cap.jsonl").read_text()
    assert three.config_hash() in lines and four.config_hash() in lines
    assert three.config_hash() not in (layout.party_dir(NEW) / "cap.jsonl").read_text()
    print(
        json.dumps(
            {
                "membership_entries": [grow.seq, shrink.seq],
                "batches_before": sum(e.seq < grow.seq for e in settled),
                "batches_with_four": len(computed_with_four),
                "batches_after": sum(e.seq > shrink.seq for e in settled),
                "epsilon_final": report.totals["epsilon_settled"],
            }
        )
    )
