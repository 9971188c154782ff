"""The guardian's admin API: the budget and its history, the ledger, the parties it has seen, the student.

Everything the dashboard (``/dashboard``) and ``capc budget watch`` show comes from these routes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from capc_common.federation import batch_costs
from capc_common.privacy.ledger import MAX_SEQ
from capc_services.common.admin import api_router
from capc_services.guardian.core import Guardian
from capc_services.guardian.releases import ReleaseGuardian
from capc_services.guardian.student_view import StudentView

#: The ledger rows that finish a batch: one per batch (the per-batch chart draws one bar for each).
FINISHING_KINDS = ("settle", "release")


def router(guardian: Guardian | ReleaseGuardian, *, student: StudentView | None = None) -> APIRouter:
    """``/api/v1/budget[/history]``, ``/api/v1/ledger[/verify]``, ``/api/v1/parties`` and
    ``/api/v1/student`` over one guardian (of query batches, or of releases)."""
    api = api_router()
    student = student or StudentView(None)

    @api.get("/budget", tags=["guardian"])
    def budget() -> dict[str, Any]:
        """Privacy budget: ε spent and limit, δ, the Rényi order, queries asked and answered."""
        return guardian.budget()

    @api.get("/budget/history", tags=["guardian"])
    def history(
        points: Annotated[int, Query(ge=1, le=2000)] = 300, batches: Annotated[int, Query(ge=1, le=500)] = 60
    ) -> dict[str, Any]:
        """The budget figures after each ledger entry (at most ``points``, evenly spaced, always the last),
        and the latest finished batches, one row each: queries and answered (settled), or released (nothing
        revealed). A batch's other rows (its reservation, the start of its computation) finish nothing."""
        closed = guardian.ledger.entries(kinds=FINISHING_KINDS, newest=True, limit=batches)
        return {
            "points": guardian.ledger.history(points=points),
            "batches": [
                {
                    "batch_id": e.batch_id,
                    "time": e.time,
                    "kind": e.kind,
                    "queries": e.queries,
                    "answered": e.answered,
                }
                for e in reversed(closed)
            ],
        }

    @api.get("/ledger", tags=["guardian"])
    def ledger(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    ) -> dict[str, Any]:
        """Ledger entries (reserve, settle, release) with sequence number > ``offset``, oldest first."""
        page = guardian.ledger.entries(after=offset, limit=limit)
        total = guardian.ledger.summary()["entries"]
        return {"total": total, "offset": offset, "entries": [e.to_dict() for e in page]}

    @api.get("/ledger/verify", tags=["guardian"])
    def verify() -> dict[str, Any]:
        """Recompute the hash chain and every total from the entries (what ``capc budget verify`` does)."""
        return guardian.ledger.verify().to_dict()

    @api.get("/parties", tags=["guardian"])
    def parties() -> dict[str, Any]:
        """Parties of the federation, their roles, when the guardian last heard from them and, for each
        teacher party, the worst-case ε its own cap charged for the share sets this guardian received."""

        def seen_by_guardian(seen: Any) -> dict[str, Any]:
            row = {"role": seen.role, "last_seen": seen.last_seen, "batches": seen.batches}
            if seen.role == "teacher":
                row |= {"queries": seen.queries, "epsilon_worst_case": 0.0}
                if seen.queries:  # only the selection family counts queries (and has batch costs)
                    costs = batch_costs(guardian.config)
                    row["epsilon_worst_case"] = costs.epsilon(costs.worst_case(seen.queries))
            return row

        return {
            "federation": guardian.config.name,
            "config_hash": guardian.config.config_hash(),
            "parties": {name: seen_by_guardian(seen) for name, seen in guardian.parties.items()},
        }

    @api.get("/student", tags=["guardian"])
    def student_status() -> dict[str, Any]:
        """The student's progress and published model card, relayed from its admin API when reachable."""
        return student.read()

    return api
