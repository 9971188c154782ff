"""The interface every way of running a circuit implements: plaintext, garbling, evaluating.

Circuit code (``circuit.py``) is written once against :class:`CircuitBackend` and runs three ways, as in
EMP-toolkit's ``CircuitExecution`` and swanky's ``Fancy``: :class:`~capc_common.mpc.plain.PlainBackend` on
bits, the garbler's backend on zero-labels, the evaluator's on active labels.

Wire arrays are numpy arrays whose *leading* axes are the logical shape (e.g. ``(width, classes, queries)``);
garbled backends add one trailing axis of two uint64 words per 128-bit label. Circuit code must therefore
only index, slice, stack and concatenate along explicit leading axes (never ``ndim``, negative axes or
``...``), and never modify a wire array in place.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class CircuitBackend(Protocol):
    """Gates over whole arrays of wires. Every ``and_`` call is one circuit layer (one AES pass)."""

    def xor(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a ⊕ b, elementwise with broadcasting (free: no ciphertext)."""
        ...

    def and_(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a ∧ b, elementwise with broadcasting: one garbled layer of two ciphertexts per gate."""
        ...

    def not_(self, a: np.ndarray) -> np.ndarray:
        """¬a (free)."""
        ...

    def zeros_like(self, a: np.ndarray) -> np.ndarray:
        """Public constant-0 wires with the logical shape of ``a``."""
        ...
