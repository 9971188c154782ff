"""The guardian's admin API: the budget, the ledger and the parties it has seen."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from capc_common.privacy.ledger import MAX_SEQ
from capc_services.common.admin import api_router
from capc_services.guardian.core import Guardian


def router(guardian: Guardian) -> APIRouter:
    """``/api/v1/budget``, ``/api/v1/ledger`` and ``/api/v1/parties`` over one :class:`Guardian`."""
    api = api_router()

    @api.get("/budget", tags=["guardian"])
    def budget() -> dict[str, Any]:
        """Privacy budget: ε spent and limit, δ, the Rényi order, queries asked and answered."""
        return guardian.budget()

    @api.get("/ledger", tags=["guardian"])
    def ledger(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    ) -> dict[str, Any]:
        """Ledger entries (reserve, settle, release) with sequence number > ``offset``, oldest first."""
        page = guardian.ledger.entries(after=offset, limit=limit)
        total = guardian.ledger.summary()["entries"]
        return {"total": total, "offset": offset, "entries": [e.to_dict() for e in page]}

    @api.get("/parties", tags=["guardian"])
    def parties() -> dict[str, Any]:
        """Parties of the federation, their roles and when the guardian last heard from them."""
        return {
            "federation": guardian.config.name,
            "config_hash": guardian.config.config_hash(),
            "parties": {
                name: {"role": seen.role, "last_seen": seen.last_seen, "batches": seen.batches}
                for name, seen in guardian.parties.items()
            },
        }

    return api
