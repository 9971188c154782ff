"""Hazmat layer: known answers against independent single-block AES, correctness and misuse."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.errors import InputError, ProtocolError
from capc_common.mpc.primitives import (
    AesCtrStream,
    AlreadyFinalized,
    BaseOtReceiver,
    BaseOtSender,
    FixedKeyAes,
    IknpReceiver,
    IknpSender,
    eval_and,
    from_bit_planes,
    garble_and,
    input_labels,
    label_bits,
    oblivious_point,
    tccr_hash,
    to_bit_planes,
    transpose_bits,
)


def _labels(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(16 * n), dtype=np.uint64).reshape(n, 2).copy()


def _delta() -> np.ndarray:
    delta = _labels(1)[0]
    delta[0] |= np.uint64(1)
    return delta


def _aes_block(key: bytes, block: bytes) -> bytes:
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return encryptor.update(block) + encryptor.finalize()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def test_tccr_hash_is_pi_of_pi_x_xor_tweak_xor_pi_x() -> None:
    """H(x, i) = π(π(x) ⊕ i) ⊕ π(x), block by block with an independent AES, tweak little-endian."""
    key = os.urandom(16)
    blocks = _labels(33)
    tweaks = np.frombuffer(os.urandom(8 * 33), dtype=np.uint64).copy()
    got = tccr_hash(FixedKeyAes(key), blocks, tweaks)
    for x, i, h in zip(blocks, tweaks, got, strict=True):
        pi_x = _aes_block(key, x.tobytes())
        tweak = int(i).to_bytes(8, "little") + bytes(8)
        assert h.tobytes() == _xor(_aes_block(key, _xor(pi_x, tweak)), pi_x)


def test_fixed_key_permutation_and_ctr_stream_match_cryptography() -> None:
    key = os.urandom(16)
    blocks = _labels(5)
    got = FixedKeyAes(key).permute(blocks)
    assert got.tobytes() == b"".join(_aes_block(key, b.tobytes()) for b in blocks)
    stream = AesCtrStream(key)
    joined = stream.read(10).tobytes() + stream.blocks(2).tobytes() + stream.read(6).tobytes()
    reference = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(48))
    assert joined == reference


@pytest.mark.parametrize("n", [1, 5, 4096, 4097, 10000])
def test_half_gates_evaluate_to_the_and_of_the_inputs(n: int) -> None:
    pi, delta = FixedKeyAes(os.urandom(16)), _delta()
    a0, b0 = _labels(n), _labels(n)
    c0, table = garble_and(pi, a0, b0, delta=delta, first_gate=1000)
    assert table.shape == (2, n, 2)
    rng = np.random.default_rng(n)
    a_bits, b_bits = rng.integers(0, 2, n).astype(bool), rng.integers(0, 2, n).astype(bool)
    flip = lambda bits: np.where(bits[:, None], delta, np.uint64(0))  # noqa: E731
    out = eval_and(pi, a0 ^ flip(a_bits), b0 ^ flip(b_bits), table, first_gate=1000)
    np.testing.assert_array_equal(out, c0 ^ flip(a_bits & b_bits))
    wrong_tweak = eval_and(pi, a0 ^ flip(a_bits), b0 ^ flip(b_bits), table, first_gate=1001)
    assert not (wrong_tweak == out).all(axis=1).any()  # the gate index is bound into every hash


def test_input_labels_select_zero_or_one_label() -> None:
    delta = _delta()
    values = np.array([[5, 0], [3, 7]])  # (n=2 queries, c=2 classes)
    zero = _labels(3 * 2 * 2).reshape(3, 2, 2, 2)
    active = input_labels(values, zero=zero, delta=delta)
    bits = to_bit_planes(values, width=3)
    np.testing.assert_array_equal(active, zero ^ np.where(bits[..., None], delta, np.uint64(0)))


@settings(max_examples=25, deadline=None)
@given(columns=st.integers(1, 70), rows=st.sampled_from([8, 128]))
def test_transpose_matches_unpack_transpose_pack(columns: int, rows: int) -> None:
    matrix = np.frombuffer(os.urandom(rows * columns), dtype=np.uint8).reshape(rows, columns)
    reference = np.packbits(np.unpackbits(matrix, axis=1, bitorder="little").T, axis=1, bitorder="little")
    np.testing.assert_array_equal(transpose_bits(matrix), reference)


@settings(max_examples=25, deadline=None)
@given(width=st.integers(2, 62), data=st.data())
def test_bit_planes_round_trip(width: int, data: st.DataObject) -> None:
    values = np.array(data.draw(st.lists(st.integers(0, (1 << width) - 1), min_size=1, max_size=20)))
    planes = to_bit_planes(values[:, None], width=width)
    assert planes.shape == (width, 1, len(values))
    np.testing.assert_array_equal(from_bit_planes(planes)[0], values)


def _base_ot(
    choices: list[bool], session: bytes = b"s" * 16
) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    pairs = [(os.urandom(16), os.urandom(16)) for _ in choices]
    receiver = BaseOtReceiver(choices, session_id=session)
    reply = BaseOtSender(pairs, session_id=session).respond(receiver.first_message())
    return pairs, receiver.finish(reply)


def test_base_ot_delivers_exactly_the_chosen_messages() -> None:
    choices = [bool(b) for b in np.random.default_rng(1).integers(0, 2, 64)]
    pairs, got = _base_ot(choices)
    assert got == [pair[c] for pair, c in zip(pairs, choices, strict=True)]
    assert all(g != pair[not c] for g, pair, c in zip(got, pairs, choices, strict=True))


def test_base_ot_keys_are_bound_to_the_session_transcript() -> None:
    pairs = [(os.urandom(16), os.urandom(16))]
    receiver = BaseOtReceiver([True], session_id=b"a" * 16)
    reply = BaseOtSender(pairs, session_id=b"b" * 16).respond(receiver.first_message())
    assert receiver.finish(reply) != [pairs[0][1]]


def test_base_ot_public_keys_hide_the_choice() -> None:
    """Real and obliviously sampled keys are both valid compressed points with either sign."""
    receiver = BaseOtReceiver([False] * 64 + [True] * 64, session_id=bytes(16))
    message = receiver.first_message()
    keys = [message[33 * k : 33 * (k + 1)] for k in range(256)]
    assert {k[0] for k in keys[0::2]} == {2, 3} and {k[0] for k in keys[1::2]} == {2, 3}
    fake = [oblivious_point() for _ in range(64)]
    assert len(set(fake)) == 64 and {p[0] for p in fake} == {2, 3}


def test_base_ot_misuse_and_malformed_messages() -> None:
    pairs = [(os.urandom(16), os.urandom(16))]
    receiver = BaseOtReceiver([True], session_id=bytes(16))
    sender = BaseOtSender(pairs, session_id=bytes(16))
    with pytest.raises(ProtocolError, match="first message has 65 bytes"):
        BaseOtSender(pairs, session_id=bytes(16)).respond(receiver.first_message()[:-1])
    bad_point = b"\x02" + b"\xff" * 32 + receiver.first_message()[33:]
    with pytest.raises(ProtocolError, match="not a valid compressed P-256 point"):
        BaseOtSender(pairs, session_id=bytes(16)).respond(bad_point)
    reply = sender.respond(receiver.first_message())
    with pytest.raises(AlreadyFinalized):
        sender.respond(receiver.first_message())
    with pytest.raises(ProtocolError, match="reply has 10 bytes"):
        BaseOtReceiver([True], session_id=bytes(16)).finish(reply[:10])
    receiver.finish(reply)
    with pytest.raises(AlreadyFinalized):
        receiver.finish(reply)


def test_iknp_outputs_are_correlated_by_delta_and_fresh_every_time() -> None:
    delta = bytearray(os.urandom(16))
    delta[0] |= 1
    pairs, seeds = _base_ot(label_bits(bytes(delta)))
    sender, receiver = IknpSender(delta=bytes(delta), seeds=seeds), IknpReceiver(seed_pairs=pairs)
    delta_words = np.frombuffer(bytes(delta), dtype=np.uint64)
    seen: set[bytes] = set()
    for count in (1, 100, 1000):
        choices = np.random.default_rng(count).integers(0, 2, count).astype(bool)
        u, t = receiver.extend(choices)
        q = sender.extend(u, count=count)
        np.testing.assert_array_equal(t, q ^ np.where(choices[:, None], delta_words, np.uint64(0)))
        blocks = {row.tobytes() for row in q}
        assert len(blocks) == count and not blocks & seen
        seen |= blocks
    with pytest.raises(ProtocolError, match="OT extension matrix has shape"):
        sender.extend(u[:, :-1], count=1000)


def test_short_keys_are_refused() -> None:
    with pytest.raises(InputError, match="16 bytes"):
        FixedKeyAes(b"short")
    with pytest.raises(InputError, match="16 bytes"):
        AesCtrStream(b"short")
