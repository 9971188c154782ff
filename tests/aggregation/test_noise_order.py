"""The canonical noise order (the guardian's and the student's parts), the parties' separate streams and the
noise distribution through the draw functions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from capc_common.aggregation import draw_confident_noise, draw_student_noise, mechanism_noise, party_noise
from capc_common.errors import InputError
from capc_common.mechanisms import UNANSWERED, ConfidentGNMax, confident_rule
from capc_common.privacy import SeededNoise

# Seeded noise is the point of these tests (reproducible draws); its once-per-process warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")


def _pmf(support: np.ndarray, *, sigma: float | None = None, scale: float | None = None) -> np.ndarray:
    logits = -(support**2) / (2 * sigma**2) if sigma is not None else -np.abs(support) / scale
    p = np.exp(logits - logits.max())
    return p / p.sum()


def test_canonical_noise_order_reproduces_the_mechanism():
    """A federation — the guardian drawing (z1_g, z2), the student z1_s, each from its own source seeded from
    the same seed — must get the central labels, batch after batch."""
    rng = np.random.default_rng(3)
    central = mechanism_noise(seed="test-42")
    guardian, student = party_noise("guardian", seed="test-42"), party_noise("student", seed="test-42")
    mechanism = ConfidentGNMax(classes=4, teachers=50, threshold=30, sigma1=10.0, sigma2=5.0)
    for batch in (256, 64):
        hist = rng.multinomial(50, [0.5, 0.3, 0.1, 0.1], size=batch)
        labels = mechanism.answer(hist, central)
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


def test_student_noise_parameters_are_checked():
    with pytest.raises(InputError, match="sigma1"):
        draw_student_noise(SeededNoise("x"), batch=3, sigma1=0.0)
    with pytest.raises(InputError, match="batch"):
        draw_student_noise(SeededNoise("x"), batch=0, sigma1=1.0)


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
