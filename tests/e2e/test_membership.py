"""A fourth hospital joins a running local federation, which then finishes its budget, as real processes.

Three hospitals label a batch or two; the coordinator writes the new federation.yaml (`capc federation
add-party`), the guardian's admin records the change on the running guardian (``POST /api/v1/membership``:
one admin-authorised, hash-chained ledger entry, after which the guardian stops), hospital-4 is set up (its
certificate, site file, cap record, heads) and every party restarts under the new file. The same ledger, label
store and cap records carry on; every batch after the change has hospital-4's votes (quorum 4 of 4); the
stream ends when the budget does, and the ledger verifies, its membership entry authorised by the admin token.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from federation_harness import Running, federation_options

from capc_common.federation import FederationConfig
from capc_common.privacy import BudgetLedger
from capc_services.local.federation import ensure_provisioned
from capc_services.local.layout import Layout
from capc_services.local.processes import processes_of, read_state, token, write_state
from capc_services.local.provision import Endpoints, free_port
from capc_services.teacher.cap import LocalCap
from capc_services.tls import issue_certificate

pytestmark = pytest.mark.slow

NEW = "hospital-4"
EPSILON = 500.0
SHARDS = 4  # every simulated hospital's data is a disjoint quarter of the dataset, hospital-4's included


def _set_shards(layout: Layout, party: str, *, shard: int) -> None:
    site = yaml.safe_load(layout.site(party).read_text())
    site["data"].update(shard=shard, shards=SHARDS)
    layout.site(party).write_text(yaml.safe_dump(site, sort_keys=False))


def _provision_new_hospital(layout: Layout, config: FederationConfig) -> None:
    """What hospital-4 sets up on its own machine, here in the local state directory: a certificate from
    the local CA, a site file like its peers', and its cap record under the new federation.yaml."""
    issue_certificate(layout.certs, NEW, out_dir=layout.certs)
    site = yaml.safe_load(layout.site("hospital-3").read_text())
    port = free_port()
    site.update(
        party=NEW,
        tls={**site["tls"], "cert": f"../certs/{NEW}.crt", "key": f"../certs/{NEW}.key"},
        admin={**site["admin"], "bind": f"127.0.0.1:{port}"},
        heads=f"../parties/{NEW}/heads.safetensors",
        cap={**site["cap"], "record": f"../parties/{NEW}/cap.jsonl"},
    )
    layout.site(NEW).write_text(yaml.safe_dump(site, sort_keys=False))
    _set_shards(layout, NEW, shard=SHARDS - 1)
    LocalCap.init(layout.party_dir(NEW) / "cap.jsonl", config=config)
    endpoints = Endpoints.from_dict(read_state(layout)["endpoints"])
    endpoints.admin[NEW] = port
    write_state(layout, endpoints=endpoints, processes=[])


