"""The student's side: evaluates the garbled noisy-argmax circuit and decodes only answered labels.

Mirror of ``garbler.py``: the same circuit runs on :class:`EvaluatorBackend`, and every ``recv`` here
matches a ``send`` there, in the same order. The student's input bits enter by IKNP OT extension (it is the
OT receiver, so the guardian never sees its share, nor its part z1_s of the threshold noise, which is added
to the share before the OTs); it holds exactly one label per wire, learns the pass bits
and, for passed queries only, the decoding bits of the label outputs.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import numpy as np

from capc_common.errors import ProtocolError
from capc_common.mpc.channel import Channel
from capc_common.mpc.circuit import noisy_argmax, student_inputs
from capc_common.mpc.config import MpcConfig
from capc_common.mpc.party import (
    HELLO,
    HELLO_BYTES,
    PROTOCOL_VERSION,
    SEGMENT_GATES,
    BatchRejected,
    GateCounter,
    Party,
    StreamReader,
    Tag,
    batch_id_bytes,
    chunk_bounds,
)
from capc_common.mpc.primitives import (
    KEY_BYTES,
    OT_WIDTH,
    TABLE_BLOCKS_PER_AND,
    BaseOtSender,
    FixedKeyAes,
    IknpReceiver,
    Workspace,
    eval_and,
    to_bit_planes,
)
from capc_common.mpc.reveal import Reveal, decode_labels, select_bits, unpack_bits


class EvaluatorBackend:
    """:class:`CircuitBackend` on active labels: each ``and_`` reads one layer's tables and evaluates it."""

    def __init__(
        self,
        *,
        pi: FixedKeyAes,
        constant: np.ndarray,
        gates: GateCounter,
        tables: StreamReader,
        workspace: Workspace,
    ) -> None:
        self._pi, self._constant = pi, constant
        self._gates, self._tables, self._workspace = gates, tables, workspace

    def xor(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.bitwise_xor(a, b)

    def and_(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.broadcast_arrays(a, b)
        shape = a.shape
        a1, b1 = a.reshape(-1, 2), b.reshape(-1, 2)
        parts = []
        for start in range(0, a1.shape[0], SEGMENT_GATES):
            stop = min(start + SEGMENT_GATES, a1.shape[0])
            table = self._tables.read_blocks((TABLE_BLOCKS_PER_AND, stop - start))
            parts.append(
                eval_and(
                    self._pi,
                    a1[start:stop],
                    b1[start:stop],
                    table,
                    first_gate=self._gates.take(stop - start),
                    workspace=self._workspace,
                )
            )
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(shape)

    def not_(self, a: np.ndarray) -> np.ndarray:
        return a  # the garbler swapped the labels' meaning; the evaluator's label is unchanged

    def zeros_like(self, a: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self._constant, a.shape)


class EvaluatorSession(Party):
    """The student's end of a 2PC session: base OT once, then any number of batches.

    Args:
        channel: link to the guardian's :class:`GarblerSession` (owned by the session from now on).
        config: parameters; must equal the garbler's.
    """

    role = "evaluator"

    def __init__(self, channel: Channel, config: MpcConfig) -> None:
        super().__init__(channel, config)
        self._workspace = Workspace()
        self._pi: FixedKeyAes | None = None
        self._ot: IknpReceiver | None = None
        self._constant = np.zeros(2, dtype=np.uint64)

    def run_batch(
        self,
        batch_id: bytes | str,
        *,
        share_sum: np.ndarray,
        z1_student: np.ndarray | None = None,
        stash: Callable[[np.ndarray], None] | None = None,
    ) -> np.ndarray:
        """Evaluate one batch and return its labels.

        Args:
            batch_id: the batch's id; the garbler must use the same one.
            share_sum: ``(B, c)`` integer sum of the teacher parties' student shares (reduced mod 2^w here).
            z1_student: ``(B,)`` the student's part z1_s of the threshold noise, one N_Z(0, σ1²) draw per
                query from the student's own CSPRNG, |z1_s| ≤ ``config.student_noise`` (Confident-GNMax:
                required; GNMax: must be None). It enters the circuit added to the share (S + z1_s), by OT
                like the share, so the guardian never learns it; do not log or keep it.
            stash: called with the ``(B, label_bits)`` select bits of the label outputs once every chunk is
                evaluated and *before* the frame that lets the garbler commit; keep them durably there, and
                a crash after the garbler's commit loses nothing (:func:`~capc_common.mpc.decode_labels`
                turns them and the garbler's reveal, sent again, into the labels).

        Returns:
            ``(B,)`` int64 labels in [0, c), −1 for queries that failed the threshold.

        Raises:
            InputError: bad local inputs (nothing was sent; the session is unchanged).
            BatchRejected: the garbler was given a different batch id or size (the session stays usable).
            ProtocolError: the peer misbehaved, aborted or vanished (the session is closed).
        """
        self._require_open()
        raw_id = batch_id_bytes(batch_id)
        share = student_inputs(self.config, share_sum=share_sum, z1_student=z1_student)
        self.handshake()
        try:
            first_labels = self._open(raw_id, share)
        except BatchRejected:
            raise
        except BaseException as exc:
            self._fail(exc)
            raise
        try:
            outputs = self._evaluate(share, first_labels, stash)
            return self._decode(outputs)
        except BaseException as exc:
            self._fail(exc)
            raise

    # -- protocol steps, mirrored in GarblerSession ---------------------------------------------------------
    def _handshake(self) -> None:
        hello = self._recv_exact(Tag.HELLO, HELLO_BYTES)
        version, digest, session_id, aes_key, constant = HELLO.unpack_from(hello)
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"the garbler speaks protocol version {version}, this evaluator {PROTOCOL_VERSION}."
            )
        if digest != self.config.digest():
            raise ProtocolError(
                "the garbler's MpcConfig differs from ours (classes, width, mode, teachers or chunk size); "
                "both parties must be configured from the same federation parameters."
            )
        pairs = [(os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)) for _ in range(OT_WIDTH)]
        sender = BaseOtSender(pairs, session_id=session_id)
        self._send(Tag.HELLO_REPLY, sender.respond(bytes(hello[HELLO.size :])))
        self._pi = FixedKeyAes(aes_key)
        self._constant = np.frombuffer(constant, dtype=np.uint64).copy()
        self._ot = IknpReceiver(seed_pairs=pairs)

    def _open(self, raw_id: bytes, share: np.ndarray) -> np.ndarray:
        """Send OPEN and, without waiting, the first chunk's OT matrix; then read the garbler's verdict.

        Returns the labels of the first chunk's share bits.
        """
        queries = share.shape[0]
        self._send(Tag.OPEN, struct.pack("<I", queries) + raw_id)
        first_labels = self._send_ot(share[: self.config.queries_per_chunk])
        (reply,) = self._recv_exact(Tag.OPEN_REPLY, 1)
        if reply == 0:
            raise BatchRejected(
                f"the garbler rejected batch {raw_id!r} with {queries} queries: it was given a different "
                "batch id or size. Nothing was computed and the session remains usable."
            )
        if reply != 1:
            raise ProtocolError(f"OPEN_REPLY must be 0 or 1, got {reply}.")
        return first_labels

    def _send_ot(self, share: np.ndarray) -> np.ndarray:
        """Run the OTs for a chunk's share bits; return their labels, shaped like the circuit's input."""
        assert self._ot is not None
        bits = to_bit_planes(share, width=self.config.width)
        u, labels = self._ot.extend(bits.reshape(-1))
        self._send_stream(Tag.OT_MATRIX, u)
        return labels.reshape((*bits.shape, 2))

    def _evaluate(
        self, share: np.ndarray, share_labels: np.ndarray, stash: Callable[[np.ndarray], None] | None
    ) -> np.ndarray:
        assert self._pi is not None
        queries, width, classes = share.shape[0], self.config.width, self.config.classes
        addends = 2 if self.config.mode == "confident" else 1
        chunks = chunk_bounds(queries, self.config.queries_per_chunk)
        outputs = np.empty((self.config.label_bits, queries, 2), dtype=np.uint64)
        tables = StreamReader(self._recv_any, Tag.GARBLED, Tag.GARBLED_END)
        for k, (start, stop) in enumerate(chunks):
            guardian = tables.read_blocks((width, addends, classes, stop - start))
            backend = EvaluatorBackend(
                pi=self._pi,
                constant=self._constant,
                gates=self.gates,
                tables=tables,
                workspace=self._workspace,
            )
            label, passed = noisy_argmax(backend, share=share_labels, addends=guardian)
            tables.end()
            outputs[:, start:stop] = label
            if k + 1 < len(chunks):
                share_labels = self._send_ot(share[chunks[k + 1][0] : chunks[k + 1][1]])
            elif stash is not None:
                stash(select_bits(outputs))  # before the last frame: the garbler cannot commit before it
            # Empty in GNMax mode: there it only tells the garbler that it may commit.
            self._send(Tag.PASS_LABELS, b"" if passed is None else np.ascontiguousarray(passed).tobytes())
        return outputs

    def _decode(self, outputs: np.ndarray) -> np.ndarray:
        queries, bits = outputs.shape[1], self.config.label_bits
        raw = self._recv_stream(Tag.DECODE, -(-queries // 8))
        pass_bits = unpack_bits(raw, queries, what="DECODE pass bits")
        if self.config.mode == "gnmax" and not pass_bits.all():
            raise ProtocolError("the garbler reports failed queries in GNMax mode (it answers every query).")
        answered = int(pass_bits.sum())
        decode = np.zeros((0, bits), dtype=bool)
        if answered:
            raw = self._recv_stream(Tag.DECODE, -(-(answered * bits) // 8))
            decode = unpack_bits(raw, answered * bits, what="DECODE decoding bits").reshape(answered, bits)
        reveal = Reveal(pass_bits=pass_bits, decode_bits=decode)
        return decode_labels(select_bits(outputs), reveal, classes=self.config.classes)
