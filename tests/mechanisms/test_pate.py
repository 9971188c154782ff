"""The PATE mechanisms as engine plug-ins: their plaintext rules (ties, the inclusive threshold, the output
law against exact probabilities), the labels of the canonical noise draws, their accounting against known
answers, and their secure path (a real garbler against a real evaluator) against their own plaintext rule."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from capc_common.aggregation import (
    draw_confident_noise,
    draw_student_noise,
    mechanism_noise,
    vote_histogram,
)
from capc_common.errors import InputError
from capc_common.mechanisms import (
    UNANSWERED,
    ConfidentGNMax,
    GNMax,
    LNMax,
    PrivateKNN,
    SelectionMechanism,
    confident_rule,
    noisy_argmax,
)
from capc_common.mpc import EvaluatorSession, GarblerSession, channel_pair, share_votes, sum_shares
from capc_common.privacy import ConfidentGNMaxAccountant

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")

ORDERS = np.array([2.0, 5.0, 10.0, 32.0])


def _histograms(queries: int, teachers: int, classes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, classes, size=queries)
    agree = rng.random((teachers, queries)) < 0.7
    predictions = np.where(agree, truth[None, :], rng.integers(0, classes, size=(teachers, queries)))
    return vote_histogram(predictions, classes=classes)


def test_confident_gnmax_answers_with_the_rule_on_the_canonical_draws():
    hist = _histograms(300, 60, 10, seed=1)
    mechanism = ConfidentGNMax(classes=10, teachers=60, threshold=40, sigma1=20, sigma2=8)
    a, b = mechanism_noise(seed="kat"), mechanism_noise(seed="kat")
    z1, z2 = draw_confident_noise(a.guardian, batch=300, classes=10, sigma1=20, sigma2=8)
    z1 = z1 + draw_student_noise(a.student, batch=300, sigma1=20)
    got = mechanism.answer(hist, b)
    np.testing.assert_array_equal(got, confident_rule(hist, threshold=40, z1=z1, z2=z2))
    assert 0 < (got >= 0).sum() < len(got)  # both outcomes occur: the comparison is not vacuous


def test_gnmax_and_lnmax_answer_the_noisy_argmax_of_the_guardians_draws():
    hist = _histograms(200, 30, 5, seed=2)
    a, b = mechanism_noise(seed="g"), mechanism_noise(seed="g")
    z = a.guardian.discrete_gaussian(sigma=6, shape=hist.shape)
    np.testing.assert_array_equal(GNMax(classes=5, sigma=6).answer(hist, b), noisy_argmax(hist + z))
    a, b = mechanism_noise(seed="l"), mechanism_noise(seed="l")
    z = a.guardian.discrete_laplace(scale=3, shape=hist.shape)
    np.testing.assert_array_equal(LNMax(classes=5, scale=3).answer(hist, b), noisy_argmax(hist + z))


def test_rule_ties_go_to_lowest_index_and_threshold_is_inclusive():
    hist = np.array([[3, 3, 0], [0, 3, 3], [1, 1, 4], [2, 2, 2]])
    zero2 = np.zeros((4, 3), np.int64)
    z1 = np.array([0, 0, -1, -2])
    labels = confident_rule(hist, threshold=3, z1=z1, z2=zero2)
    # rows 0, 1 tie (lowest index wins); row 2: 4 - 1 = 3 >= T passes; row 3: 2 - 2 < 3 fails.
    np.testing.assert_array_equal(labels, [0, 1, 2, UNANSWERED])
    # A non-integer threshold acts like its ceiling on integer counts.
    np.testing.assert_array_equal(confident_rule(hist, threshold=2.5, z1=z1, z2=zero2), [0, 1, 2, UNANSWERED])
    # Noise can create a tie, and the tie still goes low.
    z2 = np.array([[0, 0, 0], [3, 0, 0], [0, 3, 0], [0, 0, 2]])
    np.testing.assert_array_equal(confident_rule(hist, threshold=0, z1=z1, z2=z2), [0, 0, 1, 2])


def test_rule_rejects_mismatched_noise_and_a_bad_threshold():
    hist = np.array([[1, 1]])
    with pytest.raises(InputError, match="noise shapes"):
        confident_rule(hist, threshold=0, z1=np.zeros(2, np.int64), z2=np.zeros((1, 2), np.int64))
    with pytest.raises(InputError, match="integer"):
        confident_rule(hist, threshold=0, z1=np.zeros(1), z2=np.zeros((1, 2)))
    with pytest.raises(InputError, match="threshold"):
        confident_rule(hist, threshold=-1, z1=np.zeros(1, np.int64), z2=np.zeros((1, 2), np.int64))


def test_parameters_are_validated_before_drawing():
    with pytest.raises(InputError, match="sigma1"):
        ConfidentGNMax(classes=2, teachers=2, threshold=1, sigma1=0.0, sigma2=1.0)
    with pytest.raises(InputError, match="threshold"):
        ConfidentGNMax(classes=2, teachers=2, threshold=-1, sigma1=1.0, sigma2=1.0)
    with pytest.raises(InputError, match="scale"):
        LNMax(classes=2, scale=float("nan"))


DRAWS = 100_000


def _pmf(support: np.ndarray, *, sigma: float | None = None, scale: float | None = None) -> np.ndarray:
    logits = -(support**2) / (2 * sigma**2) if sigma is not None else -np.abs(support) / scale
    p = np.exp(logits - logits.max())
    return p / p.sum()


def test_confident_gnmax_pass_rate_and_labels_match_exact_probabilities():
    """The mechanism's output law on a fixed histogram equals the one computed from the pmf."""
    sigma1, sigma2, threshold = 4.0, 2.0, 10
    hist = np.tile([[9, 8]], (DRAWS, 1))
    mechanism = ConfidentGNMax(classes=2, teachers=17, threshold=threshold, sigma1=sigma1, sigma2=sigma2)
    labels = mechanism.answer(hist, mechanism_noise(seed="test-8"))
    support = np.arange(-60, 61)
    pmf1 = _pmf(support, sigma=sigma1)
    p_pass = np.convolve(pmf1, pmf1)[np.arange(-120, 121) >= threshold - 9].sum()  # z1 = z1_g + z1_s
    pmf2 = _pmf(support, sigma=sigma2)
    diff = np.convolve(pmf2, pmf2[::-1])  # law of z_0 - z_1 on [-120, 120]
    p_zero = diff[np.arange(-120, 121) >= -1].sum()  # 9 + z0 >= 8 + z1, ties to class 0
    passed = labels != UNANSWERED
    assert abs(passed.mean() - p_pass) < 5 * np.sqrt(p_pass * (1 - p_pass) / DRAWS)
    got = (labels[passed] == 0).mean()
    assert abs(got - p_zero) < 5 * np.sqrt(p_zero * (1 - p_zero) / passed.sum())


