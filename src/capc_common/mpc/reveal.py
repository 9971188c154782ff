"""What the garbler reveals after the commit, and how the evaluator turns it into labels.

The garbler's ``DECODE`` frames carry the pass bits and, for passed queries only, the decoding bits (the
point-and-permute bits of the zero-labels) of the label output wires. The evaluator holds one label per
output wire; its *select bit* (that label's point-and-permute bit) XOR the decoding bit is the label bit.

Both halves can be kept durably, so that a batch that was paid for is never lost to a crash: the evaluator
hands its select bits to a ``stash`` hook before it sends the frame that lets the garbler commit, and the
garbler hands the :class:`Reveal` to its ``commit`` hook, which stores it with the ledger charge. Sending the
same reveal again to the same evaluator tells it nothing it was not already sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capc_common.errors import ProtocolError
from capc_common.mpc.primitives import from_bit_planes


def pack_bits(bits: np.ndarray) -> bytes:
    """Bits (any shape, row-major) as bytes, least significant bit first, zero-padded to whole bytes."""
    return np.packbits(np.asarray(bits, dtype=bool).reshape(-1), bitorder="little").tobytes()


def unpack_bits(data: bytes | np.ndarray, count: int, *, what: str) -> np.ndarray:
    """The first ``count`` bits of ``data`` (as written by :func:`pack_bits`), checking length and padding.

    Raises:
        ProtocolError: ``data`` is not exactly ``ceil(count / 8)`` bytes or its padding bits are not zero.
    """
    raw = np.frombuffer(bytes(data), dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if raw.size != -(-count // 8):
        raise ProtocolError(f"{what}: {raw.size} bytes where {-(-count // 8)} hold {count} bits.")
    bits = np.unpackbits(raw, bitorder="little")
    if bits[count:].any():
        raise ProtocolError(f"{what}: padding bits after the {count} expected bits are not zero.")
    return bits[:count].astype(bool)


@dataclass(frozen=True)
class Reveal:
    """The garbler's output of one batch: ``(B,)`` pass bits and ``(answered, label_bits)`` decoding bits.

    Attributes:
        pass_bits: which queries passed the threshold (all True in GNMax mode).
        decode_bits: the label wires' decoding bits of the passed queries, in query order.
    """

    pass_bits: np.ndarray
    decode_bits: np.ndarray

    @property
    def answered(self) -> int:
        """How many queries passed."""
        return int(np.count_nonzero(self.pass_bits))

    def to_bytes(self) -> bytes:
        """Pass bits, then decoding bits, each packed by :func:`pack_bits` (what the DECODE frames carry)."""
        return pack_bits(self.pass_bits) + pack_bits(self.decode_bits)

    @classmethod
    def from_bytes(cls, data: bytes, *, queries: int, label_bits: int) -> Reveal:
        """Parse :meth:`to_bytes` of a batch of ``queries`` queries.

        Raises:
            ProtocolError: the lengths or the padding do not fit a batch of that size.
        """
        head = -(-queries // 8)
        pass_bits = unpack_bits(data[:head], queries, what="pass bits")
        answered = int(pass_bits.sum())
        decode = unpack_bits(data[head:], answered * label_bits, what="decoding bits")
        return cls(pass_bits=pass_bits, decode_bits=decode.reshape(answered, label_bits))


def select_bits(outputs: np.ndarray) -> np.ndarray:
    """The evaluator's select bits of its ``(label_bits, B, 2)`` output labels, ``(B, label_bits)`` bool."""
    return (outputs[..., 0] & np.uint64(1)).astype(bool).T.copy()


def decode_labels(select: np.ndarray, reveal: Reveal, *, classes: int) -> np.ndarray:
    """Labels from the evaluator's select bits and the garbler's reveal.

    Args:
        select: ``(B, label_bits)`` select bits of the label outputs (:func:`select_bits`).
        reveal: the garbler's reveal of the same computation.
        classes: the number of classes c.

    Returns:
        ``(B,)`` int64 labels in [0, c), −1 for queries that did not pass.

    Raises:
        ProtocolError: the shapes disagree or a decoded label is not a class (corrupted bits).
    """
    queries, bits = select.shape
    if reveal.pass_bits.shape != (queries,) or reveal.decode_bits.shape != (reveal.answered, bits):
        raise ProtocolError(
            f"a reveal of {reveal.pass_bits.shape[0]} queries with decoding bits "
            f"{reveal.decode_bits.shape} does not fit {queries} queries of {bits} label bits."
        )
    labels = np.full(queries, -1, dtype=np.int64)
    if reveal.answered:
        values = from_bit_planes((select[reveal.pass_bits] ^ reveal.decode_bits).T)
        if values.max() >= classes:
            raise ProtocolError(
                f"decoded label {int(values.max())} is outside [0, {classes}): corrupted decoding bits or "
                "garbled tables."
            )
        labels[reveal.pass_bits] = values
    return labels
