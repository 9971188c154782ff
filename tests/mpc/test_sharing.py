"""Additive sharing over Z_{2^w}, the seed-compressed guardian share, ring widths and session parameters."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.errors import InputError
from capc_common.mpc import (
    MpcConfig,
    expand_share_seed,
    reduce_shares,
    ring_width,
    share_votes,
    sum_seeds,
    sum_shares,
)


@settings(max_examples=30, deadline=None)
@given(
    width=st.integers(2, 62),
    queries=st.integers(1, 20),
    classes=st.integers(2, 12),
    parties=st.integers(1, 4),
)
def test_shares_of_all_parties_add_up_to_the_votes(
    width: int, queries: int, classes: int, parties: int
) -> None:
    rng = np.random.default_rng(width * 1000 + queries)
    cap = min(1 << (width - 1), 1000)
    votes = [rng.integers(0, max(1, cap // parties), (queries, classes)) for _ in range(parties)]
    shared = [share_votes(v, width=width) for v in votes]
    student = sum_shares([share for _, share in shared], width=width)
    guardian = sum_seeds([seed for seed, _ in shared], shape=(queries, classes), width=width)
    assert student.min() >= 0 and student.max() < 1 << width and student.dtype == np.int64
    np.testing.assert_array_equal(reduce_shares(student + guardian, width=width), np.sum(votes, axis=0))


def test_seed_expansion_is_deterministic_and_seeds_are_fresh() -> None:
    seed, _ = share_votes(np.zeros((4, 3), dtype=np.int64), width=12)
    first = expand_share_seed(seed, shape=(4, 3), width=12)
    np.testing.assert_array_equal(first, expand_share_seed(seed, shape=(4, 3), width=12))
    assert first.max() < 1 << 12
    seeds = {share_votes(np.zeros((1, 2), dtype=np.int64), width=8)[0] for _ in range(50)}
    assert len(seeds) == 50


def test_sharing_rejects_bad_inputs() -> None:
    with pytest.raises(InputError, match="2-D integer array"):
        share_votes(np.zeros(3, dtype=np.int64), width=8)
    with pytest.raises(InputError, match="≥ 0"):
        share_votes(np.array([[1, -1]]), width=8)
    with pytest.raises(InputError, match="16 bytes"):
        expand_share_seed(b"x" * 15, shape=(1, 2), width=8)
    with pytest.raises(InputError, match="width"):
        expand_share_seed(b"x" * 16, shape=(1, 2), width=63)
    with pytest.raises(InputError, match="different shapes"):
        sum_shares([np.zeros((1, 2), dtype=np.int64), np.zeros((2, 2), dtype=np.int64)], width=8)


def test_ring_width_known_answers() -> None:
    # TissueMNIST parameters: noisy counts V + z2 + z1_s in [−1680, 1930], margins V + z1_g + z1_s − T in
    # [−2570, 2480] → 13 bits (12 before the threshold noise was split: margins [−1370, 1280]).
    assert ring_width(teachers=250, sigma1=100, sigma2=40, threshold=170) == 13
    assert ring_width(teachers=250, sigma2=40) == 11  # [−480, 730]
    assert ring_width(teachers=1, sigma2=0) == 2  # [0, 1] fits [−2, 1]
    assert ring_width(teachers=2, sigma2=0) == 3  # 2 does not fit [−2, 1]


@settings(max_examples=50, deadline=None)
@given(
    teachers=st.integers(1, 5000),
    sigma1=st.floats(0, 500),
    sigma2=st.floats(0, 500),
    threshold=st.integers(0, 5000),
)
def test_ring_width_is_the_smallest_that_holds_every_noisy_value(
    teachers: int, sigma1: float, sigma2: float, threshold: int
) -> None:
    width = ring_width(teachers=teachers, sigma1=sigma1, sigma2=sigma2, threshold=threshold)
    t1, t2 = int(np.ceil(12 * sigma1)), int(np.ceil(12 * sigma2))
    # noisy counts carry z2 and the student's z1_s; margins both parts of z1
    lo, hi = min(-t2 - t1, -threshold - 2 * t1), max(teachers + t2 + t1, teachers - threshold + 2 * t1)
    assert -(1 << (width - 1)) <= lo and hi < 1 << (width - 1)
    assert not (-(1 << (width - 2)) <= lo and hi < 1 << (width - 2)) or width == 2


def test_ring_width_and_config_refuse_nonsense() -> None:
    with pytest.raises(InputError, match="both sigma1 and threshold"):
        ring_width(teachers=10, sigma2=1, sigma1=1)
    with pytest.raises(InputError, match="teachers ≥ 1"):
        ring_width(teachers=0, sigma2=1)
    with pytest.raises(InputError, match="classes"):
        MpcConfig(1, 12, teachers=10)
    with pytest.raises(InputError, match="does not fit"):
        MpcConfig(10, 8, teachers=200)
    with pytest.raises(InputError, match="mode"):
        MpcConfig(10, 12, teachers=10, mode="loud")  # type: ignore[arg-type]


def test_config_digest_covers_every_parameter() -> None:
    base = MpcConfig(10, 12, teachers=250, student_noise=300)
    variants = [
        MpcConfig(11, 12, teachers=250, student_noise=300),
        MpcConfig(10, 13, teachers=250, student_noise=300),
        MpcConfig(10, 12, teachers=249, student_noise=300),
        MpcConfig(10, 12, teachers=250, student_noise=299),
        MpcConfig(10, 12, teachers=250, mode="gnmax"),
        MpcConfig(10, 12, teachers=250, student_noise=300, chunk_queries=7),
    ]
    assert base.digest() == MpcConfig(10, 12, teachers=250, student_noise=300).digest()
    assert len({v.digest() for v in variants} | {base.digest()}) == len(variants) + 1
    assert base.label_bits == 4 and MpcConfig(2, 4, teachers=1, mode="gnmax").label_bits == 1
