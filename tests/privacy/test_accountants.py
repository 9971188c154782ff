"""Accountants (history only, math from analysis), the registry, estimate() and plan()."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.privacy import (
    ConfidentGNMaxAccountant,
    DataDependentPATEAccountant,
    PureDPAccountant,
    SubsampledGaussianAccountant,
    ZCDPAccountant,
    create_accountant,
    estimate,
    plan,
)
from capc_common.privacy.analysis import (
    DEFAULT_ORDERS,
    epsilon_at_order,
    epsilon_from_rdp,
    epsilon_from_zcdp,
    log_pass_probability,
    log_q_gnmax,
    rdp_budget_at_order,
    rdp_budget_curve,
    rdp_gnmax_data_dependent,
    rdp_gnmax_data_independent,
    rdp_screening_exact,
    rdp_subsampled_gaussian,
    rdp_threshold_data_dependent,
)

MECH = {"teachers": 250, "classes": 10, "threshold": 170.0, "sigma1": 100.0, "sigma2": 40.0}
ORDERS = np.array([2.0, 5.0, 10.0, 32.0])


def test_confident_gnmax_accountant_charges_screening_per_query_and_gnmax_per_answer() -> None:
    acc = ConfidentGNMaxAccountant(**MECH)
    acc.step(queries=100, answered=30)
    acc.step(queries=50, answered=50)
    screening = rdp_screening_exact(
        ORDERS, teachers=250, classes=10, threshold=170, sigma1=100, noise="discrete"
    )
    expected = 150 * screening + 80 * rdp_gnmax_data_independent(ORDERS, sigma=40)
    np.testing.assert_allclose(acc.rdp(ORDERS), expected, rtol=1e-14)
    np.testing.assert_allclose(acc.cost(ORDERS, queries=64, answered=64), 64 * (screening + ORDERS / 1600))
    assert acc.get_epsilon(delta=1e-5) == epsilon_from_rdp(DEFAULT_ORDERS, acc.rdp(), delta=1e-5)
    with pytest.raises(InputError, match="cannot exceed"):
        acc.step(queries=1, answered=2)
    assert (acc.queries, acc.answered) == (150, 80)  # the refused step left no trace


def test_partial_quorum_widens_the_screening_range() -> None:
    full = ConfidentGNMaxAccountant(**MECH).query_rdp(ORDERS)
    partial = ConfidentGNMaxAccountant(**MECH, min_teachers=120).query_rdp(ORDERS)
    assert np.all(partial >= full)
    with pytest.raises(InputError, match="min_teachers"):
        ConfidentGNMaxAccountant(**MECH, min_teachers=251)


def test_data_dependent_accountant_sums_the_per_query_bounds() -> None:
    votes = np.array([[240, 5, 5, 0], [100, 90, 40, 20], [250, 0, 0, 0], [60, 60, 60, 70]])
    answered = np.array([True, False, True, True])
    acc = DataDependentPATEAccountant(threshold=170, sigma1=100, sigma2=40)
    acc.step(votes, answered=answered)
    expected = np.zeros_like(ORDERS)
    for row, was_answered in zip(votes, answered, strict=True):
        lp, lf = log_pass_probability(row, threshold=170, sigma1=100)
        expected += rdp_threshold_data_dependent(ORDERS, log_pass=lp, log_fail=lf, sigma1=100)
        if was_answered:
            expected += rdp_gnmax_data_dependent(ORDERS, log_q=float(log_q_gnmax(row, sigma=40)), sigma=40)
    np.testing.assert_allclose(acc.rdp(ORDERS), expected, rtol=1e-12)
    independent = ConfidentGNMaxAccountant(**MECH, noise="continuous")
    independent.step(queries=4, answered=3)
    assert np.all(acc.rdp(ORDERS) <= independent.rdp(ORDERS))
    with pytest.raises(InputError, match="integer counts"):
        acc.step(np.array([[0.5, 2.0, 1.0]]))
    with pytest.raises(InputError, match="answered"):
        acc.step(votes, answered=np.array([True]))


def test_plain_gnmax_data_dependent_accountant() -> None:
    acc = DataDependentPATEAccountant(threshold=None, sigma1=None, sigma2=40, noise="discrete")
    acc.step(np.array([[200, 30, 20, 0], [200, 30, 20, 0]]))
    one = rdp_gnmax_data_dependent(
        ORDERS, log_q=float(log_q_gnmax([200, 30, 20, 0], sigma=40, noise="discrete")), sigma=40
    )
    np.testing.assert_allclose(acc.rdp(ORDERS), 2 * one, rtol=1e-14)
    with pytest.raises(InputError, match="both"):
        DataDependentPATEAccountant(threshold=100, sigma1=None, sigma2=40)


def test_other_accountants_and_the_registry() -> None:
    sub = create_accountant("subsampled-gaussian", sampling_rate=0.01, noise_multiplier=1.1)
    assert isinstance(sub, SubsampledGaussianAccountant)
    sub.step(steps=1000)
    np.testing.assert_allclose(
        sub.rdp(ORDERS), 1000 * rdp_subsampled_gaussian(ORDERS, sampling_rate=0.01, noise_multiplier=1.1)
    )
    pure = create_accountant("pure-dp", bounded_range=True)
    assert isinstance(pure, PureDPAccountant)
    pure.step(epsilon=0.1)
    pure.step(epsilon=0.1)
    assert np.all(pure.rdp(ORDERS) <= 2 * ORDERS * 0.01 / 8 + 1e-15)
    z = create_accountant("zcdp")
    assert isinstance(z, ZCDPAccountant)
    z.step(rho=0.2)
    z.step(rho=0.3)
    np.testing.assert_allclose(z.rdp(ORDERS), 0.5 * ORDERS)
    grid_eps = z.get_epsilon(delta=1e-5)[0]
    assert epsilon_from_zcdp(0.5, delta=1e-5)[0] <= grid_eps <= 1.01 * epsilon_from_zcdp(0.5, delta=1e-5)[0]
    assert z.get_delta(epsilon=grid_eps)[0] == pytest.approx(1e-5, rel=1e-9)
    with pytest.raises(InputError, match="unknown mechanism"):
        create_accountant("laplace-of-doom")
    with pytest.raises(InputError, match="bad parameters"):
        create_accountant("zcdp", rho=1.0)


def test_estimate_breakdown_adds_up() -> None:
    r = estimate(**MECH, queries=1000, answered=300, delta=1e-5)
    total = r["breakdown"]["screening"]["rdp_at_order"] + r["breakdown"]["gnmax"]["rdp_at_order"]
    assert r["epsilon"] == pytest.approx(float(epsilon_at_order(r["order"], total, delta=1e-5)), rel=1e-12)
    assert (
        r["breakdown"]["screening"]["rdp_per_query"]
        <= r["breakdown"]["screening"]["gaussian_bound_rdp_per_query"]
    )
    assert r["epsilon"] <= r["epsilon_classic"]
    assert estimate(**MECH, queries=0, delta=1e-5)["epsilon"] == 0.0


def test_plan_is_consistent_with_estimate() -> None:
    p = plan(**MECH, epsilon=6.0, delta=1e-5, answer_rate=0.4)
    # The planned run fits the budget at the filter order, and one more query would not.
    assert p["epsilon_used"] <= 6.0
    per = p["rdp_per_query"] + 0.4 * p["rdp_per_answer"]
    assert (p["queries"] + 1) * per > p["budget_rdp"] >= p["queries"] * per
    # At the best order for that run alone, the ε is no larger.
    assert estimate(**MECH, queries=p["queries"], answered=p["answered"], delta=1e-5)["epsilon"] <= 6.0
    assert p["queries_all_answered"] <= p["queries"] <= p["queries_none_answered"]
    rates = {row["answer_rate"]: row["queries"] for row in p["rates"]}
    assert rates[0.1] >= rates[0.4] >= rates[1.0] >= p["queries_all_answered"]
    with pytest.raises(InputError, match="single query"):
        plan(**{**MECH, "sigma2": 0.5}, epsilon=0.5, delta=1e-5)
    with pytest.raises(InputError, match="answer_rate"):
        plan(**MECH, epsilon=6.0, delta=1e-5, answer_rate=1.5)


def test_discrete_and_continuous_screening_differ_but_both_are_bounded() -> None:
    cont = ConfidentGNMaxAccountant(**MECH, noise="continuous").query_rdp(ORDERS)
    disc = ConfidentGNMaxAccountant(**MECH, noise="discrete").query_rdp(ORDERS)
    assert not np.allclose(cont, disc, rtol=1e-9, atol=0)
    assert np.all(np.maximum(cont, disc) <= ORDERS / (2 * 100.0**2))
    assert math.isclose(float(cont[0]), float(disc[0]), rel_tol=1e-2)


def test_budget_curve_marks_unusable_orders_instead_of_raising() -> None:
    curve = rdp_budget_curve(DEFAULT_ORDERS, epsilon=6.0, delta=1e-5)
    assert curve[0] <= 0 < curve.max()  # order 1.05 cannot meet ε = 6; larger orders can
    usable = np.flatnonzero(curve > 0)
    for i in usable[:: max(1, usable.size // 10)]:
        assert rdp_budget_at_order(epsilon=6.0, delta=1e-5, order=DEFAULT_ORDERS[i]) == curve[i]
    with pytest.raises(InputError, match="cannot be met"):
        rdp_budget_at_order(epsilon=6.0, delta=1e-5, order=1.05)