@pytest.mark.parametrize(
    ("sigma1", "error"), [(1.0, 0.006), (2.0, 0.0013), (5.0, 0.0013), (10.0, 1e-4), (35.0, 1e-4)]
)
@pytest.mark.parametrize("threshold", [30.5, 30.0])  # an integer T is where ``≥ T`` and ``> T`` differ
def test_the_pass_probability_is_the_exact_one_within_its_stated_error(
    sigma1: float, error: float, threshold: float
) -> None:
    """The planning figure the checks before spending use (a normal tail for the sum of the two discrete
    Gaussian parts) against the exact law of ``z1_g + z1_s`` within the error its docstring states, and the
    rule on real draws."""
    mechanism = ConfidentGNMax(classes=10, teachers=50, threshold=threshold, sigma1=sigma1, sigma2=8.0)
    reach = int(12 * sigma1) + 1
    support = np.arange(-reach, reach + 1)
    pmf = _pmf(support, sigma=sigma1)
    total = np.arange(-2 * reach, 2 * reach + 1)
    law = np.convolve(pmf, pmf)  # z1 = z1_g + z1_s
    for top in (0, 25, 29.2, 30, 31, 50):
        exact = law[top + total >= mechanism.threshold].sum()
        assert abs(mechanism.pass_probability(top) - exact) < error, (top, exact)
    hist = np.tile([[25] + [0] * 8 + [25]], (20_000, 1))  # a top count of 25 on every query
    passed = (mechanism.answer(hist, mechanism_noise(seed=f"pass-{sigma1}-{threshold}")) != UNANSWERED).mean()
    p = mechanism.pass_probability(25)
    assert abs(passed - p) < 5 * np.sqrt(p * (1 - p) / 20_000) + 0.002
    assert GNMax(classes=10, sigma=8.0).pass_probability(0) == 1.0  # no screening: every query answered


def test_lnmax_uses_discrete_laplace():
    scale = 2.0
    hist = np.tile([[5, 5]], (DRAWS, 1))
    labels = LNMax(classes=2, scale=scale).answer(hist, mechanism_noise(seed="test-9"))
    pmf = _pmf(np.arange(-80, 81), scale=scale)
    p_zero = np.convolve(pmf, pmf[::-1])[np.arange(-160, 161) >= 0].sum()
    assert abs((labels == 0).mean() - p_zero) < 5 * np.sqrt(p_zero * (1 - p_zero) / DRAWS)


