"""Every release mechanism's noise split: the sum of the guardian's and the student's parts is at least as
private as the plan the ledger charges (Kairouz, Liu & Steinke 2021), and each coalition that knows one part
gets the ε of the other part alone — checked against dp-accounting's Gaussian accountant."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp import rdp_privacy_accountant as dpa

from capc_common.federation import FederationConfig
from capc_common.federation.releases import planned_figures, protocol_for
from capc_common.mechanisms import DPPrototypes, PublicPrototypeVotes, ReleaseMechanism, SecureDPSGD
from capc_common.privacy.analysis import DEFAULT_ORDERS, epsilon_from_rdp, zcdp_distributed
from capc_common.privacy.claims import GUARDIAN_AND_TEACHER, OUTSIDER, STUDENT_AND_TEACHER

INTEGER_ORDERS = np.array([2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0])
POOL = np.random.default_rng(4).normal(size=(300, 8))
MECHANISMS = {
    "dpsgd-full-batch": SecureDPSGD(classes=10, dim=64, clip=0.1, noise_multiplier=5.3, sampling_rate=1.0),
    "dpsgd-sampled": SecureDPSGD(classes=10, dim=64, clip=1.0, noise_multiplier=1.2, sampling_rate=0.1),
    "dp-prototypes": DPPrototypes(classes=10, dim=64, rho=0.5),
    "dppl-public": PublicPrototypeVotes(classes=10, candidates=POOL, rho=0.02),
    "dppl-public-tiny-sigma": PublicPrototypeVotes(classes=10, candidates=POOL, rho=2.0),
}


@pytest.mark.parametrize("mechanism", MECHANISMS.values(), ids=MECHANISMS.keys())
def test_the_sum_of_the_parts_is_at_least_as_private_as_the_plan(mechanism: ReleaseMechanism) -> None:
    """Block by block, the parts' sum is within the planned zCDP by the bound for a sum of discrete
    Gaussians — or each part is the whole planned σ (private by post-processing of either alone)."""
    for block in mechanism.blocks():
        plan = block.sensitivity**2 / (2 * block.sigma**2)
        if block.part == block.sigma:
            continue
        assert 2 * block.part**2 >= block.sigma**2
        summed = zcdp_distributed(
            sigma=block.part, parties=2, sensitivity=block.sensitivity, dimension=block.length
        )
        assert summed <= plan


def test_a_tiny_sigma_puts_the_whole_sigma_in_each_part() -> None:
    """ρ = 2 gives σ = 1/2 on each count: half its variance per part would be below the bound's σ ≥ 1/2."""
    mechanism = MECHANISMS["dppl-public-tiny-sigma"]
    np.testing.assert_array_equal(mechanism.part_sigmas(), mechanism.sigmas())
    assert mechanism.coalition_zcdp() == pytest.approx(mechanism.zcdp, rel=1e-12)


@pytest.mark.parametrize("name", ["dpsgd-full-batch", "dpsgd-sampled"])
def test_a_coalition_sees_one_round_through_the_other_part_alone(name: str) -> None:
    """One round against the guardian's or the student's coalition: the (Poisson-subsampled) Gaussian at the
    other part's multiplier. dp-accounting's exact continuous curve is a lower bound for the discrete
    Gaussian's general subsampling bound, equal to it without subsampling and at order 2."""
    m = MECHANISMS[name]
    assert isinstance(m, SecureDPSGD)
    multiplier = m.part_sigmas()[0] / m.sensitivity
    assert multiplier == pytest.approx(m.noise_multiplier / np.sqrt(2), rel=1e-9)
    ours = m.coalition_rdp(INTEGER_ORDERS)
    reference = dpa._compute_rdp_poisson_subsampled_gaussian(m.sampling_rate, multiplier, INTEGER_ORDERS)
    assert np.all(ours >= np.asarray(reference) * (1 - 1e-12))
    assert ours[0] == pytest.approx(reference[0], rel=1e-9)
    if m.sampling_rate == 1.0:
        np.testing.assert_allclose(ours, reference, rtol=1e-9)
    # The coalition learns more than the outsider, the plan (the ledger's charge): twice, without sampling.
    assert np.all(ours > m.release_rdp(INTEGER_ORDERS))


@pytest.mark.parametrize("name", ["dp-prototypes", "dppl-public"])
def test_a_coalition_sees_twice_the_planned_zcdp(name: str) -> None:
    m = MECHANISMS[name]
    assert m.coalition_zcdp() == pytest.approx(2 * m.zcdp, rel=1e-3)  # type: ignore[attr-defined]
    assert m.coalition_zcdp() <= 2 * m.zcdp  # type: ignore[attr-defined]


def test_the_plans_coalitions_match_dp_accounting() -> None:
    """A federation's plan lists ε per coalition: the outsider's is the guarantee (the ledger's), and the
    guardian's and the student's coalitions with a teacher party get ``rounds`` compositions of the one-part
    Gaussian — dp-accounting's ε of the same composition at the same orders."""
    config = secagg_config()
    protocol = protocol_for(config, dim=16)
    figures = planned_figures(protocol, config.budget)
    coalitions = {tuple(c["members"]): c["epsilon"] for c in figures["coalitions"]}
    assert set(coalitions) == {OUTSIDER, GUARDIAN_AND_TEACHER, STUDENT_AND_TEACHER}
    assert coalitions[OUTSIDER] == figures["epsilon"]
    m = protocol.mechanism
    assert isinstance(m, SecureDPSGD)
    accountant = RdpAccountant(orders=DEFAULT_ORDERS.tolist())
    multiplier = float(np.nextafter(m.part_sigmas()[0] / m.sensitivity, 0))
    event = dp_accounting.GaussianDpEvent(noise_multiplier=multiplier)
    accountant.compose(event, protocol.rounds)
    reference = accountant.get_epsilon(config.budget.delta)
    for members in (GUARDIAN_AND_TEACHER, STUDENT_AND_TEACHER):
        assert coalitions[members] == pytest.approx(reference, rel=1e-6)
        assert coalitions[OUTSIDER] < coalitions[members] < np.inf
    ours = epsilon_from_rdp(
        DEFAULT_ORDERS, protocol.rounds * m.coalition_rdp(DEFAULT_ORDERS), delta=config.budget.delta
    )[0]
    assert coalitions[GUARDIAN_AND_TEACHER] == pytest.approx(ours, rel=1e-12)


def secagg_config() -> FederationConfig:
    """A full-batch secure-aggregation DP-SGD federation over the raw coordinates, its plan within ε 8."""
    return FederationConfig.from_dict(
        {
            "name": "coalitions",
            "classes": 10,
            "guardian": "guardian",
            "student": "student",
            "teachers": [{"name": "hospital-a", "heads": 1}, {"name": "hospital-b", "heads": 1}],
            "mechanism": {
                "name": "secagg-dpsgd", "rounds": 20, "noise_multiplier": 8.0, "projection": None,
            },
            "budget": {"epsilon": 8.0, "delta": 1e-5, "order": 8},
            "queries": {
                "generator": "dead_leaves", "seed": 0, "total": 64, "batch_size": 32, "bn_batch": 16,
                "height": 28, "width": 28, "channels": 1,
            },
            "backbone": {"name": "scatter-28x28x1", "sha256": "0" * 64},
            "quorum": {"min_parties": 2, "vote_deadline_s": 5, "share_deadline_s": 5},
        }
    )  # fmt: skip
