"""End to end: the real garbler (in a thread) against the real evaluator, every label checked against the
plaintext definition, on random (Hypothesis) and adversarial histograms."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpc_harness import BatchInputs, SessionPair, make_inputs, open_pair, room

from capc_common.mpc import MpcConfig, circuit_stats
from capc_common.mpc.primitives import padded_ot_count

TEACHERS = 250
WIDTH = 12  # ring_width(teachers=250, sigma1=25, sigma2=40, threshold=170)
HALF = 1 << (WIDTH - 1)
STUDENT = 300  # noise_bound(25): the largest |z1_s| the student enters


@pytest.fixture(scope="module")
def sessions() -> Iterator[Callable[[MpcConfig], SessionPair]]:
    """One long-lived session pair per configuration: base OT once, then many batches (as in production)."""
    pairs: dict[MpcConfig, SessionPair] = {}

    def _get(config: MpcConfig) -> SessionPair:
        if config not in pairs:
            pairs[config] = open_pair(config)
        return pairs[config]

    yield _get
    for pair in pairs.values():
        pair.garbler.close()
        pair.evaluator.close()


def _check(pair: SessionPair, inputs: BatchInputs) -> np.ndarray:
    result = pair.run_ok(inputs)
    expected = inputs.expected()
    np.testing.assert_array_equal(result.labels, expected)
    np.testing.assert_array_equal(result.pass_bits, expected >= 0)
    assert len(result.committed) == 1
    np.testing.assert_array_equal(result.committed[0], expected >= 0)
    return expected


@st.composite
def _histograms(draw: st.DrawFn) -> tuple[MpcConfig, BatchInputs]:
    classes = draw(st.sampled_from([2, 3, 7, 10]))
    mode = draw(st.sampled_from(["confident", "gnmax"]))
    chunk = draw(st.sampled_from([None, 3]))
    student = STUDENT if mode == "confident" else None
    config = MpcConfig(
        classes, WIDTH, teachers=TEACHERS, mode=mode, student_noise=student, chunk_queries=chunk
    )
    lo, hi = room(config)
    n = draw(st.integers(1, 12))
    counts = st.one_of(st.integers(0, TEACHERS), st.sampled_from([0, TEACHERS]))
    votes = np.array(
        draw(st.lists(st.lists(counts, min_size=classes, max_size=classes), min_size=n, max_size=n))
    )
    noise = st.one_of(st.integers(-300, 300), st.sampled_from([lo, hi, 0]))
    z2 = np.array(draw(st.lists(st.lists(noise, min_size=classes, max_size=classes), min_size=n, max_size=n)))
    if mode == "gnmax":
        return config, make_inputs(config, votes, z2)
    threshold = draw(st.integers(0, 2 * TEACHERS))
    z1 = draw(st.lists(st.integers(lo + threshold, hi + threshold), min_size=n, max_size=n))
    own = st.one_of(st.integers(-STUDENT, STUDENT), st.sampled_from([-STUDENT, STUDENT, 0]))
    z1_student = np.array(draw(st.lists(own, min_size=n, max_size=n)))
    parties = draw(st.integers(1, 3))
    return config, make_inputs(
        config, votes, z2, np.array(z1), threshold, z1_student=z1_student, parties=parties
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_histograms())
def test_random_histograms_match_plaintext(sessions, case: tuple[MpcConfig, BatchInputs]) -> None:
    config, inputs = case
    _check(sessions(config), inputs)


def test_ties_and_all_equal_go_to_the_lowest_index(sessions) -> None:
    config = MpcConfig(10, WIDTH, teachers=TEACHERS, student_noise=STUDENT)
    votes = np.array([[25] * 10, [0] * 10, [TEACHERS] + [0] * 9, [3, 9, 9, 1, 9, 0, 0, 0, 0, 9]])
    z2 = np.zeros_like(votes)
    z2[3] = [0, 0, 0, 8, 0, 0, 0, 0, 0, 0]  # 9 + 0 ties with 1 + 8 at index 3: index 1 still wins
    expected = _check(sessions(config), make_inputs(config, votes, z2, np.array([200, -50, 200, 200]), 20))
    np.testing.assert_array_equal(expected, [0, -1, 0, 1])


def test_maximum_at_every_position_and_every_tie_pattern(sessions) -> None:
    config = MpcConfig(10, WIDTH, teachers=TEACHERS, student_noise=STUDENT)
    rows = []
    for top in range(10):
        for tie in range(10):  # the maximum at `top`, a tie partner at `tie`
            row = np.full(10, 5)
            row[top] = row[tie] = 40
            rows.append(row)
    votes = np.array(rows)
    expected = _check(sessions(config), make_inputs(config, votes, np.zeros_like(votes), np.zeros(100), 30))
    np.testing.assert_array_equal(expected, [min(t, u) for t in range(10) for u in range(10)])


def test_ring_bounds_negative_counts_and_threshold_edges(sessions) -> None:
    """Both parties' noise at their bounds: noisy counts and margins reach −2^{w−1} and 2^{w−1} − 1."""
    config = MpcConfig(3, WIDTH, teachers=TEACHERS, student_noise=STUDENT)
    lo, hi = room(config)
    assert (lo - STUDENT, TEACHERS + hi + STUDENT) == (-HALF, HALF - 1)
    votes = np.array([[0, 0, 0], [TEACHERS] * 3, [0, 1, 0], [100, 0, 0], [100, 0, 0], [0, 0, 0]])
    votes = np.concatenate([votes, [[100, 0, 0]] * 4])
    z2 = np.array(
        [
            [lo, lo + 1, lo],  # with z1_s = −bound: the most negative noisy counts the ring holds
            [hi, 0, hi],  # with z1_s = +bound: the most positive, ties at 2^{w−1} − 1
            [-5, -300, -7],  # all noisy counts negative
            [0, 0, 0],
            [0, 0, 0],
            [lo, lo, lo],
            [lo, hi, 0],  # z1_s = +bound shifts every count alike: the argmax stays put
            [hi, lo, 0],
            [0, 0, 0],
            [0, 0, 0],
        ]
    )
    threshold = 100
    z1 = np.array([hi, hi, lo, -100, -100, lo, 0, hi, -93, -108]) + threshold
    z1_student = np.array([-STUDENT, STUDENT, -STUDENT, 0, -1, -STUDENT, STUDENT, -STUDENT, -7, 7])
    inputs = make_inputs(config, votes, z2, z1, threshold, z1_student=z1_student)
    expected = _check(sessions(config), inputs)
    # margins: row 1 is 2^{w−1} − 1, row 5 is −2^{w−1}; rows 3, 8: 0 passes; rows 4, 9: −1 fails
    np.testing.assert_array_equal(expected, [1, 0, -1, 0, -1, -1, 1, 0, 0, -1])


