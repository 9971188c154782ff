"""Half-gates AND garbling with the tweakable circular-correlation-robust hash from fixed-key AES.

Pure kernels over whole circuit layers: ``n`` AND gates are garbled or evaluated by one call, with two
fixed-key AES passes over every block of the layer (the TCCR hash needs π twice) and numpy XORs on uint64
views. Nothing here sends bytes or chooses keys; the garbler and evaluator classes do that.

References:
    Zahur, Rosulek, Evans. "Two halves make a whole", EUROCRYPT 2015 (eprint 2014/756): two ciphertexts per
    AND gate, compatible with free-XOR (Kolesnikov–Schneider 2008) and point-and-permute.
    Guo, Katz, Wang, Yu. "Efficient and secure multiparty computation from fixed-key block ciphers",
    IEEE S&P 2020 (eprint 2019/074), §7: H(x, i) = π(π(x) ⊕ i) ⊕ π(x) is a tweakable circular
    correlation-robust hash. The cheaper π(σ(x) ⊕ i) ⊕ σ(x) with a linear orthomorphism σ is *not* TCCR
    for tweaks chosen like ours, so it is deliberately not used.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from capc_common.errors import InputError
from capc_common.mpc.primitives._njit import njit
from capc_common.mpc.primitives.aes import FixedKeyAes

TABLE_BLOCKS_PER_AND = 2
"""Ciphertexts (16-byte blocks) the garbler sends per AND gate."""

_MAX_GATE = 1 << 62


class Workspace:
    """Grow-only scratch buffers, so each layer's AES calls write into memory allocated once."""

    __slots__ = ("_buffers",)

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def blocks(self, name: str, n: int) -> np.ndarray:
        """A ``(n + 1, 2)`` uint64 buffer (one spare row for OpenSSL), reused across calls."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < n + 1:
            buf = np.empty((max(n + 1, 2 * (0 if buf is None else buf.shape[0])), 2), dtype=np.uint64)
            self._buffers[name] = buf
        return buf[: n + 1]


@njit(cache=True, nogil=True)
def _xor_tweaks(y: np.ndarray, tweaks: np.ndarray, z: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(tweaks.shape[0]):
        z[i, 0] = y[i, 0] ^ tweaks[i]
        z[i, 1] = y[i, 1]


@njit(cache=True, nogil=True)
def _xor_gate_tweaks(
    y: np.ndarray, first_gate: np.uint64, halves: np.ndarray, z: np.ndarray
) -> None:  # pragma: no cover
    # Block i of group k belongs to gate first_gate + i and gets tweak 2·gate + halves[k].
    n = y.shape[0] // halves.shape[0]
    for k in range(halves.shape[0]):
        for i in range(n):
            z[k * n + i, 0] = y[k * n + i, 0] ^ (((first_gate + np.uint64(i)) << np.uint64(1)) | halves[k])
            z[k * n + i, 1] = y[k * n + i, 1]


@njit(cache=True, nogil=True)
def _evaluator_hash_inputs(
    a: np.ndarray, b: np.ndarray, x: np.ndarray
) -> None:  # pragma: no cover - compiled
    n = a.shape[0]
    for i in range(n):
        for k in range(2):
            x[i, k] = a[i, k]
            x[n + i, k] = b[i, k]


@njit(cache=True, nogil=True)
def _garbler_hash_inputs(
    a0: np.ndarray, b0: np.ndarray, delta: np.ndarray, x: np.ndarray
) -> None:  # pragma: no cover
    n = a0.shape[0]
    for i in range(n):
        for k in range(2):
            x[i, k] = a0[i, k]
            x[n + i, k] = a0[i, k] ^ delta[k]
            x[2 * n + i, k] = b0[i, k]
            x[3 * n + i, k] = b0[i, k] ^ delta[k]


@njit(cache=True, nogil=True)
def _garble_combine(
    y: np.ndarray,
    h: np.ndarray,
    a0: np.ndarray,
    b0: np.ndarray,
    delta: np.ndarray,
    c0: np.ndarray,
    table: np.ndarray,
) -> None:  # pragma: no cover - compiled
    # H = h ⊕ y completes the TCCR hash here. Masks instead of branches: the permute bits are secret, so
    # no data-dependent control flow.
    n = a0.shape[0]
    zero = np.uint64(0)
    one = np.uint64(1)
    for i in range(n):
        mask_a = zero - (a0[i, 0] & one)
        mask_b = zero - (b0[i, 0] & one)
        for k in range(2):
            h_a0 = h[i, k] ^ y[i, k]
            h_a1 = h[n + i, k] ^ y[n + i, k]
            h_b0 = h[2 * n + i, k] ^ y[2 * n + i, k]
            h_b1 = h[3 * n + i, k] ^ y[3 * n + i, k]
            t_g = h_a0 ^ h_a1 ^ (delta[k] & mask_b)
            d = h_b0 ^ h_b1
            table[0, i, k] = t_g
            table[1, i, k] = d ^ a0[i, k]
            c0[i, k] = h_a0 ^ (t_g & mask_a) ^ h_b0 ^ (d & mask_b)


@njit(cache=True, nogil=True)
def _eval_combine(
    y: np.ndarray, h: np.ndarray, a: np.ndarray, b: np.ndarray, table: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    n = a.shape[0]
    zero = np.uint64(0)
    one = np.uint64(1)
    for i in range(n):
        mask_a = zero - (a[i, 0] & one)
        mask_b = zero - (b[i, 0] & one)
        for k in range(2):
            h_a = h[i, k] ^ y[i, k]
            h_b = h[n + i, k] ^ y[n + i, k]
            out[i, k] = h_a ^ h_b ^ (table[0, i, k] & mask_a) ^ ((table[1, i, k] ^ a[i, k]) & mask_b)


def _rows(array: np.ndarray) -> np.ndarray:
    """A C-contiguous ``(n, 2)`` uint64 view (copy only if the layout requires it)."""
    return np.ascontiguousarray(array, dtype=np.uint64)


def _permute_twice(
    pi: FixedKeyAes, x: np.ndarray, ws: Workspace, tweak: Callable[..., None], *tweak_args: object
) -> tuple[np.ndarray, np.ndarray]:
    """The two AES passes of the TCCR hash: y = π(x) and h = π(y ⊕ i), with ``tweak(y, *args, z)`` writing
    z = y ⊕ i; the hash is h ⊕ y."""
    n = x.shape[0]
    y = pi.permute(x, ws.blocks("pi_x", n))
    z = ws.blocks("pi_x_tweak", n)[:n]
    tweak(y, *tweak_args, z)
    return y, pi.permute(z, ws.blocks("pi_pi", n))


def tccr_hash(
    pi: FixedKeyAes, blocks: np.ndarray, tweaks: np.ndarray, *, workspace: Workspace | None = None
) -> np.ndarray:
    """H(x, i) = π(π(x) ⊕ i) ⊕ π(x) for a whole layer of blocks.

    The garbling kernels compute exactly this, with the tweaks of their gates and the final XOR fused into
    their combining step.

    Args:
        pi: the session's fixed-key permutation.
        blocks: ``(n, 2)`` uint64 inputs x.
        tweaks: ``(n,)`` uint64 tweaks i, XORed into the low 64 bits of π(x) (the high 64 bits of the tweak
            block are zero). Callers must never repeat a tweak within a session.
        workspace: scratch buffers to reuse between layers.

    Returns:
        A fresh ``(n, 2)`` uint64 array.
    """
    n = blocks.shape[0]
    if tweaks.shape != (n,) or tweaks.dtype != np.dtype(np.uint64):
        raise InputError(
            f"tccr_hash needs one uint64 tweak per block: {n} blocks, tweaks {tweaks.dtype} {tweaks.shape}."
        )
    ws = workspace if workspace is not None else Workspace()
    y, h = _permute_twice(pi, _rows(blocks), ws, _xor_tweaks, tweaks)
    return np.bitwise_xor(h, y)


def _check_gates(first_gate: int, n: int) -> None:
    if not 0 <= first_gate <= _MAX_GATE - n:
        raise InputError(f"gate counter {first_gate} (+{n}) is outside [0, 2^62): the session is exhausted.")


_GARBLER_HALVES = np.array([0, 0, 1, 1], dtype=np.uint64)  # H(A0, 2g), H(A1, 2g), H(B0, 2g+1), H(B1, 2g+1)
_EVALUATOR_HALVES = np.array([0, 1], dtype=np.uint64)  # H(A, 2g), H(B, 2g+1)
TILE_GATES = 4096
"""Gates hashed per AES call: big enough to amortise a call, small enough for the buffers to stay in L2."""


def garble_and(
    pi: FixedKeyAes,
    a0: np.ndarray,
    b0: np.ndarray,
    *,
    delta: np.ndarray,
    first_gate: int,
    workspace: Workspace | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Garble a layer of ``n`` AND gates with half-gates.

    With p_a, p_b the permute bits (least significant bits) of the zero-labels A0, B0 and j = 2g, j' = 2g+1:
    T_G = H(A0, j) ⊕ H(A1, j) ⊕ p_b·Δ, W_G0 = H(A0, j) ⊕ p_a·T_G (generator half) and
    T_E = H(B0, j') ⊕ H(B1, j') ⊕ A0, W_E0 = H(B0, j') ⊕ p_b·(T_E ⊕ A0) (evaluator half); C0 = W_G0 ⊕ W_E0.

    Args:
        pi: fixed-key permutation.
        a0: ``(n, 2)`` zero-labels of the left inputs.
        b0: ``(n, 2)`` zero-labels of the right inputs.
        delta: ``(2,)`` global free-XOR offset Δ, least significant bit 1.
        first_gate: session-wide index of the first gate; gate g uses tweaks 2g and 2g + 1.
        workspace: scratch buffers.

    Returns:
        ``(c0, table)``: the ``(n, 2)`` output zero-labels and the ``(2, n, 2)`` garbled table
        (T_G for every gate, then T_E for every gate).
    """
    ws = workspace if workspace is not None else Workspace()
    a0, b0 = _rows(a0), _rows(b0)
    n = a0.shape[0]
    _check_gates(first_gate, n)
    c0 = np.empty((n, 2), dtype=np.uint64)
    table = np.empty((TABLE_BLOCKS_PER_AND, n, 2), dtype=np.uint64)
    for start in range(0, n, TILE_GATES):
        stop = min(start + TILE_GATES, n)
        x = ws.blocks("inputs", 4 * (stop - start))[: 4 * (stop - start)]
        _garbler_hash_inputs(a0[start:stop], b0[start:stop], delta, x)
        gate = np.uint64(first_gate + start)
        y, h = _permute_twice(pi, x, ws, _xor_gate_tweaks, gate, _GARBLER_HALVES)
        _garble_combine(y, h, a0[start:stop], b0[start:stop], delta, c0[start:stop], table[:, start:stop])
    return c0, table


