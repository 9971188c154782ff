"""What a batch costs: the reservation made before computing must cover every outcome, to the last bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.federation import BatchCosts, FederationConfig, batch_costs, sampler_delta, usable_queries
from capc_common.privacy import BudgetLedger
from capc_common.privacy.noise import discrete_gaussian_table

_RDP = st.floats(min_value=1e-9, max_value=50.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(query_rdp=_RDP, answer_rdp=_RDP, count=st.integers(1, 65_536), data=st.data())
def test_no_outcome_costs_more_than_the_worst_case(
    query_rdp: float, answer_rdp: float, count: int, data: st.DataObject
) -> None:
    costs = BatchCosts(order=10.0, delta=1e-5, query_rdp=query_rdp, answer_rdp=answer_rdp, params={})
    answered = data.draw(st.integers(0, count))
    assert costs.actual(count, answered) <= costs.worst_case(count)
    assert costs.actual(count, count) == costs.worst_case(count)


def test_a_batch_whose_queries_all_pass_settles_within_its_reservation(
    tmp_path: Path, federation_dict
) -> None:
    # With 48 queries, 48·(q + a) rounded below 48·q + 48·a here: the ledger refused to settle an
    # all-answered batch, which was then released — nothing charged, and the failure itself told the
    # student that every query had passed.
    config = FederationConfig.from_dict(
        federation_dict(
            mechanism={"threshold": 2, "sigma1": 2.5, "sigma2": 1.3},
            budget={"epsilon": 3000.0, "delta": 1e-5, "order": 8},
        )
    )
    costs = batch_costs(config)
    ledger = BudgetLedger.create(
        tmp_path / "ledger.sqlite", epsilon_limit=3000.0, delta=1e-5, order=8, config={"test": 1}
    )
    for count in (48, 80, 96, 112):
        ledger.reserve(
            f"b{count}",
            queries=count,
            parties=["hospital-a"],
            mechanism="confident-gnmax",
            params=costs.params,
            worst_case_rdp=costs.worst_case(count),
            actor="guardian",
        )
        ledger.settle(f"b{count}", answered=count, actual_rdp=costs.actual(count, count), actor="guardian")
    assert ledger.verify().ok
    ledger.close()


def test_a_federation_adds_its_samplers_distance_over_every_draw(federation_dict) -> None:
    config = FederationConfig.from_dict(
        federation_dict(mechanism={"threshold": 90, "sigma1": 72, "sigma2": 30}, classes=10)
    )
    eta = max(discrete_gaussian_table(sigma=s).distance_bound for s in (72.0, 30.0))
    draws = usable_queries(config) * (config.classes + 2)  # z1_g, z1_s and c values of z2 per query
    want = (1 + math.exp(config.budget.epsilon)) * draws * eta
    assert sampler_delta(config) == pytest.approx(want, rel=1e-12)
    assert 0 < sampler_delta(config) < 1e-15 * config.budget.delta  # 1.4e-24 here
