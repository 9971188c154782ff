"""The commit point and what survives it: the evaluator's stash before the garbler's mark, the mark before it
decodes anything, and labels rebuilt from the stash and the reveal sent again."""

from __future__ import annotations

import numpy as np
import pytest
from mpc_harness import make_inputs, open_pair

from capc_common.errors import ProtocolError
from capc_common.mpc import MpcConfig, Reveal, decode_labels, pack_bits, unpack_bits
from capc_common.mpc.party import HEADER_BYTES, Tag

STUDENT = 300


def _config(mode: str = "confident", chunk: int | None = 16) -> MpcConfig:
    if mode == "gnmax":
        return MpcConfig(4, 12, teachers=250, mode="gnmax", chunk_queries=chunk)
    return MpcConfig(4, 12, teachers=250, student_noise=STUDENT, chunk_queries=chunk)


def _inputs(config: MpcConfig, queries: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    votes = rng.multinomial(250, [0.4, 0.3, 0.2, 0.1], size=queries)
    z2 = rng.integers(-50, 50, (queries, config.classes))
    if config.mode == "gnmax":
        return make_inputs(config, votes, z2)
    z1, z1s = rng.integers(-60, 60, queries), rng.integers(-STUDENT, STUDENT + 1, queries)
    return make_inputs(config, votes, z2, z1, 90, z1_student=z1s)


@pytest.mark.parametrize(("mode", "queries"), [("confident", 50), ("confident", 7), ("gnmax", 40)])
def test_the_stash_precedes_the_mark_and_the_mark_every_decode(mode: str, queries: int) -> None:
    config = _config(mode)
    pair = open_pair(config)
    events: list[tuple[str, int]] = []

    def pass_frames_read() -> int:
        return sum(1 for f in pair.garbler_channel.received if f[0] == Tag.PASS_LABELS)

    def mark() -> None:
        events.append(("mark", pass_frames_read()))

    def stash(select: np.ndarray) -> None:
        events.append(("stash", pass_frames_read()))
        stashed.append(select.copy())

    stashed: list[np.ndarray] = []
    inputs = _inputs(config, queries)
    result = pair.run(inputs, before_decode=mark, stash=stash, commit=lambda _: events.append(("commit", -1)))
    assert result.garbler_error is None and result.evaluator_error is None
    np.testing.assert_array_equal(result.labels, inputs.expected())
    chunks = -(-queries // 16)
    # The stash comes before the evaluator's last pass-label frame; the garbler marks once, after it read
    # every one (so after the stash) and before it decodes any; then it commits.
    assert [e[0] for e in events] == ["stash", "mark", "commit"]
    assert events[0][1] <= chunks - 1 and events[1][1] == chunks
    assert pass_frames_read() == chunks
    # The stash and the reveal, kept apart and brought back together, give exactly the labels.
    reveal = Reveal.from_bytes(result.reveals[0].to_bytes(), queries=queries, label_bits=config.label_bits)
    assert stashed[0].shape == (queries, config.label_bits)
    np.testing.assert_array_equal(decode_labels(stashed[0], reveal, classes=config.classes), result.labels)


def test_a_refused_mark_decodes_nothing_and_reveals_nothing() -> None:
    config = _config(chunk=8)
    pair = open_pair(config)

    def mark() -> None:
        raise OSError("ledger refused: another computation began on this batch")

    result = pair.run(_inputs(config, 24), before_decode=mark)
    assert isinstance(result.garbler_error, OSError)
    assert isinstance(result.evaluator_error, ProtocolError)
    assert not [f for f in pair.evaluator_channel.received if f[0] == Tag.DECODE]
    assert not result.committed


def test_an_evaluator_that_cannot_stash_leaves_no_mark() -> None:
    """A multi-chunk batch whose evaluator fails to stash (its volume is full) after the garbler read some
    pass labels: no mark, so the guardian releases the batch instead of holding it at its worst case."""
    config = _config(chunk=8)
    pair = open_pair(config)
    marks: list[int] = []

    def full(select: np.ndarray) -> None:
        raise OSError(28, "No space left on device")

    result = pair.run(_inputs(config, 24), before_decode=lambda: marks.append(1), stash=full)
    assert isinstance(result.evaluator_error, OSError)
    assert [f for f in pair.garbler_channel.received if f[0] == Tag.PASS_LABELS]  # chunks 1 and 2 arrived
    assert marks == [] and not result.committed


def test_labels_survive_an_evaluator_that_dies_after_the_commit() -> None:
    # The student crashes between the guardian's settle and storing its labels: the DECODE frames never reach
    # it. What it stashed plus the reveal the guardian kept with its charge give the labels back.
    config = _config(chunk=16)
    lost = lambda i, f: bytes([Tag.ABORT]) + f[1:HEADER_BYTES] if f[0] == Tag.DECODE else f  # noqa: E731
    pair = open_pair(config, tap_evaluator=lost)
    stashed: list[np.ndarray] = []
    inputs = _inputs(config, 40, seed=3)
    result = pair.run(inputs, stash=lambda s: stashed.append(s.copy()))
    assert result.labels is None and result.garbler_error is None  # the garbler committed and revealed
    kept = result.reveals[0].to_bytes()
    again = Reveal.from_bytes(kept, queries=40, label_bits=config.label_bits)
    np.testing.assert_array_equal(decode_labels(stashed[0], again, classes=config.classes), inputs.expected())


def test_reveal_bytes_are_checked() -> None:
    bits = np.array([True, False, True])
    assert unpack_bits(pack_bits(bits), 3, what="x").tolist() == bits.tolist()
    with pytest.raises(ProtocolError, match="padding bits"):
        unpack_bits(b"\xff", 3, what="x")
    with pytest.raises(ProtocolError, match="2 bytes where 1"):
        unpack_bits(b"\x01\x00", 3, what="x")
    reveal = Reveal(pass_bits=bits, decode_bits=np.ones((2, 2), dtype=bool))
    assert reveal.answered == 2
    with pytest.raises(ProtocolError, match="decoding bits"):
        Reveal.from_bytes(reveal.to_bytes() + b"\0", queries=3, label_bits=2)
    with pytest.raises(ProtocolError, match="does not fit"):
        decode_labels(np.zeros((4, 2), dtype=bool), reveal, classes=4)
    with pytest.raises(ProtocolError, match="outside"):
        decode_labels(np.zeros((3, 2), dtype=bool), reveal, classes=3)  # 0b11 = 3 is not a class of 3