def test_default_noise_is_the_system_csprng():
    hist = np.tile([[10, 10, 10]], (4096, 1))
    a = GNMax(classes=3, sigma=5.0).answer(hist, mechanism_noise())
    b = GNMax(classes=3, sigma=5.0).answer(hist, mechanism_noise())
    assert not np.array_equal(a, b)  # fresh secret randomness each call (collision prob. ~ 3^-4096)


def test_costs_known_answers():
    # GNMax: λ/σ² per answer (L2 sensitivity √2); σ = 40 → λ/1600 (reference/accounting.md).
    per_query, per_answer = GNMax(classes=10, sigma=40).costs(ORDERS)
    np.testing.assert_array_equal(per_query, 0)
    np.testing.assert_allclose(per_answer, ORDERS / 1600, rtol=1e-15)
    # LNMax with b = 2 is 1-DP per answer; pure ε-DP gives RDP ≤ ε at every order and ≤ λε²/2 (Bun-Steinke).
    _, lap = LNMax(classes=10, scale=2).costs(ORDERS)
    assert np.all(lap <= np.minimum(1.0, ORDERS * 0.5) + 1e-12)
    # Confident-GNMax: the accountant's figures, exact screening included (reference: k=300, T=210, σ1=85).
    mechanism = ConfidentGNMax(classes=10, teachers=300, threshold=210, sigma1=85, sigma2=40)
    per_query, per_answer = mechanism.costs(ORDERS)
    accountant = ConfidentGNMaxAccountant(
        teachers=300, classes=10, threshold=210, sigma1=85, sigma2=40, noise="discrete"
    )
    np.testing.assert_array_equal(per_query, accountant.query_rdp(ORDERS))
    np.testing.assert_allclose(per_answer, ORDERS / 1600, rtol=1e-15)
    assert mechanism.params() == accountant.params()


def test_lnmax_has_no_secure_path_and_says_so():
    with pytest.raises(InputError, match="central mode only"):
        LNMax(classes=10, scale=2).mpc_config(teachers=10)


def test_confident_gnmax_needs_the_students_noise():
    mechanism = ConfidentGNMax(classes=3, teachers=4, threshold=2, sigma1=1, sigma2=1)
    guardian = mechanism.guardian_noise(mechanism_noise(seed="s").guardian, batch=2)
    with pytest.raises(InputError, match="z1_s"):
        mechanism.rule(np.array([[4, 0, 0], [0, 4, 0]]), guardian, None)


def _secure(mechanism: SelectionMechanism, hist: np.ndarray, *, teachers: int, seed: str) -> np.ndarray:
    """One batch through the mechanism's secure path: two parties share, garbler in a thread."""
    config = mechanism.mpc_config(teachers=teachers)
    parts = [hist // 2, hist - hist // 2]
    shared = [share_votes(p, width=config.width) for p in parts]
    noise = mechanism_noise(seed=seed)
    guardian_noise = mechanism.guardian_noise(noise.guardian, batch=hist.shape[0])
    student_noise = mechanism.student_noise(noise.student, batch=hist.shape[0])
    g_channel, e_channel = channel_pair()
    garbler, evaluator = GarblerSession(g_channel, config), EvaluatorSession(e_channel, config)
    committed: list[np.ndarray] = []
    errors: list[BaseException] = []

    def garble() -> None:
        try:
            mechanism.garble(
                garbler,
                batch_id="b",
                seeds=[seed for seed, _ in shared],
                shape=hist.shape,
                noise=guardian_noise,
                commit=committed.append,
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=garble, daemon=True)
    thread.start()
    try:
        labels = evaluator.run_batch(
            "b", share_sum=sum_shares([s for _, s in shared], width=config.width), z1_student=student_noise
        )
    finally:
        thread.join(60)
        garbler.close()
        evaluator.close()
    assert not errors, errors
    assert len(committed) == 1  # the ledger hook ran once, before the labels were decodable
    return np.asarray(labels)


@pytest.mark.parametrize(
    "mechanism",
    [
        ConfidentGNMax(classes=4, teachers=20, threshold=14, sigma1=4, sigma2=2),
        GNMax(classes=4, sigma=3),
        PrivateKNN(classes=4, sigma=3, neighbours=5, sampling_rate=0.5),
    ],
    ids=lambda m: m.name,
)
def test_secure_path_equals_the_plaintext_rule_with_the_same_noise(mechanism: SelectionMechanism):
    hist = _histograms(64, 20, 4, seed=3)
    secure = _secure(mechanism, hist, teachers=20, seed="diff")
    plain = mechanism.answer(hist, mechanism_noise(seed="diff"))
    np.testing.assert_array_equal(secure, plain)
