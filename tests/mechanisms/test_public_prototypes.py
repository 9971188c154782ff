"""DPPL-Public (:class:`~capc_common.mechanisms.PublicPrototypes`): the exact exponential-mechanism sampler,
the accounting against known answers and against the mechanism's exact law on neighbouring data, the
central runner, and utility on separable data."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.mechanisms import DPPrototypes, PublicPrototypes
from capc_common.mechanisms.central import PartyData, run_public_prototypes
from capc_common.privacy import SeededNoise
from capc_common.privacy.noise import exponential_mechanism_exact

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")


def _em_law(scores: np.ndarray, eta: float) -> np.ndarray:
    """``Pr[j] ∝ exp(η · scores[j])`` (floats: the reference the exact sampler must match)."""
    logits = eta * (scores - scores.max())
    p = np.exp(logits)
    return p / p.sum()


def test_exact_sampler_draws_the_exponential_mechanism() -> None:
    scores = np.array([0, 1, 2, 5, 5, 3], dtype=np.int64)
    source = SeededNoise("em-law")
    draws = np.array(
        [exponential_mechanism_exact(scores, eta=Fraction(1, 2), source=source) for _ in range(8_000)]
    )
    observed = np.bincount(draws, minlength=len(scores))
    expected = 8_000 * _em_law(scores.astype(float), 0.5)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # χ²(5) 99.9 % quantile; a sampler with η doubled gives χ² in the thousands
    # η = 0 is uniform; one candidate is always drawn.
    assert exponential_mechanism_exact(np.array([7]), eta=3.0, source=source) == 0
    uniform = [exponential_mechanism_exact(scores, eta=0, source=source) for _ in range(600)]
    assert set(uniform) == set(range(len(scores)))


@pytest.mark.parametrize(
    ("scores", "eta", "match"),
    [
        (np.array([], dtype=np.int64), 1.0, "non-empty"),
        (np.array([0.5, 1.0]), 1.0, "integer"),
        (np.array([1]), -1.0, "eta"),
        (np.array([1]), math.nan, "finite"),
        (np.array([1]), math.inf, "finite"),
    ],
)
def test_exact_sampler_refuses_bad_input(scores: np.ndarray, eta: float, match: str) -> None:
    with pytest.raises(InputError, match=match):
        exponential_mechanism_exact(scores, eta=eta, source=SeededNoise("x"))


def _pool(rng: np.random.Generator, *, classes: int = 4, dim: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Class centres (one-hot directions) and a pool: one candidate near each centre among 40 others."""
    centres = np.eye(classes, dim) * 3.0
    near = centres + 0.3 * rng.standard_normal(centres.shape)
    far = rng.standard_normal((40, dim))
    return centres, np.concatenate([far[:20], near, far[20:]])


def test_accounting_known_answers() -> None:
    rng = np.random.default_rng(0)
    _, pool = _pool(rng)
    one = PublicPrototypes(classes=4, candidates=pool, epsilon=1.0)
    three = PublicPrototypes(classes=4, candidates=pool, epsilon=1.0, per_class=3)
    # Order 2: the bounded-range cap λε²/8 = 0.25 is below the pure-DP curve
    # (ln(e² + e⁻¹) − ln(1 + e) = 0.7354); order 100: the pure-DP curve ((100 − ln(1 + e))/99 = 0.99684 with
    # the e⁻⁹⁹ term negligible) is below λε²/8 = 12.5.
    np.testing.assert_allclose(
        one.release_rdp([2.0, 100.0]), [0.25, (100 - math.log1p(math.e)) / 99], rtol=1e-9
    )
    np.testing.assert_allclose(three.release_rdp([2.0, 100.0]), 3 * one.release_rdp([2.0, 100.0]), rtol=1e-12)
    assert (one.zcdp, three.zcdp, three.pure_epsilon) == (0.125, 0.375, 3.0)


