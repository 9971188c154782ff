"""The circuit builder on the plaintext twin, against integer arithmetic (Hypothesis)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.mpc import (
    MpcConfig,
    PlainBackend,
    circuit_stats,
    noise_bound,
    reference_noisy_argmax,
    ring_width,
    run_plain,
)
from capc_common.mpc.circuit import (
    add,
    all_of,
    any_nonnegative,
    less_than,
    mask,
    mux,
    subtract,
    tournament,
)
from capc_common.mpc.primitives import from_bit_planes, to_bit_planes


def _signed(values: np.ndarray, width: int) -> np.ndarray:
    half = 1 << (width - 1)
    return (values + half) % (1 << width) - half


def _planes(values: np.ndarray, width: int) -> np.ndarray:
    """(count,) or (count, c) integers → bit planes (width, [c,] count)."""
    values = np.asarray(values)
    planes = to_bit_planes((values if values.ndim > 1 else values[:, None]) % (1 << width), width=width)
    return planes if values.ndim > 1 else planes[:, 0]


@st.composite
def _operands(draw: st.DrawFn, count: int = 2) -> tuple[int, list[np.ndarray]]:
    width = draw(st.integers(2, 16))
    n = draw(st.integers(1, 30))
    edge = st.sampled_from([0, 1, (1 << (width - 1)) - 1, 1 << (width - 1), (1 << width) - 1])
    values = st.one_of(st.integers(0, (1 << width) - 1), edge)
    return width, [np.array(draw(st.lists(values, min_size=n, max_size=n))) for _ in range(count)]


@settings(max_examples=60, deadline=None)
@given(_operands())
def test_adder_and_subtractor_wrap_mod_2_to_the_w(operands: tuple[int, list[np.ndarray]]) -> None:
    width, (x, y) = operands
    b = PlainBackend()
    np.testing.assert_array_equal(
        from_bit_planes(add(b, _planes(x, width), _planes(y, width))), (x + y) % (1 << width)
    )
    np.testing.assert_array_equal(
        from_bit_planes(subtract(b, _planes(x, width), _planes(y, width))), (x - y) % (1 << width)
    )
    assert b.and_gates == 2 * (width - 1) * len(x)


@settings(max_examples=60, deadline=None)
@given(_operands(), st.booleans())
def test_comparison_signed_and_unsigned(operands: tuple[int, list[np.ndarray]], signed: bool) -> None:
    width, (x, y) = operands
    b = PlainBackend()
    got = less_than(b, _planes(x, width), _planes(y, width), signed=signed)
    xs, ys = (_signed(x, width), _signed(y, width)) if signed else (x, y)
    np.testing.assert_array_equal(got, xs < ys)
    assert b.and_gates == width * len(x) and b.not_gates == 0


@settings(max_examples=40, deadline=None)
@given(_operands(3))
def test_mux_mask_and_threshold_test(operands: tuple[int, list[np.ndarray]]) -> None:
    width, (x, y, s) = operands
    b = PlainBackend()
    sel = (s & 1).astype(bool)
    np.testing.assert_array_equal(
        from_bit_planes(mux(b, sel, _planes(x, width), _planes(y, width))), np.where(sel, y, x)
    )
    np.testing.assert_array_equal(from_bit_planes(mask(b, _planes(x, width), sel)), np.where(sel, x, 0))
    np.testing.assert_array_equal(all_of(b, _planes(x, width)), x % (1 << width) == (1 << width) - 1)
    margins = np.stack([x, y, s], axis=1)  # (n, 3): is any of the three signed values ≥ 0?
    np.testing.assert_array_equal(
        any_nonnegative(b, _planes(margins, width)), (_signed(margins, width) >= 0).any(axis=1)
    )


@settings(max_examples=80, deadline=None)
@given(
    width=st.integers(3, 12),
    classes=st.integers(2, 23),
    n=st.integers(1, 12),
    ties=st.booleans(),
    data=st.data(),
)
def test_tournament_argmax_and_max_break_ties_low(
    width: int, classes: int, n: int, ties: bool, data: st.DataObject
) -> None:
    half = 1 << (width - 1)
    pool = st.integers(-2, 1) if ties else st.integers(-half, half - 1)
    values = np.array(
        data.draw(st.lists(st.lists(pool, min_size=classes, max_size=classes), min_size=n, max_size=n))
    )
    index, maximum = tournament(PlainBackend(), _planes(values, width), signed=True, want_max=True)
    np.testing.assert_array_equal(from_bit_planes(index), np.argmax(values, axis=1))
    assert maximum is not None
    np.testing.assert_array_equal(_signed(from_bit_planes(maximum), width), values.max(axis=1))


@st.composite
def _batch(draw: st.DrawFn) -> dict:
    classes = draw(st.sampled_from([2, 3, 5, 10, 17]))
    teachers = draw(st.integers(1, 60))
    width = draw(st.integers((teachers + 1).bit_length() + 2, 14))
    half = 1 << (width - 1)
    student = draw(st.integers(0, (half - 1 - teachers) // 2))  # the student's bound on |z1_s|
    lo, hi = -half + student, half - 1 - teachers - student  # where the guardian's noise must lie
    n = draw(st.integers(1, 16))
    edge = st.sampled_from([-student, student, 0])
    pairs = st.lists(st.integers(0, teachers), min_size=classes, max_size=classes)
    votes = np.array(draw(st.lists(pairs, min_size=n, max_size=n)))
    noise2 = st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi]))
    z2 = np.array(
        draw(st.lists(st.lists(noise2, min_size=classes, max_size=classes), min_size=n, max_size=n))
    )
    threshold = draw(st.integers(0, teachers + 5))
    noise1 = st.one_of(
        st.integers(lo + threshold, hi + threshold), st.sampled_from([lo + threshold, hi + threshold])
    )
    z1 = np.array(draw(st.lists(noise1, min_size=n, max_size=n)))
    own = st.one_of(st.integers(-student, student), edge)
    return {
        "config": MpcConfig(classes, width, teachers=teachers, student_noise=student),
        "votes": votes,
        "z2": z2,
        "z1": z1,
        "z1_student": np.array(draw(st.lists(own, min_size=n, max_size=n))),
        "threshold": threshold,
    }


def _plain(config: MpcConfig, votes: np.ndarray, **noise: Any) -> np.ndarray:
    """Labels of the plaintext circuit with the parties' exact input encoding (random additive shares)."""
    guardian = np.random.default_rng(0).integers(0, 1 << config.width, votes.shape)
    student = (votes - guardian) % (1 << config.width)
    return run_plain(config, share_sum=student, guardian_share=guardian, **noise)


