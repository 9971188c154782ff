"""Membership changes on the guardian: ``POST /api/v1/membership`` records one on the ledger, authorised by
the admin token, and the guardian then stops so that it starts again under the new ``federation.yaml``.

The guardian checks the proposed config against the one it runs with the federation's own rule
(:func:`~capc_common.federation.membership_change`: teacher parties added or retired, the quorum set,
nothing else) and that the new federation could run a batch, *before* the ledger records anything; the
ledger then releases the batches reserved under the old membership that revealed nothing and appends the
membership entry (old hash → new hash, parties, the new config, an HMAC under the admin token) in one
transaction (:meth:`~capc_common.privacy.BudgetLedger.change_membership`). The budget spent so far carries
over: the entry costs nothing and changes neither the filter's limit nor its order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Body, HTTPException, Request, status

from capc_common.errors import InputError, IntegrityError
from capc_common.federation import FederationConfig, check_batch_fits, membership_change
from capc_common.privacy import BudgetLedger
from capc_services.common.admin import api_router, problem_response

_log = logging.getLogger(__name__)

NEXT_STEPS = (
    "the guardian stops now: start it again with the new federation.yaml (a supervisor such as Kubernetes "
    "or compose's restart policy does, once the new file is in place); then restart the student and every "
    "teacher party with the new federation.yaml; an added party starts its teacher, a retired one stops it"
)


def record_change(
    *,
    config: FederationConfig,
    ledger: BudgetLedger,
    proposed: Mapping[str, Any],
    token: str,
    serials: Mapping[str, set[str]] | None = None,
) -> dict[str, Any]:
    """Check ``proposed`` against ``config`` and record the change on ``ledger``.

    ``serials`` are the certificate serials each party's calls presented to this guardian: every one of a
    retired party's must be revoked by ``proposed`` (the rule itself, :func:`membership_change`, requires at
    least one revocation per retired party; this guardian knows which certificates the party really used).

    Returns:
        What was recorded: the entry's sequence number and hash, the old and new config hashes, the parties
        added and retired, the batches released, and the next steps.

    Raises:
        InputError: ``proposed`` is not a valid federation config, changes more than the membership, or
            could not run a batch.
        IntegrityError: the ledger is no longer on ``config`` (changed already) or failed verification.
    """
    new = FederationConfig.from_dict(dict(proposed), source="the proposed federation config")
    change = membership_change(config, new)
    check_batch_fits(new)
    for name in change.retired:
        used = sorted((serials or {}).get(name, set()) - new.revoked_serials)
        if used:
            raise InputError(
                f"{name} is retired, but the certificate serial(s) {used} it called this guardian with are "
                f"not revoked in the new federation.yaml: add each under revoked: (party {name}), post again"
            )
    released = ledger.summary()["released_batches"]
    entry = ledger.change_membership(
        previous=BudgetLedger.hash_config(config.parameters()),
        config=new.parameters(),
        added=change.added,
        retired=change.retired,
        key=token,
        actor="admin",
    )
    result = {
        "entry": entry.seq,
        "head": entry.hash,
        "previous_config_hash": entry.params["from"],
        "config_hash": entry.params["to"],
        "added": list(change.added),
        "retired": list(change.retired),
        "released_batches": ledger.summary()["released_batches"] - released,
        "next": NEXT_STEPS,
    }
    _log.warning("membership changed", extra={k: v for k, v in result.items() if k != "next"})
    return result


def superseded_hashes(ledger: BudgetLedger) -> dict[str, str]:
    """Every config hash a membership entry replaced, with the entry that did (for the gRPC interceptor)."""
    notes: dict[str, str] = {}
    for entry in ledger.membership_changes():
        old = str(entry.params["from"])
        why = ledger.superseded(old)
        if why is not None:
            notes.setdefault(old, why)
    return notes


def membership_router(
    *,
    config: FederationConfig,
    ledger: BudgetLedger,
    on_change: Callable[[], None],
    serials: Mapping[str, set[str]] | None = None,
) -> APIRouter:
    """``POST /api/v1/membership`` (admin token) over the guardian's config and ledger; ``on_change`` runs
    once the reply is sent (the guardian stops); ``serials``: the certificates each party called with."""
    api = api_router()

    @api.post(
        "/membership",
        tags=["guardian"],
        responses={
            409: problem_response(
                "Not a membership change of the federation in force; the detail says why (an invalid config, "
                "a changed privacy parameter, a file made from another config, a ledger that moved on)."
            ),
        },
    )
    def membership(
        request: Request,
        tasks: BackgroundTasks,
        proposed: Annotated[dict[str, Any], Body(description="The new federation.yaml, as a JSON object.")],
    ) -> dict[str, Any]:
        """Add or retire teacher parties, continuing the same ledger: records an admin-authorised,
        hash-chained membership entry (the budget spent carries over; the privacy parameters cannot change
        here), then the guardian stops to start again under the new federation.yaml."""
        try:
            result = record_change(
                config=config,
                ledger=ledger,
                proposed=proposed,
                token=request.app.state.admin_token,
                serials=serials,
            )
        except (InputError, IntegrityError) as exc:  # any object is well-formed: a refusal is a conflict
            raise HTTPException(status_code=status.HTTP_409_CONFLICT, detail=str(exc)) from None
        tasks.add_task(on_change)
        return result

    return api
