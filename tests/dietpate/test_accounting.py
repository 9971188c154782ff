"""The central run's budget: worst-case admission that covers every outcome, and the planned filter order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.dietpate.accounting import make_budget
from capc_common.dietpate.config import BudgetSection, MechanismSection
from capc_common.errors import InputError
from capc_common.privacy import RenyiFilter, RunBudget, plan
from capc_common.privacy.analysis import DEFAULT_ORDERS, rdp_budget_curve, rdp_gnmax_data_independent

_RDP = st.floats(min_value=1e-9, max_value=50.0, allow_nan=False, allow_infinity=False)


def _budget(query_rdp: float, answer_rdp: float, budget_rdp: float) -> RunBudget:
    rf = RenyiFilter(order=8.0, epsilon=1.0, delta=1e-5, budget_rdp=budget_rdp)
    return RunBudget(filter=rf, query_rdp=query_rdp, answer_rdp=answer_rdp, data_dependent=None)


def _batch(count: int, answered: int) -> tuple[np.ndarray, np.ndarray]:
    mask = np.zeros(count, dtype=bool)
    mask[:answered] = True
    return np.zeros((count, 10), dtype=np.int64), mask


@settings(max_examples=300, deadline=None)
@given(query_rdp=_RDP, answer_rdp=_RDP, count=st.integers(1, 4096), data=st.data())
def test_a_batch_that_fits_is_admitted_whatever_it_answers(
    query_rdp: float, answer_rdp: float, count: int, data: st.DataObject
) -> None:
    spent = data.draw(_RDP)
    # The tightest budget the batch may start under: exactly what was spent plus its worst case.
    worst = _budget(query_rdp, answer_rdp, budget_rdp=1.0).worst_case(count)
    rb = _budget(query_rdp, answer_rdp, budget_rdp=spent + worst)
    rb.filter.charges.append(spent)
    assert rb.fits(count)
    answered = data.draw(st.integers(0, count))
    assert rb.actual(count, answered) <= rb.worst_case(count) == rb.actual(count, count)
    rb.charge(*_batch(count, answered))  # never BudgetExhaustedError once admitted
    assert (rb.queries, rb.answered) == (count, answered)


def test_an_all_answered_batch_is_charged_exactly_its_reservation() -> None:
    # For these costs count·(q + a) rounds 2.8e-17 below count·q + count·a. With that as the worst case, a
    # budget of exactly count·(q + a) admitted the batch, and its all-answered charge was then refused after
    # the labels had been released: a failure that depends on the private votes.
    q, a, count = 1e-4, 2.875e-3, 48
    assert count * (q + a) < count * q + count * a
    assert not _budget(q, a, budget_rdp=count * (q + a)).fits(count)
    rb = _budget(q, a, budget_rdp=count * q + count * a)
    assert rb.fits(count)
    rb.charge(*_batch(count, count))
    assert rb.filter.spent_rdp == rb.filter.budget_rdp
    assert not rb.fits(16)


def _mechanism(**kw: float | str) -> MechanismSection:
    return MechanismSection.model_validate(kw)


@pytest.mark.parametrize(("epsilon", "rate"), [(1.0, 0.3), (6.0, 0.3), (6.0, 1.0), (10.0, 0.1)])
def test_auto_order_is_the_planners_order(epsilon: float, rate: float) -> None:
    mech = _mechanism(name="confident-gnmax", threshold=150, sigma1=120, sigma2=40)
    budget = BudgetSection(epsilon=epsilon, delta=1e-5, expected_answer_rate=rate)
    rb = make_budget(mech, budget, teachers=200, classes=10, smallest_batch=16)
    expected = plan(
        teachers=200,
        classes=10,
        threshold=150,
        sigma1=120,
        sigma2=40,
        epsilon=epsilon,
        delta=1e-5,
        answer_rate=rate,
    )
    assert rb.filter.order == expected["order"]
    assert rb.filter.budget_rdp == pytest.approx(expected["budget_rdp"], rel=1e-12)


def test_auto_order_for_gnmax_buys_the_most_answers() -> None:
    orders = np.asarray(DEFAULT_ORDERS, dtype=np.float64).ravel()
    budgets = rdp_budget_curve(orders, epsilon=4.0, delta=1e-5)
    per_answer = rdp_gnmax_data_independent(orders, sigma=30.0)
    fits = np.where(budgets > 0, np.floor(budgets / per_answer), -1)
    rb = make_budget(
        _mechanism(name="gnmax", sigma2=30.0),
        BudgetSection(epsilon=4.0, delta=1e-5),
        teachers=100,
        classes=10,
        smallest_batch=16,
    )
    at = int(np.flatnonzero(orders == rb.filter.order)[0])
    assert fits[at] == fits.max() > 0
    assert rb.query_rdp == 0 and rb.answer_rdp == pytest.approx(per_answer[at])


def test_a_fixed_order_is_kept_and_a_tiny_budget_is_refused() -> None:
    mech = _mechanism(name="confident-gnmax", threshold=150, sigma1=120, sigma2=40)
    rb = make_budget(
        mech, BudgetSection(epsilon=6.0, delta=1e-5, order=8), teachers=200, classes=10, smallest_batch=64
    )
    assert rb.filter.order == 8.0
    with pytest.raises(InputError, match="too small for a single batch of 4096 queries"):
        make_budget(
            mech, BudgetSection(epsilon=0.05, delta=1e-5), teachers=200, classes=10, smallest_batch=4096
        )
