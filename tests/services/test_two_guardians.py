"""Two guardian processes on one SQLite ledger race to compute the same batches: one reveal per charge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from capc_common.federation import FederationConfig
from capc_common.privacy import BudgetLedger

WORKER = Path(__file__).with_name("guardian_race_worker.py")
BATCHES = 4


def test_two_guardians_on_one_ledger_never_reveal_a_batch_twice(
    pki: Path, tmp_path: Path, federation_dict
) -> None:
    config = FederationConfig.from_dict(
        federation_dict(
            mechanism={"threshold": 3, "sigma1": 6.0, "sigma2": 4.0},
            budget={"epsilon": 300.0, "delta": 1e-5, "order": 10},
            queries={**federation_dict()["queries"], "batch_size": 16, "bn_batch": 16},
        )
    )
    federation, ledger = tmp_path / "federation.yaml", tmp_path / "ledger.sqlite"
    config.save(federation)
    BudgetLedger.open_or_create(
        ledger,
        epsilon_limit=config.budget.epsilon,
        delta=config.budget.delta,
        order=config.budget.order,
        config=config.model_dump(mode="json"),
    ).close()
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(federation),
                str(ledger),
                str(pki / "guardian.crt"),
                name,
                str(BATCHES),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("guardian-1", "guardian-2")
    ]
    for racer in racers:
        assert racer.stdout is not None and racer.stderr is not None
        line = racer.stdout.readline().strip()
        assert line == "ready", racer.stderr.read()[-3000:]
    for racer in racers:  # start both at once
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    with BudgetLedger.open(ledger) as led:
        assert led.verify().ok, led.verify().problems
        for b in range(BATCHES):
            batch_id = f"race-{b}"
            outcomes = [r[batch_id] for r in results]
            winners = [o for o in outcomes if "answered" in o]
            losers = [o for o in outcomes if "error" in o]
            # Exactly one computation settled and revealed the batch; the other was refused by the ledger
            # before it decoded a pass bit, and its student got nothing.
            assert len(winners) == 1 and len(losers) == 1, outcomes
            assert winners[0]["labels"] == winners[0]["answered"]
            assert losers[0]["labels"] is None
            assert "nothing was decoded" in losers[0]["error"]  # already being computed, or settled
            kinds = [e.kind for e in led.entries(batch_id=batch_id)]
            assert kinds == ["reserve", "compute", "settle"]
            record = led.batch(batch_id)
            assert record.answered == winners[0]["answered"]
        assert led.summary()["batches"] == BATCHES
