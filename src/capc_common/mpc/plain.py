"""The plaintext twin: the same circuit on bits, the integer reference it must match, and gate counts.

:class:`PlainBackend` runs ``circuit.py`` on numpy bools and counts gates and layers; :func:`run_plain`
pushes a batch through exactly the input encoding, circuit and output decoding the two parties use, and
:func:`reference_noisy_argmax` is the one-line integer definition everything is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capc_common.errors import InputError
from capc_common.mpc.circuit import guardian_inputs, noisy_argmax, student_inputs
from capc_common.mpc.config import MpcConfig
from capc_common.mpc.primitives.bits import from_bit_planes, to_bit_planes


class PlainBackend:
    """Evaluates circuits on plaintext bits (numpy bool arrays) and counts what garbling would cost."""

    def __init__(self) -> None:
        self.and_gates = 0
        self.xor_gates = 0
        self.not_gates = 0
        self.and_layers = 0

    def xor(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.bitwise_xor(a, b)
        self.xor_gates += out.size
        return out

    def and_(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.bitwise_and(a, b)
        self.and_gates += out.size
        self.and_layers += 1
        return out

    def not_(self, a: np.ndarray) -> np.ndarray:
        self.not_gates += a.size
        return np.logical_not(a)

    def zeros_like(self, a: np.ndarray) -> np.ndarray:
        return np.zeros(a.shape, dtype=bool)


def reference_noisy_argmax(
    votes: np.ndarray,
    *,
    z2: np.ndarray,
    z1: np.ndarray | None = None,
    z1_student: np.ndarray | None = None,
    threshold: int | None = None,
) -> np.ndarray:
    """The definition: label = argmax_j (V_j + z2_j) (ties: lowest index), −1 if max_j V_j + z1_g + z1_s < T.

    Args:
        votes: ``(B, c)`` aggregate vote counts.
        z2: ``(B, c)`` per-class noise.
        z1: ``(B,)`` the guardian's part z1_g of the threshold noise (Confident-GNMax) or None (GNMax: every
            query answered).
        z1_student: ``(B,)`` the student's part z1_s, with ``z1``.
        threshold: T, with ``z1``.

    Returns:
        ``(B,)`` int64 labels, −1 for failed queries.
    """
    votes = np.asarray(votes, dtype=np.int64)
    labels = np.argmax(votes + np.asarray(z2, dtype=np.int64), axis=1).astype(np.int64)
    if z1 is None and z1_student is None and threshold is None:
        return labels
    if z1 is None or z1_student is None or threshold is None:
        raise InputError("Confident-GNMax needs z1 (guardian), z1_student and threshold; GNMax none of them.")
    noise = np.asarray(z1, dtype=np.int64) + np.asarray(z1_student, dtype=np.int64)
    passed = votes.max(axis=1) + noise - threshold >= 0
    return np.where(passed, labels, -1)


def run_plain(
    config: MpcConfig,
    *,
    share_sum: np.ndarray,
    guardian_share: np.ndarray,
    z2: np.ndarray,
    z1: np.ndarray | None = None,
    z1_student: np.ndarray | None = None,
    threshold: int | None = None,
) -> np.ndarray:
    """Run one batch through the circuit on plaintext bits, with the parties' exact input encoding.

    Returns:
        ``(B,)`` int64 labels, −1 for failed queries, as :meth:`EvaluatorSession.run_batch` would.
    """
    addends = guardian_inputs(config, guardian_share=guardian_share, z2=z2, z1=z1, threshold=threshold)
    share = student_inputs(config, share_sum=share_sum, z1_student=z1_student)
    label_bits, passed = noisy_argmax(
        PlainBackend(),
        share=to_bit_planes(share, width=config.width),
        addends=to_bit_planes(addends, width=config.width),
    )
    labels = from_bit_planes(label_bits)
    return labels if passed is None else np.where(passed, labels, -1)


@dataclass(frozen=True)
class CircuitStats:
    """Per-query size of the circuit for a configuration.

    Attributes:
        and_gates: AND gates (two 16-byte ciphertexts each).
        xor_gates: XOR gates (free).
        not_gates: NOT gates (free).
        and_layers: AND depth: layers garbled one after the other (one AES pass pair each).
        evaluator_input_bits: student input bits (one IKNP OT each): S + z1_s, w per class.
        garbler_input_bits: guardian input bits (one 16-byte label each).
        output_bits: label bits (plus the pass bit for Confident-GNMax).
    """

    and_gates: int
    xor_gates: int
    not_gates: int
    and_layers: int
    evaluator_input_bits: int
    garbler_input_bits: int
    output_bits: int


def circuit_stats(config: MpcConfig) -> CircuitStats:
    """Count the gates of one query's circuit by running it once on the plaintext backend."""
    backend = PlainBackend()
    confident = config.mode == "confident"
    addends = np.zeros((config.width, 1 + int(confident), config.classes, 1), dtype=bool)
    noisy_argmax(backend, share=addends[:, 0], addends=addends)
    per_value = config.width * config.classes
    return CircuitStats(
        and_gates=backend.and_gates,
        xor_gates=backend.xor_gates,
        not_gates=backend.not_gates,
        and_layers=backend.and_layers,
        evaluator_input_bits=per_value,
        garbler_input_bits=per_value * (2 if confident else 1),
        output_bits=config.label_bits + int(confident),
    )
