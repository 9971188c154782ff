"""IKNP correlated-OT extension (Ishai–Kilian–Nissim–Petrank 2003), semi-honest.

After 128 base OTs in the reverse direction, every further OT costs the receiver 16 bytes (one bit per
column of a 128 × m matrix) and a few AES-CTR blocks, and the sender nothing on the wire. The sender's global
secret s is the garbler's free-XOR offset Δ, so the outputs are exactly garbled-circuit input labels: the
sender gets zero-labels q_i, the receiver gets t_i = q_i ⊕ r_i·Δ, the label of its input bit r_i
(Asharov–Lindell–Schneider–Zohner 2013 "correlated OT"; as in EMP-toolkit's semi-honest garbler).

Column generators are endless AES-CTR streams keyed by the base-OT seeds, so successive ``extend`` calls
(chunks, batches) never reuse PRG output: labels are fresh for the whole session.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from capc_common.errors import InputError, ProtocolError
from capc_common.mpc.primitives.aes import BLOCK_BYTES, AesCtrStream
from capc_common.mpc.primitives.bits import OT_WIDTH, transpose_bits


def padded_ot_count(count: int) -> int:
    """OTs are extended in multiples of 64 so the matrix packs into whole bytes and uint64 words."""
    return max(64, -(-count // 64) * 64)


def label_bits(label: bytes) -> list[bool]:
    """The 128 bits of a 16-byte label, bit ``j`` = bit ``j % 8`` of byte ``j // 8`` (the column order)."""
    if len(label) != BLOCK_BYTES:
        raise InputError(f"a label is {BLOCK_BYTES} bytes, got {len(label)}.")
    return [bool(b) for b in np.unpackbits(np.frombuffer(label, dtype=np.uint8), bitorder="little")]


def _read_columns(streams: Sequence[AesCtrStream], nbytes: int) -> np.ndarray:
    out = np.empty((len(streams), nbytes), dtype=np.uint8)
    for j, stream in enumerate(streams):
        stream.read_into(out[j])
    return out


def _rows_as_labels(columns: np.ndarray) -> np.ndarray:
    return transpose_bits(columns).view(np.uint64)


class IknpSender:
    """Extended-OT sender (the garbler): turns the receiver's matrix U into zero-labels q_i.

    Args:
        delta: the 16-byte global offset s = Δ; its bits were the base-OT choice bits.
        seeds: the 128 base-OT outputs k_j^{s_j}.
    """

    def __init__(self, *, delta: bytes, seeds: Sequence[bytes]) -> None:
        if len(seeds) != OT_WIDTH:
            raise InputError(f"IKNP needs {OT_WIDTH} base-OT seeds, got {len(seeds)}.")
        self._flip = np.array(label_bits(delta), dtype=bool)
        self._streams = [AesCtrStream(seed) for seed in seeds]

    def extend(self, u_matrix: np.ndarray, *, count: int) -> np.ndarray:
        """Zero-labels for the next ``count`` OTs.

        Args:
            u_matrix: ``(128, padded / 8)`` uint8 matrix U from the receiver.
            count: OTs wanted (the matrix covers :func:`padded_ot_count` of them).

        Returns:
            ``(count, 2)`` uint64 zero-labels q_i.
        """
        padded = padded_ot_count(count)
        if u_matrix.shape != (OT_WIDTH, padded // 8) or u_matrix.dtype != np.uint8:
            raise ProtocolError(
                f"OT extension matrix has shape {u_matrix.shape}, expected ({OT_WIDTH}, {padded // 8})."
            )
        q = _read_columns(self._streams, padded // 8)
        q[self._flip] ^= u_matrix[self._flip]
        return _rows_as_labels(q)[:count]


class IknpReceiver:
    """Extended-OT receiver (the evaluator): sends U and keeps the labels t_i of its choice bits.

    Args:
        seed_pairs: the 128 base-OT message pairs (k_j^0, k_j^1) it sent.
    """

    def __init__(self, *, seed_pairs: Sequence[tuple[bytes, bytes]]) -> None:
        if len(seed_pairs) != OT_WIDTH:
            raise InputError(f"IKNP needs {OT_WIDTH} base-OT seed pairs, got {len(seed_pairs)}.")
        self._streams0 = [AesCtrStream(k0) for k0, _ in seed_pairs]
        self._streams1 = [AesCtrStream(k1) for _, k1 in seed_pairs]

    def extend(self, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the next ``len(choices)`` OTs.

        Args:
            choices: ``(count,)`` bool choice bits r_i.

        Returns:
            ``(u_matrix, labels)``: the ``(128, padded / 8)`` uint8 matrix to send and the ``(count, 2)``
            uint64 labels t_i = q_i ⊕ r_i·Δ.
        """
        count = choices.shape[0]
        padded = padded_ot_count(count)
        r = np.zeros(padded, dtype=bool)
        r[:count] = choices
        packed = np.packbits(r, bitorder="little")
        t = _read_columns(self._streams0, padded // 8)
        u = _read_columns(self._streams1, padded // 8)
        u ^= t
        u ^= packed[None, :]
        return u, _rows_as_labels(t)[:count]