@settings(max_examples=80, deadline=None)
@given(_batch())
def test_plain_circuit_equals_the_definition(batch: dict) -> None:
    config, votes = batch["config"], batch.pop("votes")
    noise = {k: batch[k] for k in ("z2", "z1", "z1_student", "threshold")}
    np.testing.assert_array_equal(_plain(config, votes, **noise), reference_noisy_argmax(votes, **noise))


@settings(max_examples=60, deadline=None)
@given(
    teachers=st.integers(1, 3000),
    sigma1=st.floats(0.5, 300),
    sigma2=st.floats(0.5, 300),
    threshold=st.integers(0, 3000),
)
def test_the_ring_width_holds_both_parties_noise_at_their_bounds(
    teachers: int, sigma1: float, sigma2: float, threshold: int
) -> None:
    """With ring_width and noise_bound, every noise either party may enter (±12σ each) is accepted and no
    noisy count or margin wraps: the extreme votes and noises give the integer definition's labels."""
    width = ring_width(teachers=teachers, sigma1=sigma1, sigma2=sigma2, threshold=threshold)
    n1, n2 = noise_bound(sigma1), noise_bound(sigma2)
    config = MpcConfig(3, width, teachers=teachers, student_noise=n1)
    rows = []  # (votes, z2, z1_g, z1_s): every corner of the noise box, with no votes and all votes
    for v in (0, teachers):
        for s2 in (-n2, n2):
            for s1 in (-n1, n1):
                for s_s in (-n1, n1):
                    rows.append(([v, v // 2, 0], [s2, -s2, 0], s1, s_s))
                    rows.append(([0, v, v], [0, s2, s2], s1, s_s))
    votes = np.array([r[0] for r in rows])
    noise = {
        "z2": np.array([r[1] for r in rows]),
        "z1": np.array([r[2] for r in rows]),
        "z1_student": np.array([r[3] for r in rows]),
        "threshold": threshold,
    }
    np.testing.assert_array_equal(_plain(config, votes, **noise), reference_noisy_argmax(votes, **noise))


def test_gate_counts_per_query() -> None:
    """AND gates: c(w−1) adders (+ c(w−1) margins and c−1 ANDs), (c−1)w comparisons, muxes, log c masks."""
    gnmax = circuit_stats(MpcConfig(10, 12, teachers=250, mode="gnmax"))
    confident = circuit_stats(MpcConfig(10, 12, teachers=250, student_noise=300))
    assert confident.and_gates - gnmax.and_gates == 10 * 11 + 9 + 4
    assert confident.evaluator_input_bits == 120 and confident.garbler_input_bits == 240
    assert (gnmax.and_gates, confident.and_gates) == (321, 444)
    assert confident.not_gates == 1 and gnmax.not_gates == 0  # comparisons and the threshold test need no NOT
    assert circuit_stats(MpcConfig(100, 12, teachers=250, student_noise=300)).and_gates == 4765
    # The student's threshold noise rides on its share (S + z1_s): it costs no gate and no input bit;
    # only a wider ring (TissueMNIST: 13 bits instead of 12) costs more.
    assert circuit_stats(MpcConfig(10, 12, teachers=250, student_noise=0)) == confident
    assert circuit_stats(MpcConfig(10, 13, teachers=250, student_noise=1200)).and_gates == 481
    assert circuit_stats(MpcConfig(100, 13, teachers=250, student_noise=1200)).and_gates == 5162
