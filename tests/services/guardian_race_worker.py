"""A guardian process racing another one on the same ledger (run by test_two_guardians.py, not collected).

python guardian_race_worker.py FEDERATION LEDGER CERT NAME BATCHES

Opens the shared ledger, opens and agrees every batch, prints "ready", waits for a line on stdin (the parent
starts both racers at once), then computes each batch against its own evaluator (a thread of this process)
and prints one JSON line: per batch, the answered count the guardian settled or the error it refused with,
and how many labels its evaluator received.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from capc_common.aggregation import draw_student_noise
from capc_common.federation import FederationConfig, mpc_config
from capc_common.mpc import EvaluatorSession, channel_pair, share_votes, sum_shares
from capc_common.privacy import BudgetLedger, SystemNoise
from capc_services.common.metrics import PartyMetrics
from capc_services.guardian.core import Guardian
from capc_services.tls import certificate_info


def main(federation: str, ledger_path: str, cert: str, name: str, batches: int) -> None:
    config = FederationConfig.load(Path(federation))
    metrics = PartyMetrics(
        party="guardian",
        role="guardian",
        config_hash=config.config_hash(),
        certificate=certificate_info(cert),
    )
    guardian = Guardian(
        config=config, ledger=BudgetLedger.open(ledger_path), noise=SystemNoise(), metrics=metrics
    )
    mpc = mpc_config(config)
    count, rng = config.queries.batch_size, np.random.default_rng()
    plans = []
    for b in range(batches):
        batch_id = f"race-{b}"
        guardian.open_batch(
            batch_id=batch_id, count=count, digest=hashlib.sha256(batch_id.encode()).digest(), actor="student"
        )
        shares = {}
        for party in config.teacher_names:
            seed, shares[party] = share_votes(rng.integers(0, 3, (count, config.classes)), width=mpc.width)
            guardian.submit_shares(
                batch_id=batch_id, attempt=1, party=party, seed=seed, shape=(count, config.classes)
            )
        agreement = guardian.agree(
            batch_id=batch_id, attempt=1, parties=config.teacher_names, actor="student"
        )
        plans.append((batch_id, agreement, sum_shares(list(shares.values()), width=mpc.width)))
    print("ready", flush=True)
    sys.stdin.readline()
    results: dict[str, Any] = {}
    for batch_id, agreement, total in plans:
        garbler_end, evaluator_end = channel_pair(timeout=30)
        outcome: dict[str, Any] = {}

        def garble(
            batch_id: str = batch_id,
            agreement: Any = agreement,
            channel: Any = garbler_end,
            outcome: Any = outcome,
        ) -> None:
            try:
                outcome["answered"] = guardian.compute(
                    batch_id=batch_id,
                    attempt=1,
                    agreement=agreement,
                    session=guardian.session(channel),
                    actor=name,
                )
            except Exception as exc:  # reported to the parent
                outcome["error"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=garble)
        thread.start()
        try:
            labels = EvaluatorSession(evaluator_end, mpc).run_batch(
                batch_id,
                share_sum=total,
                z1_student=draw_student_noise(SystemNoise(), batch=count, sigma1=config.mechanism.sigma1),
            )
            outcome["labels"] = int((labels >= 0).sum())
        except Exception:  # the guardian refused: the student got nothing
            outcome["labels"] = None
        thread.join(timeout=60)
        results[batch_id] = outcome
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5], int(sys.argv[5]))
