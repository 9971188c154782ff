"""The guardian's side: garbles the noisy-argmax circuit, learns only the pass bits, reveals after commit.

Mirror of ``evaluator.py``: the same circuit (``circuit.noisy_argmax``) runs on :class:`GarblerBackend`,
and every ``send`` here has the matching ``recv`` there, in the same order.

Keys and labels. Δ (least significant bit 1, for point-and-permute) is drawn once per session from
``os.urandom`` and is also the IKNP sender secret, so the student's input labels come out of OT extension
with the free-XOR offset already applied (16 bytes per student input bit). Reusing Δ across the batches of a
session is sound because a session is, for the proof, one long circuit: every wire gets a fresh label (the
guardian's inputs from a never-rewinding AES-CTR stream, the student's from fresh IKNP rows), every AND gate
a fresh tweak from the session-wide gate counter, and the evaluator never holds both labels of any wire
(only output wires are ever decoded, and only by their point-and-permute bit). A fresh Δ per batch would need
a fresh base OT per batch (≈ 40 ms and 12 KiB) for no gain in this semi-honest setting.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence

import numpy as np

from capc_common.errors import InputError, ProtocolError
from capc_common.mpc.channel import Channel
from capc_common.mpc.circuit import guardian_inputs, noisy_argmax
from capc_common.mpc.config import MpcConfig
from capc_common.mpc.party import (
    HELLO,
    HELLO_REPLY_BYTES,
    PROTOCOL_VERSION,
    SEGMENT_GATES,
    SESSION_ID_BYTES,
    BatchRejected,
    GateCounter,
    Party,
    StreamWriter,
    Tag,
    batch_id_bytes,
    chunk_bounds,
)
from capc_common.mpc.primitives import (
    KEY_BYTES,
    OT_WIDTH,
    AesCtrStream,
    BaseOtReceiver,
    FixedKeyAes,
    IknpSender,
    Workspace,
    garble_and,
    input_labels,
    label_bits,
    padded_ot_count,
)
from capc_common.mpc.reveal import Reveal, pack_bits
from capc_common.mpc.sharing import sum_seeds


class GarblerBackend:
    """:class:`CircuitBackend` on zero-labels: each ``and_`` garbles one layer and streams its tables."""

    def __init__(
        self,
        *,
        pi: FixedKeyAes,
        delta: np.ndarray,
        constant: np.ndarray,
        gates: GateCounter,
        tables: StreamWriter,
        workspace: Workspace,
    ) -> None:
        self._pi, self._delta, self._constant = pi, delta, constant
        self._gates, self._tables, self._workspace = gates, tables, workspace

    def xor(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.bitwise_xor(a, b)

    def and_(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.broadcast_arrays(a, b)
        shape = a.shape
        a0, b0 = a.reshape(-1, 2), b.reshape(-1, 2)
        parts = []
        for start in range(0, a0.shape[0], SEGMENT_GATES):
            stop = min(start + SEGMENT_GATES, a0.shape[0])
            out, table = garble_and(
                self._pi,
                a0[start:stop],
                b0[start:stop],
                delta=self._delta,
                first_gate=self._gates.take(stop - start),
                workspace=self._workspace,
            )
            self._tables.write(table)
            parts.append(out)
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(shape)

    def not_(self, a: np.ndarray) -> np.ndarray:
        return np.bitwise_xor(a, self._delta)

    def zeros_like(self, a: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self._constant, a.shape)


class GarblerSession(Party):
    """The privacy guardian's end of a 2PC session: base OT once, then any number of batches.

    Args:
        channel: link to the student's :class:`EvaluatorSession` (owned by the session from now on).
        config: parameters; must equal the evaluator's.
    """

    role = "garbler"

    def __init__(self, channel: Channel, config: MpcConfig) -> None:
        super().__init__(channel, config)
        delta = bytearray(os.urandom(KEY_BYTES))
        delta[0] |= 1  # point-and-permute: Δ's lowest bit flips every label's select bit
        self._delta_bytes = bytes(delta)
        self._delta = np.frombuffer(self._delta_bytes, dtype=np.uint64).copy()
        self._labels = AesCtrStream(os.urandom(KEY_BYTES))
        self._workspace = Workspace()
        self._pi: FixedKeyAes | None = None
        self._ot: IknpSender | None = None
        self._constant = np.zeros(2, dtype=np.uint64)

    def run_batch(
        self,
        batch_id: bytes | str,
        *,
        seeds: Sequence[bytes],
        shape: tuple[int, int],
        z2: np.ndarray,
        z1: np.ndarray | None = None,
        threshold: int | None = None,
        commit: Callable[[Reveal], None],
        before_decode: Callable[[], None] | None = None,
    ) -> np.ndarray:
        """Garble one batch; return its pass bits after ``commit`` has accepted them.

        The guardian's share A = Σ_p AES-CTR(seed_p) is expanded here; A + z2 and A + z1 − T enter the
        circuit as the guardian's inputs. ``z1`` is only the guardian's part z1_g of the threshold noise: the
        student adds its own z1_s inside the circuit, so the pass bits the guardian decodes are noisy to it.
        The evaluator's output labels of the pass wires tell the guardian which queries passed. They are all
        received first — the last only after the evaluator's stash — and only then ``before_decode()`` runs
        (the guardian makes its durable "this computation may now decode" mark there; if it raises, nothing
        was decoded), so an evaluator that cannot stash (its disk is full, it crashed) leaves no mark and
        the batch costs nothing. ``commit(reveal)`` gets the pass bits
        and the decoding bits about to be revealed; it must make the privacy charge durable (and may keep
        the reveal, to send the same bits again later) and return; only then are the decoding bits sent.
        If a hook raises, nothing is revealed, the session is closed and the exception propagates.

        Args:
            batch_id: the batch's id; the evaluator must use the same one.
            seeds: one 16-byte share seed per teacher party.
            shape: ``(B, c)``.
            z2: ``(B, c)`` integer argmax noise.
            z1: ``(B,)`` integer threshold noise z1_g, the guardian's part (Confident-GNMax; None for GNMax).
            threshold: the threshold T (Confident-GNMax; None for GNMax).
            commit: ledger hook called with the :class:`Reveal` (pass bits — all True for GNMax — and the
                decoding bits of the passed queries) before anything is revealed.
            before_decode: called once, after every pass label arrived and before the first is decoded.

        Returns:
            ``(B,)`` bool pass bits.

        Raises:
            InputError: bad local inputs (nothing was sent; the session is unchanged).
            BatchRejected: the evaluator opened a different batch id or size (the session stays usable).
            ProtocolError: the peer misbehaved, aborted or vanished (the session is closed).
        """
        self._require_open()
        raw_id = batch_id_bytes(batch_id)
        if len(shape) != 2 or shape[0] < 1 or shape[1] != self.config.classes:
            raise InputError(f"shape must be (queries ≥ 1, {self.config.classes}), got {shape}.")
        if not callable(commit):
            raise InputError("commit must be a callable taking the pass bits (the ledger hook).")
        guardian_share = sum_seeds(seeds, shape=tuple(shape), width=self.config.width)
        addends = guardian_inputs(
            self.config, guardian_share=guardian_share, z2=z2, z1=z1, threshold=threshold
        )
        self.handshake()
        try:
            first_share = self._open(raw_id, shape[0])
        except BatchRejected:
            raise
        except BaseException as exc:
            self._fail(exc)
            raise
        try:
            pass_bits, decode = self._garble(addends, first_share, before_decode)
            reveal = Reveal(pass_bits=pass_bits.copy(), decode_bits=decode[pass_bits])
            commit(reveal)
            self._reveal(reveal)
        except BaseException as exc:
            self._fail(exc)
            raise
        return pass_bits

    # -- protocol steps, mirrored in EvaluatorSession -------------------------------------------------------
    def _handshake(self) -> None:
        session_id, aes_key, constant = (os.urandom(n) for n in (SESSION_ID_BYTES, KEY_BYTES, KEY_BYTES))
        receiver = BaseOtReceiver(label_bits(self._delta_bytes), session_id=session_id)
        hello = HELLO.pack(PROTOCOL_VERSION, self.config.digest(), session_id, aes_key, constant)
        self._send(Tag.HELLO, hello + receiver.first_message())
        seeds = receiver.finish(bytes(self._recv_exact(Tag.HELLO_REPLY, HELLO_REPLY_BYTES)))
        self._pi = FixedKeyAes(aes_key)
        self._constant = np.frombuffer(constant, dtype=np.uint64).copy()
        self._ot = IknpSender(delta=self._delta_bytes, seeds=seeds)

    def _open(self, raw_id: bytes, queries: int) -> np.ndarray:
        """Read OPEN and the first chunk's OT matrix (sent back to back), then accept or reject.

        The OT matrix is consumed even for a rejected batch, so both IKNP streams stay in step and the
        session remains usable. Returns the zero-labels of the first chunk's share bits.
        """
        payload = self._recv(Tag.OPEN)
        if len(payload) < 5:
            raise ProtocolError(f"OPEN payload of {len(payload)} bytes is too short.")
        (their_queries,) = struct.unpack_from("<I", payload)
        their_id = bytes(payload[4:])
        if their_queries < 1:
            raise ProtocolError("OPEN announces a batch of 0 queries.")
        first_share = self._recv_ot(0, min(their_queries, self.config.queries_per_chunk))
        accepted = their_id == raw_id and their_queries == queries
        self._send(Tag.OPEN_REPLY, bytes([accepted]))
        if not accepted:
            raise BatchRejected(
                f"the evaluator opened batch {their_id!r} with {their_queries} queries, but this garbler was "
                f"given batch {raw_id!r} with {queries}; nothing was computed and the session remains usable."
            )
        return first_share

    def _recv_ot(self, start: int, stop: int) -> np.ndarray:
        count = self.config.width * self.config.classes * (stop - start)
        columns = padded_ot_count(count) // 8
        u = self._recv_stream(Tag.OT_MATRIX, OT_WIDTH * columns).reshape(OT_WIDTH, columns)
        assert self._ot is not None
        return self._ot.extend(u, count=count).reshape(
            self.config.width, self.config.classes, stop - start, 2
        )

    def _input_labels(self, values: np.ndarray, tables: StreamWriter) -> np.ndarray:
        """Fresh zero-labels for guardian inputs ``(n, k, c)``; their active labels go to the evaluator."""
        shape = (self.config.width, *values.shape[1:], values.shape[0])
        zero = self._labels.blocks(int(np.prod(shape))).reshape((*shape, 2))
        tables.write(input_labels(values, zero=zero, delta=self._delta))
        return zero

    def _garble(
        self, addends: np.ndarray, share: np.ndarray, before_decode: Callable[[], None] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        assert self._pi is not None
        queries = addends.shape[0]
        chunks = chunk_bounds(queries, self.config.queries_per_chunk)
        pass_bits = np.ones(queries, dtype=bool)
        decode = np.empty((queries, self.config.label_bits), dtype=bool)
        returned: list[tuple[np.ndarray | None, bytes]] = []  # pass labels, not decoded yet
        for k, (start, stop) in enumerate(chunks):
            tables = StreamWriter(self._send, Tag.GARBLED)
            guardian = self._input_labels(addends[start:stop], tables)
            backend = GarblerBackend(
                pi=self._pi,
                delta=self._delta,
                constant=self._constant,
                gates=self.gates,
                tables=tables,
                workspace=self._workspace,
            )
            label, passed = noisy_argmax(backend, share=share, addends=guardian)
            tables.close(Tag.GARBLED_END)
            decode[start:stop] = (label[..., 0] & np.uint64(1)).astype(bool).T
            if k + 1 < len(chunks):
                share = self._recv_ot(*chunks[k + 1])
            # In GNMax mode (no pass wires) the frame is empty: it only marks the point from which the garbler
            # may commit (the evaluator has stashed its select bits by then).
            size = 0 if passed is None else 16 * (stop - start)
            returned.append((passed, bytes(self._recv_exact(Tag.PASS_LABELS, size))))
        if before_decode is not None:
            before_decode()
        for (start, stop), (passed, frame) in zip(chunks, returned, strict=True):
            pass_bits[start:stop] = self._decode_pass(passed, frame, stop - start)
        return pass_bits, decode

    def _decode_pass(self, zero: np.ndarray | None, frame: bytes, n: int) -> np.ndarray:
        """Map the evaluator's pass-wire labels to bits; anything but one of the two labels is an error."""
        if zero is None:
            return np.ones(n, dtype=bool)
        returned = np.frombuffer(frame, dtype=np.uint64).reshape(n, 2)
        is_zero = (returned == zero).all(axis=1)
        is_one = (returned == (zero ^ self._delta)).all(axis=1)
        if not (is_zero | is_one).all():
            raise ProtocolError(
                f"{int((~(is_zero | is_one)).sum())} of {n} pass labels from the evaluator match neither "
                "label of their wire (corrupted garbled tables or a deviating peer)."
            )
        return is_one

    def _reveal(self, reveal: Reveal) -> None:
        """After the commit: pass bits, then decoding bits of the label outputs of passed queries only."""
        self._send_stream(Tag.DECODE, np.frombuffer(pack_bits(reveal.pass_bits), dtype=np.uint8))
        if reveal.answered:
            self._send_stream(Tag.DECODE, np.frombuffer(pack_bits(reveal.decode_bits), dtype=np.uint8))
