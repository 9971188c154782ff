"""The privacy the student publishes: the guarantee (the guardian's filter limit, fixed before any data was
touched) and, beside it, the realised spend its record says was charged — the same data-independent figures
the guardian's ledger charges (the mechanism's cost per asked and per answered query; aborted batches cost
nothing, lost ones count) — so the student can pick batch sizes and write its model card without asking the
guardian. What each figure means: :mod:`capc_common.privacy.claims`."""

from __future__ import annotations

import math
from typing import Any

from capc_common.data.partition import NEIGHBOURING
from capc_common.federation import FederationConfig, batch_costs, mechanism_of, sampler_delta
from capc_common.privacy.claims import (
    FILTER_GUARANTEE,
    FILTER_ODOMETER,
    GUARDIAN_AND_TEACHER,
    OUTSIDER,
    STUDENT_AND_TEACHER,
    Coalition,
    accountant,
)
from capc_services.student.store import LabelStore


def spent_rdp(config: FederationConfig, store: LabelStore) -> float:
    """RDP at the federation's order of every batch the guardian charged (done or lost)."""
    costs = batch_costs(config)
    charged = (b for b in store.batches() if b.state in ("done", "lost"))
    return math.fsum(costs.actual(b.count, b.answered) for b in charged)


def epsilon_figures(config: FederationConfig, store: LabelStore) -> dict[str, float]:
    """``epsilon_settled`` (charged batches), ``epsilon_reserved`` (what the worst case of the batches still
    open adds) and ``epsilon_spent`` (their sum), as the guardian's ``/api/v1/budget`` reports them."""
    costs = batch_costs(config)
    settled = spent_rdp(config, store)
    reserved = math.fsum(costs.worst_case(b.count) for b in store.batches(state="open"))
    epsilon_settled = costs.epsilon(settled) if settled > 0 else 0.0
    epsilon_spent = costs.epsilon(settled + reserved) if settled + reserved > 0 else 0.0
    return {
        "epsilon_spent": epsilon_spent,
        "epsilon_settled": epsilon_settled,
        "epsilon_reserved": epsilon_spent - epsilon_settled,
    }


def guarantee(config: FederationConfig) -> dict[str, Any]:
    """The published ε: the guardian's filter limit (whatever the stream turned out to cost), and what it and
    ``epsilon_spent`` mean — for the model card, ``/api/v1/progress`` and the "student published" log."""
    return {
        "epsilon": config.budget.epsilon,
        "epsilon_note": FILTER_GUARANTEE,
        "epsilon_spent_note": FILTER_ODOMETER,
    }


def coalitions(config: FederationConfig) -> list[dict[str, Any]]:
    """ε per coalition of a selection federation (DESIGN §2). The filter's charges are computed at the noise
    each party sees through: a pass bit through the *other* party's part of the threshold noise (every known
    shift of the threshold charged), a label through the argmax noise ``z2``. So the guarantee holds against
    an outsider and against the student with a teacher party (it knows ``z1_s``, not ``z1_g`` nor ``z2``).
    The guardian draws ``z2`` alone: knowing it, the published student — a function of the labels
    ``argmax(V + z2)`` — is a function of the votes it cannot see, and nothing bounds what it reveals of
    them; its pass bits alone still carry the student's ``z1_s``."""
    limit = config.budget.epsilon
    return [
        Coalition(OUTSIDER, limit, "every charge, at the noise of both parties").to_dict(),
        Coalition(
            STUDENT_AND_TEACHER,
            limit,
            "the guardian's part of the threshold noise (z1_g) and its argmax noise (z2): the charges' noise",
        ).to_dict(),
        Coalition(
            GUARDIAN_AND_TEACHER,
            None,
            "unbounded: the guardian draws the argmax noise z2 alone, and the published student is a "
            "function of the labels argmax(V + z2); only its pass bits keep the student's threshold "
            "noise z1_s",
        ).to_dict(),
    ]


def privacy_of(config: FederationConfig, store: LabelStore) -> dict[str, Any]:
    """The model card's privacy section: the guarantee ``epsilon``, and the realised ``epsilon_spent`` (a
    crash may over-count it, never under-count) split into settled and reserved."""
    return {
        **guarantee(config),
        **epsilon_figures(config, store),
        "delta": config.budget.delta,
        # The table samplers are 2^-90-close to the exact noise, not equal: the guarantee holds at δ + this.
        "delta_sampler": sampler_delta(config),
        "delta_total": config.budget.delta + sampler_delta(config),
        "order": config.budget.order,
        "rdp": spent_rdp(config, store),
        "epsilon_limit": config.budget.epsilon,
        "accountant": accountant(mechanism_of(config)),
        # Teacher parties select their examples (data.shards, data.fraction) and assign them to heads by
        # keyed content hashes (capc teacher train), never by position or count: add/remove one example.
        "neighbouring": NEIGHBOURING["hash"],
        "coalitions": coalitions(config),
    }


def noise_label(config: FederationConfig) -> str:
    """How the model card and ``/api/v1/progress`` name the student's noise source, so a model labelled
    with the test-only seeded source can never pass for a private one."""
    if not config.insecure_noise:
        return "SystemNoise"
    return "SeededNoise (INSECURE: labels are reproducible and not private)"