def eval_and(
    pi: FixedKeyAes,
    a: np.ndarray,
    b: np.ndarray,
    table: np.ndarray,
    *,
    first_gate: int,
    workspace: Workspace | None = None,
) -> np.ndarray:
    """Evaluate a layer of ``n`` half-gates AND gates.

    With s_a, s_b the select bits (least significant bits) of the active labels A, B:
    C = H(A, j) ⊕ s_a·T_G ⊕ H(B, j') ⊕ s_b·(T_E ⊕ A).

    Args:
        pi: fixed-key permutation.
        a: ``(n, 2)`` active labels of the left inputs.
        b: ``(n, 2)`` active labels of the right inputs.
        table: ``(2, n, 2)`` garbled table as produced by :func:`garble_and`.
        first_gate: the same gate index the garbler used.
        workspace: scratch buffers.

    Returns:
        ``(n, 2)`` active output labels.
    """
    ws = workspace if workspace is not None else Workspace()
    a, b, table = _rows(a), _rows(b), _rows(table)
    n = a.shape[0]
    if table.shape != (TABLE_BLOCKS_PER_AND, n, 2):
        raise InputError(f"garbled table for {n} gates must have shape (2, {n}, 2), got {table.shape}.")
    _check_gates(first_gate, n)
    out = np.empty((n, 2), dtype=np.uint64)
    for start in range(0, n, TILE_GATES):
        stop = min(start + TILE_GATES, n)
        x = ws.blocks("inputs", 2 * (stop - start))[: 2 * (stop - start)]
        _evaluator_hash_inputs(a[start:stop], b[start:stop], x)
        gate = np.uint64(first_gate + start)
        y, h = _permute_twice(pi, x, ws, _xor_gate_tweaks, gate, _EVALUATOR_HALVES)
        _eval_combine(y, h, a[start:stop], b[start:stop], table[:, start:stop], out[start:stop])
    return out


