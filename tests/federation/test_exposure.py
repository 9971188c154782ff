"""What a federation charges a hospital, at any order: the figures a cap record and a site ledger charge."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.federation import (
    FederationConfig,
    batch_costs,
    cap_cover,
    cap_order,
    exposure_of,
    mechanism_of,
)
from capc_common.federation.releases import protocol_for
from capc_common.privacy.analysis import epsilon_at_order

REPO = Path(__file__).resolve().parents[2]
K8S = FederationConfig.load(REPO / "deploy" / "k8s" / "base" / "federation.yaml")


def test_the_shipped_k8s_plan_against_a_cap_of_30() -> None:
    """The figures an outside review measured with preflight: the ε 10 plan's limit admits 21 of its 32
    batches, whose worst case costs ε 91.7 at the federation's order 10, where a cap of 30 stops a hospital
    after 6 of them. A cap record that charges at the order where the plan costs least (2.1) is covered by
    28.21."""
    exposure = exposure_of(K8S)
    delta = K8S.budget.delta
    assert (exposure.stream, len(exposure.plan)) == (32, 21)
    at_federation = cap_cover(exposure, delta=delta, order=K8S.budget.order)
    assert (at_federation.cap, at_federation.admissible_batches) == (91.7, 21)
    assert exposure.admitted(epsilon=30.0, delta=delta, order=10.0) == 6
    best = cap_cover(exposure, delta=delta)
    assert (best.order, best.cap) == (2.1, 28.21) and best.order == cap_order(exposure, delta=delta)
    assert exposure.admitted(epsilon=30.0, delta=delta, order=best.order) == 21
    assert exposure.admitted(epsilon=28.2, delta=delta, order=best.order) == 20
    # Stated at any order from the mechanism itself: 64 queries screened and answered
    per_query, per_answer = mechanism_of(K8S).costs(np.array([2.1]))
    assert exposure.rdp(64, 2.1) == 64 * per_query[0] + 64 * per_answer[0]
    worst = 21 * exposure.rdp(64, 2.1)
    assert best.epsilon == pytest.approx(float(epsilon_at_order(2.1, worst, delta=delta)))


def test_at_the_federation_order_a_charge_is_the_ledger_s_worst_case_to_the_bit() -> None:
    costs = batch_costs(K8S)
    exposure = exposure_of(K8S)
    for count in (16, 48, 64):
        assert exposure.rdp(count, K8S.budget.order) == costs.worst_case(count)


def test_a_release_federation_charges_each_release_alike() -> None:
    config = FederationConfig.from_dict(
        {**K8S.model_dump(mode="json"), "mechanism": {"name": "dppl", "rho": 0.05}}
    )
    with pytest.raises(InputError, match="comes from its release protocol"):
        exposure_of(config)
    protocol = protocol_for(config, dim=4)
    exposure = exposure_of(config, protocol=protocol)
    assert exposure.plan == (1,) * protocol.rounds
    assert exposure.rdp(999, 3.0) == protocol.release_rdp(3.0) == 3.0 * 0.05  # ρ-zCDP: ρλ per release
    assert exposure.planned_rdp(cap_epsilon=100.0, cap_order=10.0, delta=1e-5, order=3.0) == pytest.approx(
        protocol.rounds * 0.15
    )
