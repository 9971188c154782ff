"""The PATE mechanisms as engine plug-ins: the same labels as the plaintext functions they wrap, their
accounting against known answers, and their secure path (a real garbler against a real evaluator) against
their own plaintext rule."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from capc_common.aggregation import confident_gnmax, gnmax, lnmax, mechanism_noise, vote_histogram
from capc_common.errors import InputError
from capc_common.mechanisms import ConfidentGNMax, GNMax, LNMax, PrivateKNN, SelectionMechanism
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


def test_confident_gnmax_object_releases_what_the_plaintext_function_releases():
    hist = _histograms(300, 60, 10, seed=1)
    mechanism = ConfidentGNMax(classes=10, teachers=60, threshold=40, sigma1=20, sigma2=8)
    a, b = mechanism_noise(seed="kat"), mechanism_noise(seed="kat")
    expected = confident_gnmax(
        hist, threshold=40, sigma1=20, sigma2=8, noise=a.guardian, student_noise=a.student
    )
    got = mechanism.answer(hist, b)
    np.testing.assert_array_equal(got, expected)
    assert 0 < (got >= 0).sum() < len(got)  # both outcomes occur: the comparison is not vacuous


def test_gnmax_and_lnmax_objects_release_what_the_plaintext_functions_release():
    hist = _histograms(200, 30, 5, seed=2)
    a, b = mechanism_noise(seed="g"), mechanism_noise(seed="g")
    np.testing.assert_array_equal(
        GNMax(classes=5, sigma=6).answer(hist, b), gnmax(hist, sigma=6, noise=a.guardian)
    )
    a, b = mechanism_noise(seed="l"), mechanism_noise(seed="l")
    np.testing.assert_array_equal(
        LNMax(classes=5, scale=3).answer(hist, b), lnmax(hist, scale=3, noise=a.guardian)
    )


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
