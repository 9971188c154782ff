"""The privacy the student's record says was spent: the same data-independent figures the guardian's ledger
charges (screening for every asked query, GNMax for every answered one; aborted batches cost nothing, lost
ones count), so the student can pick batch sizes and write its model card without asking the guardian."""

from __future__ import annotations

import math
from typing import Any

from capc_common.federation import FederationConfig, batch_costs
from capc_services.student.store import LabelStore

ACCOUNTANT = (
    "confident-gnmax, data-independent (exact screening + λ/σ2² per answer), Rényi filter, "
    "improved conversion"
)


def spent_rdp(config: FederationConfig, store: LabelStore) -> float:
    """RDP at the federation's order of every batch the guardian charged (done or lost)."""
    costs = batch_costs(config)
    charged = (b for b in store.batches() if b.state in ("done", "lost"))
    return math.fsum(costs.actual(b.count, b.answered) for b in charged)


def privacy_of(config: FederationConfig, store: LabelStore) -> dict[str, Any]:
    """The model card's privacy section."""
    rdp = spent_rdp(config, store)
    return {
        "epsilon": batch_costs(config).epsilon(rdp) if rdp > 0 else 0.0,
        "delta": config.budget.delta,
        "order": config.budget.order,
        "rdp": rdp,
        "epsilon_limit": config.budget.epsilon,
        "accountant": ACCOUNTANT,
    }