def _until(done: Callable[[], bool], *, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "no batch settled on the guardian"
        time.sleep(0.02)


def test_a_fourth_hospital_joins_and_the_federation_finishes_its_budget(tmp_path: Path, capc) -> None:
    root, new_file = tmp_path / "state", tmp_path / "federation-4.yaml"
    # ε 500 buys about five batches of 64: a few before the change, the rest with hospital-4. The stream plans
    # 16 so that the budget, not the stream, ends the run (with 8 planned, one run in CI asked them all within
    # the budget and ended "all planned queries asked": a batch's charge depends on how many queries pass).
    options = federation_options(train_limit=400, epsilon=EPSILON, queries=1024)
    layout, old = ensure_provisioned(root, options)
    for index, name in enumerate(old.teacher_names):
        _set_shards(layout, name, shard=index)
    # The coordinator writes the new file (quorum: all four) while the three hospitals run.
    added = capc(
        "federation", "add-party", "--federation", str(layout.federation), "--party", NEW, "--heads", "3",
        "--min-parties", "4", "--out", str(new_file),
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "capc guardian membership" in added.stdout
    new = FederationConfig.load(new_file)
    running = Running(root, options, teachers=None)
    (student,) = [p.pid for p in processes_of(read_state(layout)) if p.role == "student"]
    try:
        # The student drives the stream and settles a batch on the guardian well before its own progress
        # counts it (four more had settled by then, the budget all but spent). The guardian's ledger is
        # watched, and the student frozen as soon as one batch has settled: it cannot spend the rest before
        # the change arrives. Batches it had reserved and not revealed are released by the change.
        _until(lambda: running.budget()["spent_rdp"] > 0)
        os.kill(student, signal.SIGSTOP)
        left = running.budget()
        worst_batch = left["reserved_rdp"] / max(left["open_batches"], 1)
        assert left["budget_rdp"] - left["spent_rdp"] > worst_batch, f"no batch left for hospital-4: {left}"
        # What `capc guardian membership` sends (tests/services/test_guardian_membership.py runs the command).
        reply = httpx.post(
            f"{running.endpoints['guardian']['admin']}/api/v1/membership",
            json=new.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {running.token}"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["added"] == [NEW]
    finally:
        os.kill(student, signal.SIGCONT)
        running.close()  # the guardian has stopped by itself; the others stop to load the new file
    with BudgetLedger.open(layout.party_dir("guardian") / "ledger.sqlite") as ledger:
        before = ledger.summary()
    layout.federation.write_text(new_file.read_text())
    _provision_new_hospital(layout, new)
    running = Running(root, options, teachers=None)  # resumes the same state directory, hospital-4 included
    try:
        progress = running.wait(lambda p: p["state"] == "published", timeout=600)
        assert "privacy budget exhausted" in progress["stopped_reason"]
        budget = running.budget()
        assert budget["config_hash"] == new.config_hash()
        assert before["epsilon_settled"] < budget["epsilon_settled"] <= EPSILON
    finally:
        running.close()

    with BudgetLedger.open(layout.party_dir("guardian") / "ledger.sqlite") as ledger:
        report = ledger.verify()
        assert report.ok, report.problems
        (change,) = ledger.membership_changes()
        assert change.params["from"] == old.config_hash() and change.params["to"] == new.config_hash()
        assert change.params["added"] == [NEW]
        assert ledger.check_authorisations(token(layout)) == {}  # the guardian's admin token
        settled = [e for e in ledger.entries() if e.kind == "settle"]
        # A batch whose votes were counted (its "compute" entry) before the change may settle after it,
        # with the old parties' votes: what must have hospital-4's are the batches computed after it.
        computed_after = {e.batch_id for e in ledger.entries() if e.kind == "compute" and e.seq > change.seq}
    # Budget spent before the change carried over, and batches settled on both sides of it.
    assert any(e.seq < change.seq for e in settled) and any(e.seq > change.seq for e in settled)
    assert report.totals["spent_rdp"] == pytest.approx(sum(e.rdp for e in settled), rel=1e-12)
    # The student's store carried on; every batch labelled after the change has hospital-4's votes.
    db = sqlite3.connect(layout.party_dir("student") / "labels.sqlite")
    try:
        done = db.execute("SELECT batch_id, parties FROM batches WHERE state = 'done'").fetchall()
        (continued,) = db.execute("SELECT value FROM meta WHERE key LIKE 'continued:%'").fetchall()
    finally:
        db.close()
    assert continued == (old.config_hash(),)
    after = {e.batch_id for e in settled if e.seq > change.seq}
    assert computed_after and computed_after <= after
    assert all(NEW in parties for batch, parties in done if batch in computed_after)
    # Each old hospital's cap record holds its charges under both configs; hospital-4's only the new one.
    lines = (layout.party_dir("hospital-1") / "cap.jsonl").read_text()
    assert old.config_hash() in lines and new.config_hash() in lines
    assert old.config_hash() not in (layout.party_dir(NEW) / "cap.jsonl").read_text()
    print(
        json.dumps(
            {
                "membership_entry": change.seq,
                "batches_before": sum(e.seq < change.seq for e in settled),
                "batches_after": len(after),
                "epsilon_at_change": before["epsilon_settled"],
                "epsilon_final": report.totals["epsilon_settled"],
            }
        )
    )
