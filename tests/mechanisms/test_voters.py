"""A teacher party's Private-kNN voter: it is the central runner's party, one record moves at most one vote of
a query, and every query gets a fresh Poisson sample at the configured rate from the party's own stream."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.aggregation import sampling_noise
from capc_common.errors import InputError
from capc_common.mechanisms import KNNVoter, PrivateKNN, per_example
from capc_common.privacy import SeededNoise, SystemNoise
from capc_common.synth import generate

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")


@pytest.fixture(scope="module")
def backbone():
    from capc_common.models import load_backbone

    return load_backbone("scatter-28x28x1")


def _images(seed: int, count: int) -> np.ndarray:
    return generate("dead_leaves", seed=seed, start=0, count=count, height=28, width=28, channels=1)


RECORDS = _images(11, 96)
LABELS = np.arange(96, dtype=np.int64) % 10
QUERIES = _images(12, 32)


def test_the_voter_is_the_central_runners_party(backbone) -> None:
    """The federation's teacher and :func:`run_private_knn`'s party vote alike given the same stream."""
    knn = PrivateKNN(classes=10, sigma=1.0, neighbours=5, sampling_rate=0.4)
    voter = KNNVoter(knn, backbone, RECORDS, LABELS, source=SeededNoise("party"))
    votes = voter.vote(QUERIES, bn_batch=16)
    expected = knn.votes(
        per_example(backbone, RECORDS), LABELS, per_example(backbone, QUERIES), source=SeededNoise("party")
    )
    np.testing.assert_array_equal(votes, expected)
    assert voter.heads == 5 and voter.describe()["records"] == 96
    assert votes.shape == (32, 10) and votes.sum(axis=1).max() <= 5


def test_one_record_moves_at_most_one_vote_of_a_query(backbone) -> None:
    """Everyone sampled (q = 1, so the samples couple): adding a record changes each query's counts by at
    most one vote moved (+1 to its label, −1 to the displaced neighbour's) — L2 √2, what the costs assume."""
    knn = PrivateKNN(classes=10, sigma=1.0, neighbours=7, sampling_rate=1.0)
    queries = QUERIES
    without = KNNVoter(knn, backbone, RECORDS, LABELS, source=SystemNoise()).vote(queries, bn_batch=16)
    for extra in (17,):  # a copy of a query: it enters that query's k nearest for sure
        absent = int(np.flatnonzero(without[extra] == 0)[0])  # a class none of its k nearest had (k < 10)
        images = np.concatenate([RECORDS, queries[extra : extra + 1]])
        labels = np.append(LABELS, absent)
        with_it = KNNVoter(knn, backbone, images, labels, source=SystemNoise()).vote(queries, bn_batch=16)
        diff = with_it - without
        assert np.all(diff.sum(axis=1) == 0)  # k votes either way
        assert np.abs(diff).sum(axis=1).max() == 2 and diff.max() == 1 and diff.min() == -1
        assert diff[extra, absent] == 1  # the query it copies gained its vote


def test_each_query_draws_a_fresh_sample_at_the_rate(backbone) -> None:
    """With k ≥ n every sampled record votes, so the votes per query are the sample sizes: Binomial(n, q)."""
    n, q = len(LABELS), 0.3
    knn = PrivateKNN(classes=10, sigma=1.0, neighbours=n, sampling_rate=q)
    voter = KNNVoter(knn, backbone, RECORDS, LABELS, source=SeededNoise("rate"))
    sizes = voter.vote(QUERIES, bn_batch=16).sum(1)
    mean, std = n * q, np.sqrt(n * q * (1 - q) / len(sizes))
    assert abs(sizes.mean() - mean) < 5 * std
    assert len(set(sizes.tolist())) > 5  # a fresh sample per query, not one reused
    voter.source = SeededNoise("rate")
    np.testing.assert_array_equal(voter.vote(QUERIES, bn_batch=16).sum(1), sizes)  # the stream replays


def test_sampling_streams_are_per_party_and_private_by_default() -> None:
    a, b = sampling_noise("hospital-1", seed="s"), sampling_noise("hospital-2", seed="s")
    assert not np.array_equal(a.uniform_words(8), b.uniform_words(8))
    replay = sampling_noise("hospital-1", seed="s").uniform_words(8)
    np.testing.assert_array_equal(replay, sampling_noise("hospital-1", seed="s").uniform_words(8))
    assert isinstance(sampling_noise("hospital-1"), SystemNoise)
    with pytest.raises(InputError, match="party's name"):
        sampling_noise("", seed="s")