def test_the_pass_bit_takes_both_parts_of_the_threshold_noise(sessions) -> None:
    """pass = [max V + z1_g + z1_s ≥ T]: either part alone can make or break it."""
    config = MpcConfig(4, WIDTH, teachers=TEACHERS, student_noise=STUDENT)
    votes = np.tile([50, 10, 0, 0], (6, 1))  # max 50, T = 60: needs z1_g + z1_s ≥ 10
    z1 = np.array([10, 10, 0, 0, 250, -250])
    z1_student = np.array([0, -1, 10, 9, -240, 260])
    expected = _check(
        sessions(config), make_inputs(config, votes, np.zeros_like(votes), z1, 60, z1_student=z1_student)
    )
    np.testing.assert_array_equal(expected, [0, -1, 0, -1, 0, 0])


@pytest.mark.parametrize(
    ("classes", "queries", "chunk"),
    [(2, 1, None), (2, 8192, None), (100, 512, None), (10, 300, 64), (3, 1000, 333)],
)
def test_sizes_and_chunking(sessions, classes: int, queries: int, chunk: int | None) -> None:
    """Includes c = 100 with B = 512, whose widest AND layer (307,200 gates) is garbled in three segments."""
    config = MpcConfig(classes, WIDTH, teachers=TEACHERS, student_noise=STUDENT, chunk_queries=chunk)
    rng = np.random.default_rng(classes * queries)
    votes = rng.multinomial(
        TEACHERS, rng.dirichlet(np.full(classes, 0.3), size=queries).mean(axis=0), size=queries
    )
    z2 = rng.integers(-480, 480, (queries, classes))
    z1, z1_student = rng.integers(-1200, 1200, queries), rng.integers(-STUDENT, STUDENT + 1, queries)
    expected = _check(sessions(config), make_inputs(config, votes, z2, z1, 170, z1_student=z1_student))
    assert 0 < (expected >= 0).sum() < queries or queries == 1


def test_each_student_input_bit_costs_16_bytes_of_ot(sessions) -> None:
    config = MpcConfig(10, WIDTH, teachers=TEACHERS, student_noise=STUDENT, chunk_queries=100)
    pair = sessions(config)
    rng = np.random.default_rng(3)
    before = len(pair.garbler_channel.received)
    _check(pair, make_inputs(config, rng.integers(0, 30, (300, 10)), np.zeros((300, 10)), np.zeros(300), 9))
    ot_bytes = sum(len(f) - 16 for f in pair.garbler_channel.received[before:] if f[0] == 5)  # OT_MATRIX
    # three chunks of 100 queries × 120 share bits, each chunk's OT count rounded up to a multiple of 64
    assert ot_bytes == 3 * 16 * padded_ot_count(WIDTH * 10 * 100) == 3 * 16 * 12032


def test_many_batches_share_one_session_and_count_every_gate() -> None:
    config = MpcConfig(5, WIDTH, teachers=TEACHERS, mode="gnmax")
    pair = open_pair(config)
    rng = np.random.default_rng(7)
    try:
        for size in (1, 17, 64):
            votes = rng.integers(0, 50, (size, 5))
            _check(pair, make_inputs(config, votes, rng.integers(-100, 100, (size, 5))))
        ands = (1 + 17 + 64) * circuit_stats(config).and_gates
        assert pair.garbler.gates.next_gate == pair.evaluator.gates.next_gate == ands
        assert pair.garbler_channel.bytes_received == pair.evaluator_channel.bytes_sent
    finally:
        pair.garbler.close()
        pair.evaluator.close()
