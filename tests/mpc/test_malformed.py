"""Malformed, truncated, reordered and unexpected messages: a precise ProtocolError for the local caller, an
opaque abort for the peer, and sessions that are either still usable (batch rejected before any work) or
cleanly closed."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from mpc_harness import BatchResult, SessionPair, make_inputs, open_pair

from capc_common.errors import InputError, ProtocolError
from capc_common.mpc import BatchRejected, MpcConfig
from capc_common.mpc.party import HEADER_BYTES, Tag

STUDENT = 300
CONFIG = MpcConfig(3, 12, teachers=250, student_noise=STUDENT)
HEADER = struct.Struct("<B7xQ")


def _inputs(queries: int = 5, config: MpcConfig = CONFIG, seed: int = 0):
    rng = np.random.default_rng(seed)
    votes = rng.integers(0, 100, (queries, config.classes))
    z2 = rng.integers(-50, 50, (queries, config.classes))
    z1, z1_student = rng.integers(-50, 50, queries), rng.integers(-STUDENT, STUDENT + 1, queries)
    return make_inputs(config, votes, z2, z1, 50, z1_student=z1_student)


def _at(index: int, change):
    """Tamper with the index-th frame a party receives."""
    return lambda i, frame: change(frame) if i == index else frame


def _retag(tag: int):
    return lambda frame: bytes([tag]) + frame[1:]


def _reseq(frame: bytes) -> bytes:
    tag, seq = HEADER.unpack_from(frame)
    return HEADER.pack(tag, seq + 5) + frame[HEADER_BYTES:]


def _flip(offset: int):
    return lambda frame: frame[:offset] + bytes([frame[offset] ^ 0x10]) + frame[offset + 1 :]


def _assert_still_usable(pair: SessionPair, **kwargs: object) -> None:
    """The sessions run a real batch after the rejection and give exactly the plaintext rule's labels
    (issue 25.8: "usable" used to mean "returned something")."""
    inputs = _inputs(seed=9)
    expected = inputs.expected()
    assert (expected >= 0).any() and (expected < 0).any()  # answered and unanswered queries both checked
    np.testing.assert_array_equal(pair.run_ok(inputs, **kwargs).labels, expected)
    assert not pair.garbler.closed and not pair.evaluator.closed


def _assert_failed(pair: SessionPair, result: BatchResult, *, side: str, match: str) -> None:
    """``side`` raised ProtocolError(match); the peer saw an opaque abort; both sessions end up closed.

    A failure the evaluator detects in the last step (decoding) comes after the garbler finished its batch;
    the garbler then meets the abort at its next call.
    """
    local, peer = (
        (result.evaluator_error, result.garbler_error)
        if side == "evaluator"
        else (result.garbler_error, result.evaluator_error)
    )
    assert isinstance(local, ProtocolError), local
    assert re.search(match, str(local)), str(local)
    if peer is None and side == "evaluator":
        assert result.committed  # the garbler had completed the batch
        with pytest.raises(ProtocolError, match="peer aborted"):
            inputs = _inputs()
            pair.garbler.run_batch(
                "next",
                seeds=inputs.seeds,
                shape=(5, 3),
                z2=inputs.z2,
                z1=inputs.z1,
                threshold=50,
                commit=print,
            )
    else:
        assert isinstance(peer, ProtocolError), peer
        assert "aborted" in str(peer) or "closed" in str(peer), str(peer)
    assert pair.garbler.closed and pair.evaluator.closed
    with pytest.raises(ProtocolError, match="session is closed"):
        pair.evaluator.run_batch("again", share_sum=np.zeros((1, 3), dtype=np.int64))


@pytest.mark.parametrize(
    ("side", "index", "change", "match"),
    [
        ("evaluator", 0, lambda f: f[:100], r"HELLO payload has 84 bytes, expected 8530"),
        ("evaluator", 0, _retag(99), r"expected a HELLO frame, got unknown tag 99"),
        ("evaluator", 1, _retag(Tag.GARBLED), r"expected a OPEN_REPLY frame, got GARBLED"),
        ("evaluator", 1, lambda f: f[:5], r"truncated frame of 5 bytes"),
        ("evaluator", 2, _reseq, r"out-of-order frame: sequence number 7, expected 2"),
        ("evaluator", 3, lambda f: [], r"out-of-order frame: sequence number 4, expected 3"),
        ("evaluator", 2, lambda f: [f, f], r"out-of-order frame: sequence number 2, expected 3"),
        ("evaluator", 2, lambda f: f[:-16], r"GARBLED stream ended before the expected bytes"),
        ("evaluator", 2, lambda f: f + bytes(16), r"GARBLED stream is longer than expected \(16 bytes"),
        ("evaluator", 3, lambda f: f[:HEADER_BYTES], r"DECODE frame of 0 bytes where 1 were due"),
        ("evaluator", 3, lambda f: f[:-1] + bytes([f[-1] | 0x80]), r"padding bits after the 5 expected"),
        ("garbler", 0, lambda f: f[:-1], r"HELLO_REPLY payload has 4128 bytes, expected 4129"),
        ("garbler", 0, _flip(HEADER_BYTES + 1), r"not a valid compressed P-256 point|match neither"),
        ("garbler", 2, lambda f: f[:-8], r"OT_MATRIX frame of \d+ bytes where \d+ were due"),
        ("garbler", 3, lambda f: f[:-1], r"PASS_LABELS payload has 79 bytes, expected 80"),
        ("garbler", 3, _flip(HEADER_BYTES + 20), r"1 of 5 pass labels from the evaluator match neither"),
    ],
)
def test_tampered_frames_abort_both_sides(side: str, index: int, change, match: str) -> None:
    tap = {"tap_evaluator" if side == "evaluator" else "tap_garbler": _at(index, change)}
    pair = open_pair(CONFIG, **tap)
    _assert_failed(pair, pair.run(_inputs()), side=side, match=match)


def test_corrupted_garbled_material_is_caught_through_the_pass_labels() -> None:
    """A wrong guardian input label for a margin's low bit turns every label downstream into garbage, up to
    the pass wire of that query: the guardian sees a pass label that is neither of the two."""
    margin_bit0_class0_query0 = ((0 * 2 + 1) * 3 + 0) * 5 + 0  # input labels are laid out (w, k, c, n)
    pair = open_pair(CONFIG, tap_evaluator=_at(2, _flip(HEADER_BYTES + 16 * margin_bit0_class0_query0 + 3)))
    _assert_failed(pair, pair.run(_inputs()), side="garbler", match="1 of 5 pass labels .* match neither")


def test_multi_frame_garbled_stream_truncated_in_the_middle() -> None:
    config = MpcConfig(10, 12, teachers=250, student_noise=STUDENT)
    pair = open_pair(config, tap_evaluator=_at(3, lambda f: f[: HEADER_BYTES + 4096]))
    result = pair.run(_inputs(600, config))
    assert isinstance(result.evaluator_error or result.garbler_error, ProtocolError)
    assert pair.garbler.closed and pair.evaluator.closed


def test_mismatched_batch_is_rejected_and_both_sessions_stay_usable() -> None:
    pair = open_pair(CONFIG)
    result = pair.run(_inputs(), batch_id="batch-7", evaluator_batch_id="batch-8")
    assert isinstance(result.garbler_error, BatchRejected) and "b'batch-8'" in str(result.garbler_error)
    assert isinstance(result.evaluator_error, BatchRejected)
    assert not result.committed
    _assert_still_usable(pair, batch_id="batch-9")


@pytest.mark.parametrize(
    "garbler_config",
    [
        MpcConfig(3, 13, teachers=250, student_noise=STUDENT),
        MpcConfig(3, 12, teachers=250, student_noise=STUDENT + 1),  # the ring split differently
    ],
)
def test_different_configurations_are_refused_in_the_handshake(garbler_config: MpcConfig) -> None:
    pair = open_pair(CONFIG, garbler_config=garbler_config)
    _assert_failed(pair, pair.run(_inputs()), side="evaluator", match="MpcConfig differs")


def test_a_failing_ledger_commit_reveals_nothing() -> None:
    pair = open_pair(CONFIG)

    def commit(bits: np.ndarray) -> None:
        raise OSError("disk full")

    result = pair.run(_inputs(), commit=commit)
    assert isinstance(result.garbler_error, OSError)
    assert isinstance(result.evaluator_error, ProtocolError) and "aborted" in str(result.evaluator_error)
    assert not [f for f in pair.evaluator_channel.received if f[0] == Tag.DECODE]
    assert pair.garbler.closed and pair.evaluator.closed


def test_peer_disappearing_mid_batch_is_a_protocol_error() -> None:
    pair = open_pair(CONFIG, tap_evaluator=lambda i, f: f)
    pair.garbler.close()
    with pytest.raises(ProtocolError, match="peer closed the channel"):
        pair.evaluator.run_batch("b", share_sum=_inputs().share_sum, z1_student=np.zeros(5, np.int64))
    assert pair.evaluator.closed


def test_bad_local_inputs_send_nothing_and_leave_the_sessions_usable() -> None:
    pair = open_pair(CONFIG)
    inputs = _inputs()
    with pytest.raises(InputError, match=r"share_sum must have shape \(queries ≥ 1, 3\)"):
        pair.evaluator.run_batch(
            "b", share_sum=np.zeros((5, 4), dtype=np.int64), z1_student=inputs.z1_student
        )
    with pytest.raises(InputError, match="needs the student's threshold noise z1_student"):
        pair.evaluator.run_batch("b", share_sum=inputs.share_sum)
    with pytest.raises(InputError, match=r"z1_student must be an integer array of shape \(5,\)"):
        pair.evaluator.run_batch("b", share_sum=inputs.share_sum, z1_student=np.zeros(4, np.int64))
    with pytest.raises(InputError, match="z1_student must be an integer array"):
        pair.evaluator.run_batch("b", share_sum=inputs.share_sum, z1_student=np.zeros(5))
    too_far = inputs.z1_student.copy()
    too_far[[1, 3]] = [STUDENT + 1, -4321]
    with pytest.raises(InputError, match=r"2 of 5 values of z1_student lie outside \[−300, 300\]") as refused:
        pair.evaluator.run_batch("b", share_sum=inputs.share_sum, z1_student=too_far)
    assert "4321" not in str(refused.value) and "301" not in str(
        refused.value
    )  # secret noise is never echoed
    bad_noise = inputs.z2.copy()
    bad_noise[0, 0] = -5000
    with pytest.raises(InputError, match=r"1 of 15 values of z2 \(per-class noise\) lie outside") as refused:
        pair.garbler.run_batch(
            "b", seeds=inputs.seeds, shape=(5, 3), z2=bad_noise, z1=inputs.z1, threshold=50, commit=print
        )
    assert "5000" not in str(refused.value)  # nor the guardian's (its error may reach logs and the student)
    bad_margin = inputs.z1.copy()
    bad_margin[2] = 9999
    with pytest.raises(
        InputError, match=r"1 of 5 values of z1 − T \(threshold margin\) lie outside"
    ) as refused:
        pair.garbler.run_batch(
            "b", seeds=inputs.seeds, shape=(5, 3), z2=inputs.z2, z1=bad_margin, threshold=50, commit=print
        )
    assert "9949" not in str(refused.value) and "9999" not in str(refused.value)
    with pytest.raises(InputError, match="threshold noise z1"):
        pair.garbler.run_batch("b", seeds=inputs.seeds, shape=(5, 3), z2=inputs.z2, commit=print)
    assert not pair.garbler_channel.sent and not pair.evaluator_channel.sent
    _assert_still_usable(pair)


def test_gnmax_sessions_refuse_student_threshold_noise() -> None:
    config = MpcConfig(3, 12, teachers=250, mode="gnmax")
    pair = open_pair(config)
    inputs = make_inputs(config, np.ones((2, 3), np.int64), np.zeros((2, 3), np.int64))
    with pytest.raises(InputError, match="GNMax mode has no threshold step: pass z1_student=None"):
        pair.evaluator.run_batch("b", share_sum=inputs.share_sum, z1_student=np.zeros(2, np.int64))
    assert not pair.evaluator_channel.sent
    np.testing.assert_array_equal(pair.run_ok(inputs).labels, inputs.expected())


def test_configurations_state_the_student_bound_in_confident_mode_only() -> None:
    with pytest.raises(InputError, match=r"give it .* for Confident-GNMax and None for GNMax"):
        MpcConfig(3, 12, teachers=250)
    with pytest.raises(InputError, match=r"give it .* for Confident-GNMax and None for GNMax"):
        MpcConfig(3, 12, teachers=250, mode="gnmax", student_noise=0)
    with pytest.raises(InputError, match="must be ≥ 0 and leave room for 250 votes"):
        MpcConfig(3, 12, teachers=250, student_noise=2048 - 250)
    with pytest.raises(InputError, match="must be ≥ 0"):
        MpcConfig(3, 12, teachers=250, student_noise=-1)
    assert MpcConfig(3, 12, teachers=250, student_noise=2048 - 251).student_noise == 1797