@njit(cache=True, nogil=True)
def _active_labels(
    values: np.ndarray, zero: np.ndarray, delta: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    one = np.uint64(1)
    for i in range(zero.shape[0]):
        for j in range(zero.shape[1]):
            mask = np.uint64(0) - ((values[j] >> np.uint64(i)) & one)
            out[i, j, 0] = zero[i, j, 0] ^ (delta[0] & mask)
            out[i, j, 1] = zero[i, j, 1] ^ (delta[1] & mask)


def input_labels(values: np.ndarray, *, zero: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """The garbler's active labels for its own input values: zero-label ⊕ bit·Δ, bit plane by bit plane.

    Args:
        values: ``(n, ...)`` non-negative integers below 2^w, queries first.
        zero: ``(w, ..., n, 2)`` uint64 zero-labels of their bits in the circuit's layout (see
            :func:`~capc_common.mpc.primitives.bits.to_bit_planes`).
        delta: ``(2,)`` uint64 Δ.

    Returns:
        Active labels shaped like ``zero`` (what the evaluator receives).
    """
    lanes = np.moveaxis(values, 0, -1)
    if zero.shape[1:-1] != lanes.shape:
        raise InputError(f"input values of shape {values.shape} do not match labels of shape {zero.shape}.")
    out = np.empty_like(zero)
    flat = out.reshape(zero.shape[0], -1, 2)
    _active_labels(
        np.ascontiguousarray(lanes, dtype=np.uint64).reshape(-1), _rows(zero).reshape(flat.shape), delta, flat
    )
    return out