def test_one_record_moves_only_its_class_and_within_the_sensitivity() -> None:
    rng = np.random.default_rng(1)
    centres, pool = _pool(rng)
    x = np.repeat(centres, 25, axis=0) + rng.standard_normal((100, 16))
    y = np.repeat(np.arange(4), 25)
    mechanism = PublicPrototypes(
        classes=4, candidates=pool, epsilon=1.0, similarity_range=(1.0, 1.5), bits=10
    )
    before = mechanism.contribution(x[1:], y[1:])
    after = mechanism.contribution(x, y)  # record 0 (class 0) added
    change = after - before
    assert (change[1:] == 0).all()
    assert (change[0] >= 0).all() and (change[0] <= mechanism.sensitivity).all() and change[0].max() > 0
    # The clip bites: some similarities are below d_min (score 0) and some above d_max (score Δ).
    assert (change[0] == 0).any() and (change[0] == mechanism.sensitivity).any()
    # Parties' contributions add up to the pooled one exactly (integers).
    np.testing.assert_array_equal(
        mechanism.contribution(x[:40], y[:40]) + mechanism.contribution(x[40:], y[40:]), after
    )


def test_exact_law_on_neighbouring_data_is_within_the_accounting() -> None:
    """The mechanism's own law on D and D ∪ {record}: privacy loss within ±ε, its range within ε (bounded
    range), and the Rényi divergence at several orders within ``release_rdp``, for each added record."""
    rng = np.random.default_rng(2)
    centres, pool = _pool(rng)
    x = np.repeat(centres, 10, axis=0) + rng.standard_normal((40, 16))
    y = np.repeat(np.arange(4), 10)
    eps = 0.7
    mechanism = PublicPrototypes(
        classes=4, candidates=pool, epsilon=eps, similarity_range=(0.0, 2.0), bits=12
    )
    eta = float(mechanism.eta)  # the η ``select`` draws with
    assert mechanism.eta == Fraction(eps) / mechanism.sensitivity
    orders = np.array([1.5, 2.0, 8.0, 64.0])
    bound = mechanism.release_rdp(orders)
    worst = 0.0
    for extra in range(20):  # a record of class 0 far from the data, near a candidate, or anywhere
        record = pool[extra * 3 % len(pool)] * (1 + extra % 3) + 0.1 * rng.standard_normal(16)
        p = _em_law(mechanism.contribution(x, y)[0].astype(float), eta)
        q = _em_law(mechanism.contribution(np.vstack([x, record]), np.append(y, 0))[0].astype(float), eta)
        for a, b in ((p, q), (q, p)):
            loss = np.log(a / b)
            assert np.abs(loss).max() <= eps * (1 + 1e-9)
            assert loss.max() - loss.min() <= eps * (1 + 1e-9)
            renyi = np.log((a ** orders[:, None] * b ** (1 - orders[:, None])).sum(axis=1)) / (orders - 1)
            assert (renyi <= bound * (1 + 1e-9)).all()
            worst = max(worst, float(np.abs(loss).max()))
    assert worst > 0.3 * eps  # the check is not vacuous: some record moves the law by a good part of ε


def test_central_runner_selects_from_the_summed_scores_and_the_student_learns() -> None:
    rng = np.random.default_rng(3)
    centres, pool = _pool(rng)
    x = np.repeat(centres, 200, axis=0) + 0.8 * rng.standard_normal((800, 16))
    y = np.repeat(np.arange(4), 200)
    order = rng.permutation(800)
    parties = [PartyData(f"p{i}", x[part], y[part]) for i, part in enumerate(np.array_split(order, 3))]
    mechanism = PublicPrototypes(classes=4, candidates=pool, epsilon=0.5, per_class=2)
    chosen = run_public_prototypes(parties, mechanism=mechanism, selector=SeededNoise("central"))
    again = mechanism.select(mechanism.contribution(x, y), SeededNoise("central"))
    np.testing.assert_array_equal(chosen, again)
    assert chosen.shape == (4, 2) and all(len(set(row)) == 2 for row in chosen.tolist())
    # Each class's near candidate (pool rows 20..23) is among its selections: the scores decide, not chance
    # (uniform selection would find it with probability 2/44 per class).
    assert all(20 + c in chosen[c] for c in range(4))
    test_x = np.repeat(centres, 50, axis=0) + 0.8 * rng.standard_normal((200, 16))
    test_y = np.repeat(np.arange(4), 50)
    assert (mechanism.predict(test_x, chosen, rule="nearest") == test_y).mean() > 0.95
    assert (mechanism.predict(test_x, chosen, rule="mean") == test_y).mean() > 0.8
    # At a tiny ε the selection is nearly uniform and the student is near chance.
    blind = PublicPrototypes(classes=4, candidates=pool, epsilon=1e-6)
    picks = run_public_prototypes(parties, mechanism=blind, selector=SeededNoise("blind"))
    assert sum(20 + c == picks[c, 0] for c in range(4)) <= 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"candidates": np.zeros((0, 4))}, "non-empty"),
        ({"similarity_range": (1.5, 1.0)}, "similarity_range"),
        ({"per_class": 50}, "per_class"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"candidates": np.vstack([np.eye(4), [0.0, np.inf, 0.0, 0.0]])}, "candidate pool.*inf or NaN"),
        ({"candidates": np.vstack([np.eye(4), [0.0, np.nan, 0.0, 0.0]])}, "candidate pool.*inf or NaN"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict, match: str) -> None:
    base = {"classes": 3, "candidates": np.eye(5, 4), "epsilon": 1.0}
    with pytest.raises(InputError, match=match):
        PublicPrototypes(**{**base, **kwargs})


