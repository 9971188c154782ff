"""What a federation charges a hospital, at any order: the figures a cap record and a site ledger charge."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
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
from capc_common.federation.cover import why_above
from capc_common.federation.exposure import Exposure
from capc_common.federation.refusals import SpendPlan, uncovered_caps
from capc_common.federation.releases import protocol_for
from capc_common.privacy.analysis import epsilon_at_order, rdp_budget_at_order

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


def test_admitted_is_the_fsum_of_every_charge_so_far_against_the_budget() -> None:
    """``admitted`` keeps an exact running sum instead of summing the growing list again per charge: the same
    answer as ``math.fsum`` of every charge so far, on a plan of mixed sizes, with the RDP already spent put
    so that the sum meets the budget right at a charge (where a rounded running sum tips either way)."""
    rng = np.random.default_rng(0)
    plan = tuple(int(c) for c in rng.choice([7, 16, 31, 64], size=300))

    def cost(count: int, orders: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.full_like(orders, count * (0.1 + 1e-9 / 3))  # not dyadic: the sums round

    exposure = Exposure(
        federation="f", kind="batches", stream=len(plan), plan=plan, cost=cost, sampler_tv=0.0
    )
    order, delta, epsilon = 4.0, 1e-5, 2000.0
    budget = rdp_budget_at_order(epsilon=epsilon, delta=delta, order=order)
    charges = [exposure.rdp(count, order) for count in plan]

    def by_fsum(spent: float) -> int:
        return next(
            (k for k in range(len(plan)) if math.fsum([spent, *charges[: k + 1]]) > budget), len(plan)
        )

    stops = set()
    for k in range(1, len(plan)):
        for spent in (budget - math.fsum(charges[:k]), np.nextafter(budget - math.fsum(charges[:k]), 0)):
            got = exposure.admitted(epsilon=epsilon, delta=delta, order=order, spent_rdp=float(spent))
            assert got == by_fsum(float(spent)), (k, spent)
            stops.add(got)
    assert len(stops) > 250, len(stops)  # the plan stopped almost everywhere, not only at its end


def _declaring(caps: tuple[float | None, ...], *, quorum: int) -> FederationConfig:
    data = K8S.model_dump(mode="json")
    data["teachers"] = [{**t, "cap": c} for t, c in zip(data["teachers"], caps, strict=True)]
    data["quorum"] = {**data["quorum"], "min_parties": quorum}
    return FederationConfig.from_dict(data)


def test_declared_caps_that_leave_too_few_parties_for_the_plan_are_refused() -> None:
    """The shipped k8s plan's cover is 28.21 at a new record's order: caps of 25 stop each hospital after 17
    of its 21 batches. The guardian refuses when fewer parties than the quorum can answer the whole plan."""
    refusal = uncovered_caps(SpendPlan(config=_declaring((25.0, 25.0), quorum=2)))
    assert refusal is not None and refusal.check == "caps-short" and not refusal.certain
    assert refusal.reason.startswith(
        "hospital-a, hospital-b declare a cap of ε 25, which covers 17 of the 21 batches the federation's "
        "ε 10 can admit; 0 of its 2 parties can then answer the whole plan, where its quorum needs 2"
    )
    assert "covering this federation takes a cap of ε 28.21 (at the cap record's order 2.1)" in refusal.reason
    assert (
        refusal.fix() == "raise the party's cap (teachers[].cap, and cap.epsilon in its site file) to 28.21"
    )
    assert uncovered_caps(SpendPlan(config=_declaring((25.0, 30.0), quorum=1))) is None  # one covers it
    assert uncovered_caps(SpendPlan(config=_declaring((25.0, None), quorum=1))) is None  # undeclared: counted
    assert uncovered_caps(SpendPlan(config=_declaring((30.0, 28.21), quorum=2))) is None
    assert _declaring((None, None), quorum=2).config_hash() == K8S.config_hash()  # unset: same hash


def test_a_declared_cap_no_rdp_can_meet_covers_nothing() -> None:
    """A cap of ε 0.5 cannot be met at a new record's order 2.1 at all (even zero RDP converts to ε 9.1): it
    covers none of the plan, and the refusal names the cap to declare (it once escaped as 'cannot be met
    at order 2.1 … pick a larger order', naming neither the cap nor a flag)."""
    refusal = uncovered_caps(SpendPlan(config=_declaring((0.5, 30.0), quorum=2)))
    assert refusal is not None and refusal.check == "caps-short"
    assert refusal.reason.startswith("hospital-a declares a cap of ε 0.5, which covers 0 of the 21 batches")
    assert refusal.fix().endswith("to 28.21")


def test_why_a_cap_within_the_federation_s_epsilon_says_what_the_plan_charges() -> None:
    """A selection plan whose stream ends before its limit (4 batches of 64 at ε 10) is covered by ε 9.82;
    the reason names batches, not releases."""
    data = K8S.model_dump(mode="json")
    data["queries"]["total"] = 256
    short = FederationConfig.from_dict(data)
    cover = cap_cover(exposure_of(short), delta=short.budget.delta)
    assert cover.cap == 9.82
    text = why_above(cover, federation_epsilon=10.0)
    assert "release" not in text and "within its limit ε 10: its 4 planned batches" in text
    release = FederationConfig.from_dict({**data, "mechanism": {"name": "dppl", "rho": 0.05}})
    protocol = protocol_for(release, dim=4)
    assert "every release it plans is charged alike" in why_above(
        cap_cover(exposure_of(release, protocol=protocol), delta=1e-5), federation_epsilon=100.0
    )
