"""Vote histograms, and the guard against passing label arrays where histograms belong."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.aggregation import check_histograms, mechanism_noise, sum_histograms, vote_histogram
from capc_common.errors import InputError
from capc_common.mechanisms import GNMax, LNMax, confident_rule

# Seeded noise is the point of these tests (reproducible draws); its once-per-process warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")


def test_vote_histogram_counts_each_teacher_once():
    preds = np.array([[0, 1, 2, 2], [0, 2, 2, 1], [1, 2, 2, 0]])  # 3 teachers, 4 queries
    hist = vote_histogram(preds, classes=3)
    np.testing.assert_array_equal(hist, [[2, 1, 0], [0, 1, 2], [0, 0, 3], [1, 1, 1]])
    assert hist.dtype == np.int64
    assert (hist.sum(axis=1) == 3).all()


def test_per_party_histograms_sum_to_the_whole():
    rng = np.random.default_rng(0)
    preds = rng.integers(0, 10, (25, 64))
    parties = [preds[:10], preds[10:11], preds[11:]]
    total = sum_histograms([vote_histogram(p, classes=10) for p in parties])
    np.testing.assert_array_equal(total, vote_histogram(preds, classes=10))


@pytest.mark.parametrize(
    "labels",
    [
        np.array([3, 1, 4, 1, 5, 9, 2, 6]),  # one label per query: the public DIET-PATE bug
        np.array([[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8]]),  # (teachers, queries) predictions
        np.random.default_rng(1).integers(0, 10, (7, 10)),  # predictions whose shape mimics (queries, c)
    ],
)
def test_label_arrays_are_not_histograms(labels):
    with pytest.raises(InputError, match="histogram"):
        check_histograms(labels, classes=10)
    noise = mechanism_noise(seed="test-0")
    with pytest.raises(InputError, match="histogram"):
        confident_rule(labels, threshold=1, z1=np.zeros(len(labels), np.int64), z2=np.zeros_like(labels))
    with pytest.raises(InputError, match="histogram"):
        GNMax(classes=10, sigma=1.0).answer(labels, noise)
    with pytest.raises(InputError, match="histogram"):
        LNMax(classes=10, scale=1.0).answer(labels, noise)


def test_histogram_checks_name_the_problem():
    with pytest.raises(InputError, match="integer counts"):
        check_histograms(np.ones((2, 3)) / 3)
    with pytest.raises(InputError, match="non-negative"):
        check_histograms(np.array([[2, -1], [0, 1]]))
    with pytest.raises(InputError, match="5 teachers vote"):
        check_histograms(np.array([[2, 1], [0, 3]]), teachers=5)
    with pytest.raises(InputError, match=r"labels must lie in \[0, 3\)"):
        vote_histogram(np.array([[0, 3]]), classes=3)
    with pytest.raises(InputError, match="one shape"):
        sum_histograms([np.array([[1, 0]]), np.array([[1, 0], [0, 1]])])