def test_bad_inputs_are_refused() -> None:
    mechanism = PublicPrototypes(classes=3, candidates=np.eye(5, 4), epsilon=1.0)
    with pytest.raises(InputError, match="labels"):
        mechanism.contribution(np.ones((2, 4)), np.array([0, 3]))
    with pytest.raises(InputError, match="shape"):
        mechanism.select(np.zeros((3, 4), dtype=np.int64), SeededNoise("x"))
    with pytest.raises(InputError, match="rule"):
        mechanism.predict(np.ones((2, 4)), np.zeros((3, 1), dtype=np.int64), rule="vote")  # type: ignore[arg-type]


def test_select_draws_each_class_with_eta_epsilon_over_the_sensitivity() -> None:
    pool = np.eye(4, 3)
    mechanism = PublicPrototypes(classes=2, candidates=pool, epsilon=0.5, bits=2)  # Δ = 4, η = 1/8
    scores = np.array([[0, 8, 16, 4], [12, 12, 0, 4]], dtype=np.int64)
    source = SeededNoise("select-law")
    draws = np.array([mechanism.select(scores, source)[:, 0] for _ in range(3_000)])
    for c in range(2):
        observed = np.bincount(draws[:, c], minlength=4)
        expected = 3_000 * _em_law(scores[c].astype(float), 0.5 / 4)
        assert float(((observed - expected) ** 2 / expected).sum()) < 16.3  # χ²(3) 99.9 % quantile


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_a_non_finite_record_is_refused_not_scored(value: float) -> None:
    """A record with inf/NaN used to normalise to NaN and encode as −2^63: one added record moved a score by
    2^63, far beyond Δ (unbounded privacy loss). It is refused with a clear error, for both prototype
    mechanisms that share the record check."""
    rng = np.random.default_rng(4)
    centres, pool = _pool(rng)
    x = np.repeat(centres, 5, axis=0) + rng.standard_normal((20, 16))
    y = np.repeat(np.arange(4), 5)
    mechanism = PublicPrototypes(classes=4, candidates=pool, epsilon=1.0)
    bad = x.copy()
    bad[7, 3] = value
    with pytest.raises(InputError, match=r"1 record.*inf or NaN.*row 7"):
        mechanism.contribution(bad, y)
    with pytest.raises(InputError, match="inf or NaN"):
        DPPrototypes(classes=4, dim=16, rho=1.0).contribution(bad, y)


def test_encoded_scores_stay_within_the_sensitivity() -> None:
    """The backstop behind the input checks: whatever the similarity, each record's encoded score is in
    ``[0, Δ]`` (a NaN similarity, e.g. from a pool made non-finite after construction, encodes as 0)."""
    mechanism = PublicPrototypes(classes=2, candidates=np.eye(3), epsilon=1.0, bits=4)
    mechanism.candidates[1] = np.nan  # bypasses the constructor's check
    scores = mechanism.contribution(np.eye(3), np.array([0, 0, 1]))
    assert scores.min() >= 0 and scores.max() <= 2 * mechanism.sensitivity
    assert (scores[:, 1] == 0).all()


def test_params_name_the_neighbouring_relation() -> None:
    mechanism = PublicPrototypes(classes=2, candidates=np.eye(3), epsilon=1.0)
    assert mechanism.params()["neighbouring"] == "add/remove"
