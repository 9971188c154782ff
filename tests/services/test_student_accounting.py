"""The student's privacy section (model card, ``/api/v1/progress``): the published ε is the guarantee — the
guardian's filter limit — with the realised spend beside it as ``epsilon_spent``, and the accountant names
the mechanism that ran (issue 25, item 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capc_common.federation import FederationConfig
from capc_common.privacy.analysis import epsilon_at_order
from capc_services.student.accounting import privacy_of
from capc_services.student.store import LabelStore

BUDGET = {"epsilon": 300.0, "delta": 1e-5, "order": 10}
FOUR_VOTES = [{"name": "hospital-a", "heads": 4}, {"name": "hospital-b", "heads": 4}]


@pytest.mark.parametrize(
    ("mechanism", "charge"),
    [
        ({"threshold": 3, "sigma1": 2.0, "sigma2": 1.5}, "the exact screening supremum per query"),
        ({"name": "gnmax", "sigma": 2.0}, "λ/σ² per answer"),
        (
            {"name": "private-knn", "sigma": 3.0, "neighbours": 4, "sampling_rate": 0.25},
            "Poisson-subsampled discrete Gaussian per answer",
        ),
        (
            {"name": "prom-pate", "threshold": 3, "sigma1": 2.0, "sigma2": 1.5, "steps": 2, "width": 2},
            "the exact screening supremum per query",
        ),
    ],
    ids=lambda v: v.get("name", "confident-gnmax") if isinstance(v, dict) else None,
)
def test_the_accountant_names_the_mechanism_that_ran(
    federation_dict, tmp_path: Path, mechanism: dict, charge: str
) -> None:
    config = FederationConfig.from_dict(
        federation_dict(mechanism=mechanism, budget=BUDGET, teachers=FOUR_VOTES)
    )
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    try:
        accountant = privacy_of(config, store)["accountant"]
    finally:
        store.close()
    name = mechanism.get("name", "confident-gnmax")
    assert accountant.startswith(f"{name}: ") and charge in accountant, accountant
    assert "Rényi filter" in accountant


def test_the_published_epsilon_is_the_filter_limit_and_the_spend_is_beside_it(
    federation_dict, tmp_path: Path
) -> None:
    """GNMax answers every query at λ/σ² each, so the spend of one batch is known independently of the
    federation's cost code: ε at order 10 of 32 · 10/σ²."""
    config = FederationConfig.from_dict(
        federation_dict(mechanism={"name": "gnmax", "sigma": 2.0}, budget=BUDGET, teachers=FOUR_VOTES)
    )
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    try:
        store.begin("q000000000+32", first_index=0, count=32)
        store.complete("q000000000+32", labels=np.arange(32) % 10, parties=("hospital-a", "hospital-b"))
        privacy = privacy_of(config, store)
    finally:
        store.close()
    spent = float(epsilon_at_order(10, 32 * 10 / 2.0**2, delta=1e-5))
    assert privacy["epsilon"] == privacy["epsilon_limit"] == 300.0
    assert privacy["epsilon_spent"] == pytest.approx(spent, rel=1e-12) and 0 < spent < 300.0
    assert "guarantee" in privacy["epsilon_note"] and "odometer" in privacy["epsilon_spent_note"]


def test_the_card_lists_the_guarantee_per_coalition(federation_dict, tmp_path: Path) -> None:
    """The charges are computed at the noise the student cannot see (the guardian's threshold part and
    argmax noise), so the guarantee holds against the student with a teacher party as against an outsider;
    the guardian draws the argmax noise alone, so nothing bounds what it and the published student reveal."""
    config = FederationConfig.from_dict(federation_dict(budget=BUDGET, teachers=FOUR_VOTES))
    store = LabelStore(tmp_path / "labels.sqlite", config_hash=config.config_hash())
    try:
        coalitions = {tuple(c["members"]): c for c in privacy_of(config, store)["coalitions"]}
    finally:
        store.close()
    assert coalitions[("outsider",)]["epsilon"] == coalitions[("student", "any one teacher party")]["epsilon"]
    assert coalitions[("outsider",)]["epsilon"] == BUDGET["epsilon"]
    guardian = coalitions[("guardian", "any one teacher party")]
    assert guardian["epsilon"] is None and "z2" in guardian["note"]
