"""Private-kNN: the Poisson sampling it does is the sampling it accounts for, its votes, its costs, and its
secure path (GNMax's circuit) against its plaintext rule."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.aggregation import mechanism_noise
from capc_common.errors import InputError
from capc_common.mechanisms import PrivateKNN
from capc_common.privacy import NoiseSource, SeededNoise
from capc_common.privacy.analysis import rdp_gnmax_data_independent, rdp_subsampled_discrete_gaussian

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")
ORDERS = np.array([2.0, 3.0, 8.0, 20.0])


def test_cost_is_the_subsampled_discrete_gaussian_with_sensitivity_sqrt2():
    knn = PrivateKNN(classes=10, sigma=20.0, neighbours=5, sampling_rate=0.1)
    per_query, per_answer = knn.costs(ORDERS)
    np.testing.assert_array_equal(per_query, 0)
    # Sensitivity √2 and σ = 20 is noise multiplier 20/√2 for a unit-sensitivity sum.
    same = rdp_subsampled_discrete_gaussian(ORDERS, sampling_rate=0.1, noise_multiplier=20 / np.sqrt(2))
    np.testing.assert_allclose(per_answer, same, rtol=1e-12)
    assert np.all(per_answer < rdp_gnmax_data_independent(ORDERS, sigma=20.0))  # subsampling helps
    full = PrivateKNN(classes=10, sigma=20.0, neighbours=5, sampling_rate=1.0).costs(ORDERS)[1]
    np.testing.assert_allclose(full, rdp_gnmax_data_independent(ORDERS, sigma=20.0))
    assert knn.data_dependent() is None and knn.params()["sampling_rate"] == 0.1


def test_votes_use_a_fresh_poisson_sample_per_query():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 8))
    y = rng.integers(0, 3, size=1000)
    queries = x[:50] + 1e-3  # each query sits on one record
    knn = PrivateKNN(classes=3, sigma=1.0, neighbours=1, sampling_rate=0.5)
    hist = knn.votes(x, y, queries, source=SeededNoise("s"))
    assert hist.shape == (50, 3) and np.all(hist.sum(axis=1) == 1)
    # The record under the query is its nearest neighbour exactly when it was sampled: about half the time.
    own = hist[np.arange(50), y[:50]] == 1
    assert 10 < own.sum() < 45
    # All records sampled: the nearest is the record itself every time.
    everyone = PrivateKNN(classes=3, sigma=1.0, neighbours=1, sampling_rate=1.0)
    np.testing.assert_array_equal(everyone.votes(x, y, queries, source=SeededNoise("t")).argmax(1), y[:50])
    with pytest.raises(InputError, match="do not fit"):
        knn.votes(x, y, queries[:, :4], source=SeededNoise("s"))


class _Without(NoiseSource):
    """``SeededNoise(seed)`` as seen by a party that lost record ``gone``: every draw of ``n`` words is the
    full party's draw of ``n + 1`` with that record's word taken out, so each remaining record is sampled
    exactly when it was in the full party's run (the coupling under which neighbours are compared)."""

    def __init__(self, seed: str, gone: int) -> None:
        self.full, self.gone = SeededNoise(seed), gone

    def uniform_words(self, n: int) -> np.ndarray:
        return np.delete(self.full.uniform_words(n + 1), self.gone)


def test_removing_one_record_moves_at_most_one_vote_per_query_under_coupled_samples():
    """Issue 25.8: with the two runs' Poisson draws coupled record by record, removing a record that is
    among several queries' nearest moves exactly one vote on the queries whose fresh sample held it (and
    nothing on the others); row totals stay ``k``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8))
    y = rng.integers(0, 3, size=400)
    gone = 0
    queries = x[gone] + 1e-3 * rng.normal(size=(40, 8))  # record 0 is every query's nearest
    knn = PrivateKNN(classes=3, sigma=1.0, neighbours=5, sampling_rate=0.5)
    full = knn.votes(x, y, queries, source=SeededNoise("n"))
    without = knn.votes(np.delete(x, gone, 0), np.delete(y, gone), queries, source=_Without("n", gone))
    assert (full.sum(axis=1) == 5).all() and (without.sum(axis=1) == 5).all()
    moved = np.abs(full - without).sum(axis=1)
    assert set(moved.tolist()) <= {0, 2}  # one vote moved from one class to another, or nothing
    changed = moved == 2
    assert (full[changed, y[gone]] - without[changed, y[gone]] == 1).all()  # the vote record 0 cast left
    # A fresh sample per query: record 0 was drawn for about half of them (one shared sample: all or none).
    assert 8 < changed.sum() < 32


def test_ties_cannot_move_more_than_the_added_record():
    """Duplicated records tie in similarity; adding a record that no query selects must leave every
    histogram unchanged (an unstable partition of the scores could swap tied records of other classes)."""
    rng = np.random.default_rng(3)
    x = np.zeros((200, 9))
    x[:, :8] = np.repeat(rng.normal(size=(5, 8)), 40, axis=0)  # 5 distinct points, 40 copies each
    y = rng.integers(0, 4, size=len(x))
    queries = x[::40] + 1e-6
    orthogonal = np.eye(9)[8]  # similarity 0 to every query, below every copy's
    knn = PrivateKNN(classes=4, sigma=1.0, neighbours=4, sampling_rate=1.0)
    before = knn.votes(x, y, queries, source=SeededNoise("a"))
    after = knn.votes(
        np.insert(x, 0, orthogonal, axis=0), np.insert(y, 0, 0), queries, source=SeededNoise("a")
    )
    np.testing.assert_array_equal(before, after)


def test_answers_are_gnmax_of_the_summed_votes():
    rng = np.random.default_rng(1)
    knn = PrivateKNN(classes=4, sigma=2.0, neighbours=7, sampling_rate=0.3)
    parts = [(rng.normal(size=(300, 6)), rng.integers(0, 4, size=300)) for _ in range(3)]
    queries = rng.normal(size=(20, 6))
    hist = sum(knn.votes(x, y, queries, source=SeededNoise(f"p{i}")) for i, (x, y) in enumerate(parts))
    labels = knn.answer(hist, mechanism_noise(seed="a"))
    z2 = np.asarray(mechanism_noise(seed="a").guardian.discrete_gaussian(sigma=2.0, shape=(20, 4)))
    np.testing.assert_array_equal(labels, np.argmax(hist + z2, axis=1))
    assert knn.mpc_config(teachers=21).mode == "gnmax"
