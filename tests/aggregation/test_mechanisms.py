"""Mechanisms: the plaintext rule (ties!), the canonical noise order (the guardian's and the student's parts)
and the noise distribution."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from capc_common.aggregation import (
    UNANSWERED,
    confident_gnmax,
    confident_rule,
    draw_confident_noise,
    draw_student_noise,
    gnmax,
    lnmax,
    mechanism_noise,
    party_noise,
)
from capc_common.errors import InputError
from capc_common.privacy import SeededNoise

# Seeded noise is the point of these tests (reproducible draws); its once-per-process warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")


def _pmf(support: np.ndarray, *, sigma: float | None = None, scale: float | None = None) -> np.ndarray:
    logits = -(support**2) / (2 * sigma**2) if sigma is not None else -np.abs(support) / scale
    p = np.exp(logits - logits.max())
    return p / p.sum()


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


def test_rule_rejects_mismatched_noise():
    hist = np.array([[1, 1]])
    with pytest.raises(InputError, match="noise shapes"):
        confident_rule(hist, threshold=0, z1=np.zeros(2, np.int64), z2=np.zeros((1, 2), np.int64))
    with pytest.raises(InputError, match="integer"):
        confident_rule(hist, threshold=0, z1=np.zeros(1), z2=np.zeros((1, 2)))


def test_canonical_noise_order_reproduces_the_mechanism():
    """A federation — the guardian drawing (z1_g, z2), the student z1_s, each from its own source seeded from
    the same seed — must get the central labels, batch after batch."""
    rng = np.random.default_rng(3)
    central = mechanism_noise(seed="test-42")
    guardian, student = party_noise("guardian", seed="test-42"), party_noise("student", seed="test-42")
    for batch in (256, 64):
        hist = rng.multinomial(50, [0.5, 0.3, 0.1, 0.1], size=batch)
        labels = confident_gnmax(
            hist, threshold=30, sigma1=10.0, sigma2=5.0, noise=central.guardian, student_noise=central.student
        )
        z1, z2 = draw_confident_noise(guardian, batch=batch, classes=4, sigma1=10.0, sigma2=5.0)
        z1_student = draw_student_noise(student, batch=batch, sigma1=10.0)
        np.testing.assert_array_equal(confident_rule(hist, threshold=30, z1=z1 + z1_student, z2=z2), labels)
        assert (labels == UNANSWERED).any() and (labels != UNANSWERED).any()
        # The guardian's part alone does not give the labels: the student's part matters.
        assert not np.array_equal(confident_rule(hist, threshold=30, z1=z1, z2=z2), labels)


def test_party_streams_are_separate_and_the_guardians_is_unchanged():
    """One seed, two unrelated streams; the guardian's is SeededNoise(seed) as before the split."""
    guardian, student = party_noise("guardian", seed="s"), party_noise("student", seed="s")
    words = guardian.uniform_words(64), student.uniform_words(64)
    assert not np.intersect1d(*words).size
    np.testing.assert_array_equal(words[0], SeededNoise("s").uniform_words(64))
    assert type(party_noise("student")).__name__ == "SystemNoise"
    with pytest.raises(InputError, match="noise party"):
        party_noise("teacher", seed="s")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="non-empty"):
        party_noise("student", seed="")


def test_both_noise_sources_or_neither():
    hist = np.array([[2, 0]])
    with pytest.raises(InputError, match="inject both"):
        confident_gnmax(hist, threshold=1, sigma1=1.0, sigma2=1.0, noise=SeededNoise("x"))
    with pytest.raises(InputError, match="inject both"):
        confident_gnmax(hist, threshold=1, sigma1=1.0, sigma2=1.0, student_noise=SeededNoise("x"))
    with pytest.raises(InputError, match="sigma1"):
        draw_student_noise(SeededNoise("x"), batch=3, sigma1=0.0)
    with pytest.raises(InputError, match="batch"):
        draw_student_noise(SeededNoise("x"), batch=0, sigma1=1.0)


def test_parameters_are_validated_before_drawing():
    hist = np.array([[2, 0]])
    with pytest.raises(InputError, match="sigma1"):
        confident_gnmax(hist, threshold=1, sigma1=0.0, sigma2=1.0)
    with pytest.raises(InputError, match="threshold"):
        confident_gnmax(hist, threshold=-1, sigma1=1.0, sigma2=1.0)
    with pytest.raises(InputError, match="scale"):
        lnmax(hist, scale=float("nan"))


DRAWS = 100_000


def test_discrete_gaussian_noise_through_the_mechanism_has_the_exact_law():
    """≥ 10⁵ draws of z1_g, z1_s and z2 through the draw functions vs the exact N_Z(0, σ²) pmf (χ² test)."""
    sigma = 3.0
    z1, z2 = draw_confident_noise(SeededNoise("test-7"), batch=DRAWS, classes=2, sigma1=sigma, sigma2=sigma)
    z1_student = draw_student_noise(SeededNoise("test-7s"), batch=DRAWS, sigma1=sigma)
    for sample in (z1, z2[:, 0], z1_student):
        support = np.arange(-8, 9)
        expected = _pmf(np.arange(-60, 61), sigma=sigma)
        tails = expected[:52].sum(), expected[69:].sum()
        expected = np.concatenate([[tails[0]], expected[52:69], [tails[1]]]) * DRAWS
        clipped = np.clip(sample, -9, 9)
        observed = np.array(
            [(clipped == -9).sum(), *[(sample == k).sum() for k in support], (clipped == 9).sum()]
        )
        assert stats.chisquare(observed, expected).pvalue > 1e-4
    assert abs(np.var(z1) - sigma**2) < 0.1  # variance of N_Z(0, 9) is 9 to ~1e-33
    assert abs(np.var(z1_student) - sigma**2) < 0.1


def test_confident_gnmax_pass_rate_and_labels_match_exact_probabilities():
    """The mechanism's output law on a fixed histogram equals the one computed from the pmf."""
    sigma1, sigma2, threshold = 4.0, 2.0, 10
    hist = np.tile([[9, 8]], (DRAWS, 1))
    noise = mechanism_noise(seed="test-8")
    labels = confident_gnmax(
        hist,
        threshold=threshold,
        sigma1=sigma1,
        sigma2=sigma2,
        noise=noise.guardian,
        student_noise=noise.student,
    )
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


def test_lnmax_uses_discrete_laplace():
    scale = 2.0
    hist = np.tile([[5, 5]], (DRAWS, 1))
    labels = lnmax(hist, scale=scale, noise=SeededNoise("test-9"))
    pmf = _pmf(np.arange(-80, 81), scale=scale)
    p_zero = np.convolve(pmf, pmf[::-1])[np.arange(-160, 161) >= 0].sum()
    assert abs((labels == 0).mean() - p_zero) < 5 * np.sqrt(p_zero * (1 - p_zero) / DRAWS)


def test_default_noise_is_the_system_csprng():
    hist = np.tile([[10, 10, 10]], (4096, 1))
    a = gnmax(hist, sigma=5.0)
    b = gnmax(hist, sigma=5.0)
    assert not np.array_equal(a, b)  # fresh secret randomness each call (collision prob. ~ 3^-4096)
