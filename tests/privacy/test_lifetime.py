"""A hospital's lifetime account: charges of federations with different orders composed at one order, against
numbers computed here from the formulas (not from the library's accountant), reservations and refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capc_common.errors import BudgetExhaustedError, InputError
from capc_common.privacy.analysis import (
    DEFAULT_ORDERS,
    epsilon_from_rdp,
    epsilon_holding,
    lifetime_order,
    rdp_at_lower_order,
)
from capc_common.privacy.lifetime import LifetimeAccount

DELTA = 1e-5


def _improved(rdp: float, order: float, delta: float = DELTA) -> float:
    """ε of an RDP total at one order (Canonne, Kamath & Steinke 2020, Prop. 12), written out."""
    return rdp + math.log1p(-1 / order) - (math.log(delta) + math.log(order)) / (order - 1)


def _account(epsilon: float, order: float) -> LifetimeAccount:
    return LifetimeAccount.from_header({"kind": "init", "epsilon": epsilon, "delta": DELTA, "order": order})


def _gaussian(order: float, sigma: float, steps: int) -> float:
    """``steps`` Gaussian releases of sensitivity 1 at ``order``: ``steps · λ/(2σ²)`` (Mironov 2017)."""
    return steps * order / (2 * sigma**2)


def test_two_federations_of_different_orders_compose_at_the_site_order() -> None:
    """Federation A ran its filter at order 10 (σ 4, 30 releases), federation B at order 3 (σ 2, 5 releases).
    The site sums both at its own order 4, from each mechanism's curve: ε 9.3379 at δ 1e-5, where adding the
    two federations' own best (ε, δ) would give 6.81 + 5.38 = 12.19 at δ 2e-5; neither federation's order is
    used."""
    order = 4.0
    account = _account(50.0, order)
    a, b = _gaussian(order, 4.0, 30), _gaussian(order, 2.0, 5)
    account.apply({"kind": "join", "federation": "a", "hashes": ["ha"], "planned_rdp": a})
    account.apply({"kind": "join", "federation": "b", "hashes": ["hb"], "planned_rdp": b})
    for name, rdp in (("ha", a / 30), ("hb", b / 5)):
        for _ in range(30 if name == "ha" else 5):
            account.check_charge(config_hash=name, rdp=rdp, what="a release")
            account.apply({"kind": "charge", "config_hash": name, "rdp": rdp, "cap_lines": 0})
    total = account.to_dict()["total"]
    assert total["spent_rdp"] == pytest.approx(4 * (30 / 32 + 5 / 8), rel=1e-12)
    assert total["spent_epsilon"] == pytest.approx(_improved(6.25, 4.0), rel=1e-12)
    assert total["spent_epsilon"] == pytest.approx(9.3378616, abs=1e-6)
    own_a = min(_improved(_gaussian(lam, 4.0, 30), lam) for lam in DEFAULT_ORDERS)
    own_b = min(_improved(_gaussian(lam, 2.0, 5), lam) for lam in DEFAULT_ORDERS)
    assert (round(own_a, 2), round(own_b, 2)) == (6.81, 5.38)
    assert total["spent_epsilon"] < own_a + own_b  # basic composition, at twice the δ, is looser


def test_a_plan_that_does_not_fit_is_refused_with_the_limit_that_would_take_it() -> None:
    account = _account(10.0, 4.0)
    budget = 10.0 - (_improved(0.0, 4.0))  # what the limit holds at order 4
    account.apply({"kind": "join", "federation": "first", "hashes": ["h1"], "planned_rdp": 0.6 * budget})
    with pytest.raises(BudgetExhaustedError) as refused:
        account.check_join(name="second", hashes=["h2"], planned_rdp=0.5 * budget)
    need = 1.1 * budget
    limit = math.ceil(_improved(need, 4.0) * 100) / 100
    message = str(refused.value)
    assert f"A lifetime limit of ε {limit:g} would take it" in message
    assert "'first' RDP" in message and "Nothing was charged" in message
    account.check_join(name="second", hashes=["h2"], planned_rdp=0.4 * budget)  # what is left fits
    # A membership change continues the first federation: it re-plans, it does not reserve twice.
    account.check_join(name="first", hashes=["h1b", "h1"], planned_rdp=budget)


def test_a_charge_keeps_to_its_share_and_closing_returns_the_unspent_reservation() -> None:
    account = _account(10.0, 4.0)
    budget = account.budget_rdp
    account.apply({"kind": "join", "federation": "a", "hashes": ["ha"], "planned_rdp": 0.7 * budget})
    account.apply({"kind": "join", "federation": "b", "hashes": ["hb"], "planned_rdp": 0.2 * budget})
    account.apply({"kind": "charge", "config_hash": "hb", "rdp": 0.2 * budget, "cap_lines": 1})
    # b spent its plan; one more of b would eat into a's reservation, though the spend alone would fit
    with pytest.raises(BudgetExhaustedError, match="federation 'b' spent"):
        account.check_charge(config_hash="hb", rdp=0.2 * budget, what="batch q")
    account.apply({"kind": "close", "hashes": ["ha"]})
    account.check_charge(config_hash="hb", rdp=0.2 * budget, what="batch q")
    account.apply({"kind": "join", "federation": "a", "hashes": ["ha"], "planned_rdp": 0.7 * budget})
    with pytest.raises(BudgetExhaustedError):  # a started again: its reservation holds again
        account.check_charge(config_hash="hb", rdp=0.2 * budget, what="batch q")
    with pytest.raises(InputError, match="never joined"):
        account.check_charge(config_hash="hz", rdp=0.0, what="batch q")


def test_limits_are_recorded_and_the_guarantee_is_the_largest() -> None:
    """The guarantee is the largest limit ever set, and the samplers' share of δ is stated at it: every
    federation's released outputs are within its total-variation bound of exact noise's, so together within
    the sum, and (ε, δ) becomes (ε, δ + (1 + e^ε)·Σ) — at ε 20 and 3e-25 + 1e-23, 4.997e-15."""
    account = _account(10.0, 4.0)
    account.apply({"kind": "limit", "epsilon": 20.0})
    account.apply({"kind": "limit", "epsilon": 5.0})
    for name, tv in (("a", 3e-25), ("b", 1e-23)):
        account.apply(
            {"kind": "join", "federation": name, "hashes": [name], "planned_rdp": 0.0, "sampler_tv": tv}
        )
    report = account.to_dict()["limit"]
    assert (report["epsilon"], report["guarantee_epsilon"], report["set"]) == (5.0, 20.0, [10.0, 20.0, 5.0])
    assert report["budget_rdp"] == pytest.approx(5.0 - _improved(0.0, 4.0), rel=1e-12)
    assert report["delta_sampler"] == pytest.approx((1 + math.exp(20.0)) * 1.03e-23, rel=1e-12, abs=0)
    assert report["delta_sampler"] == pytest.approx(4.997e-15, rel=1e-3, abs=0)
    assert report["delta_total"] == DELTA + report["delta_sampler"]


def test_a_cap_record_counted_in_before_its_join_and_malformed_entries() -> None:
    account = _account(10.0, 4.0)
    account.apply(
        {"kind": "adopt", "federation": "old", "hashes": ["h0", "h00"], "config_hash": "h0", "rdp": 1.5,
         "cap_lines": 7}
    )  # fmt: skip
    (old,) = account.federations
    assert (old.spent_rdp, old.cap_lines, old.reserved_rdp) == (1.5, 7, 1.5)
    for bad in (
        {"kind": "charge", "config_hash": "nobody", "rdp": 1.0, "cap_lines": 1},
        {"kind": "refund", "rdp": 1.0},
        {"kind": "charge", "config_hash": "h0", "rdp": -1.0, "cap_lines": 1},
        {"kind": "join", "federation": "x"},
    ):
        with pytest.raises((ValueError, KeyError)):
            account.apply(bad)
    for header in (
        {"kind": "init", "epsilon": 1.0, "delta": DELTA, "order": 1.5},  # cannot be met at order 1.5
        {"kind": "init", "epsilon": 10.0, "delta": DELTA, "order": 4.0, "neighbouring": "replace-one"},
        {"kind": "charge", "epsilon": 10.0, "delta": DELTA, "order": 4.0},
    ):
        with pytest.raises(InputError):
            LifetimeAccount.from_header(header)


def test_the_site_order_holds_the_most_copies_of_the_first_plan() -> None:
    """For a Gaussian plan (ρλ per order), the order where the limit holds the most copies, found by a scan
    written here."""
    rho, limit = 0.2, 30.0
    plan = rho * DEFAULT_ORDERS
    copies = [(limit - _improved(0.0, lam)) / (rho * lam) for lam in DEFAULT_ORDERS]
    assert lifetime_order(plan, orders=DEFAULT_ORDERS, epsilon=limit, delta=DELTA) == float(
        DEFAULT_ORDERS[int(np.argmax(copies))]
    )
    with pytest.raises(InputError, match="cannot be met at any order"):
        lifetime_order([1.0], orders=[1.5], epsilon=1.0, delta=DELTA)


def test_a_recorded_figure_moves_only_to_lower_orders_and_limits_round_up() -> None:
    assert rdp_at_lower_order(2.5, recorded_order=10.0, order=3.0) == 2.5
    with pytest.raises(InputError, match="bounds nothing at the higher order 12"):
        rdp_at_lower_order(2.5, recorded_order=10.0, order=12.0)
    # RDP 1 at order 10, δ 1e-5 converts to ε 1.91801…: a limit of 1.92 holds it, 1.91 does not.
    assert _improved(1.0, 10.0) == pytest.approx(1.9180106, abs=1e-7)
    assert epsilon_holding(1.0, delta=DELTA, order=10.0) == 1.92
    assert epsilon_from_rdp([10.0], [1.0], delta=DELTA)[0] == pytest.approx(_improved(1.0, 10.0))
