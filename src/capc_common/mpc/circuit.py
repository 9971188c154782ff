"""The noisy-argmax circuit and the builder blocks it is made of, written once for every backend.

Per query the circuit computes (DESIGN §3 step 5), in two's complement over Z_{2^w}:

* H + z2 = S' + (A + z2): the student's input plus the guardian's label addend, one adder per class;
* label = argmax_j (H_j + z2_j) as a tournament tree (a right child wins only if strictly larger, so ties
  go to the lowest index, like ``numpy.argmax``);
* Confident-GNMax: pass = [max_j H_j + z1_g + z1_s − T ≥ 0] = ¬AND_j [S'_j + (A_j + z1_g − T) < 0], which
  needs only the carry chain to each sign bit and an AND tree instead of a second maximum, and the label bits
  are ANDed with pass, so a failed query's output wires carry 0 whatever its argmax.

The threshold noise is split: the guardian draws z1_g, the student z1_s (each N_Z(0, σ1²)), so neither
party knows the noise of the pass bits it sees. The guardian knows A, z1_g, z2 and T and adds them in the
clear (:func:`guardian_inputs`); the student knows S and z1_s and enters S' = S + z1_s (one value per class,
:func:`student_inputs`), the only input that goes through oblivious transfer. Adding z1_s to every class of a
query shifts all its noisy counts alike, which leaves the argmax unchanged as long as nothing wraps (the ring
width and both parties' noise bounds guarantee that), so the split costs no gate and no input bit: the
circuit has one adder per class and per margin, as without it.

All blocks take stacked bit planes: ``x[i]`` is bit i (least significant first) of every value in ``x``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from capc_common.errors import InputError
from capc_common.mpc.backend import CircuitBackend
from capc_common.mpc.config import MpcConfig
from capc_common.mpc.sharing import reduce_shares

Planes = Sequence[np.ndarray] | np.ndarray
"""Bit planes, least significant first: a stacked array or a list of per-bit arrays."""


def _carries(
    b: CircuitBackend, x: Planes, y: Planes, *, bits: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Carries of x + y with one AND each: c_{i+1} = c_i ⊕ ((x_i ⊕ c_i) ∧ (y_i ⊕ c_i)), c_1 = x_0 ∧ y_0.

    Returns ``(carries, xc)``: ``carries[i]`` enters bit i + 1 (``bits`` of them) and ``xc[i]`` = x_i ⊕ c_i
    for i = 1 … bits − 1, from which sum bits cost one more XOR (s_i = xc_i ⊕ y_i).
    """
    carries = [b.and_(x[0], y[0])] if bits else []
    xcs: list[np.ndarray] = []
    for i in range(1, bits):
        carry = carries[-1]
        xcs.append(b.xor(x[i], carry))
        carries.append(b.xor(carry, b.and_(xcs[-1], b.xor(y[i], carry))))
    return carries, xcs


def _sum_bits(
    b: CircuitBackend, x: Planes, y: Planes, carries: list[np.ndarray], xcs: list[np.ndarray]
) -> list[np.ndarray]:
    """The w sum bits of x + y from :func:`_carries` (``bits`` = w − 1)."""
    width = len(x)
    head = [b.xor(x[0], y[0])] + [b.xor(xcs[i - 1], y[i]) for i in range(1, width - 1)]
    return head + ([b.xor(b.xor(x[width - 1], y[width - 1]), carries[-1])] if width > 1 else [])


def _borrows(b: CircuitBackend, x: Planes, y: Planes, *, signed: bool) -> list[np.ndarray]:
    """Borrows d_1 … d_w of x − y, one AND and no NOT each: d' = y ⊕ ((x ⊕ d) ∧ (y ⊕ d)).

    d' is the majority of (¬x, y, d), the borrow of a subtraction. Signed (two's complement) operands
    compare like unsigned ones with both sign bits flipped; folding the flips into the last step gives
    d_w = x ⊕ ((x ⊕ d) ∧ (y ⊕ d)), the majority of (x, ¬y, d). The final borrow is x < y.
    """
    width = len(x)
    borrows: list[np.ndarray] = []
    for i in range(width):
        last_signed = signed and i == width - 1
        if borrows:
            xd, yd = b.xor(x[i], borrows[-1]), b.xor(y[i], borrows[-1])
        else:
            xd, yd = x[i], y[i]
        borrows.append(b.xor(x[i] if last_signed else y[i], b.and_(xd, yd)))
    return borrows


def add(b: CircuitBackend, x: Planes, y: Planes) -> np.ndarray:
    """x + y mod 2^w (w − 1 AND gates per value)."""
    carries, xcs = _carries(b, x, y, bits=len(x) - 1)
    return np.stack(_sum_bits(b, x, y, carries, xcs))


def subtract(b: CircuitBackend, x: Planes, y: Planes) -> np.ndarray:
    """x − y mod 2^w (w − 1 AND gates per value): bit i is x_i ⊕ y_i ⊕ d_i."""
    borrows = _borrows(b, x[:-1], y[:-1], signed=False)
    first = [b.xor(x[0], y[0])]
    return np.stack(first + [b.xor(b.xor(x[i], y[i]), borrows[i - 1]) for i in range(1, len(x))])


def less_than(b: CircuitBackend, x: Planes, y: Planes, *, signed: bool) -> np.ndarray:
    """x < y as one bit per value: the final borrow of x − y (w AND gates, no NOT)."""
    return _borrows(b, x, y, signed=signed)[-1]


def mux(b: CircuitBackend, sel: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``y`` where ``sel`` else ``x``, for bit planes ``(k, ...)`` and ``sel`` of shape ``(...)``.

    x ⊕ sel·(x ⊕ y): one AND per bit.
    """
    return b.xor(x, b.and_(sel[None], b.xor(x, y)))


def all_of(b: CircuitBackend, bits: np.ndarray) -> np.ndarray:
    """AND over axis 0 of ``bits`` (k − 1 AND gates, depth ⌈log2 k⌉, no XOR)."""
    while bits.shape[0] > 1:
        pairs = bits.shape[0] // 2
        merged = b.and_(bits[0 : 2 * pairs : 2], bits[1 : 2 * pairs : 2])
        bits = np.concatenate([merged, bits[2 * pairs :]]) if bits.shape[0] % 2 else merged
    return bits[0]


def any_nonnegative(b: CircuitBackend, values: np.ndarray) -> np.ndarray:
    """Whether any of the signed values ``(w, k, ...)`` along axis 1 is ≥ 0: ¬(all sign bits set).

    This is the threshold test: max_j m_j ≥ 0 ⟺ some m_j ≥ 0, without computing the maximum.
    """
    return b.not_(all_of(b, values[len(values) - 1]))


def mask(b: CircuitBackend, bits: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``bits`` where ``keep`` else 0 (one AND per bit): how a failed query's label is erased."""
    return b.and_(bits, keep[None])


def tournament(
    b: CircuitBackend, x: np.ndarray, *, signed: bool, want_max: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """Argmax (and optionally max) over axis 1 of ``x`` (bit planes ``(w, c, ...)``) by a tournament tree.

    Round r pairs neighbours (2p, 2p+1); the right one wins only if strictly greater, so ties keep the lower
    index. A winner's index inside its subtree of 2^r leaves is built from the selection bits on its way up
    (the top bit is this round's selection, the lower bits are muxed from the children), so no index
    constants enter the circuit; an odd node out moves up unchanged with a constant-0 top bit.

    Returns:
        ``(index_bits, max_bits)``: ``(⌈log2 c⌉, ...)`` index planes and, if ``want_max``, ``(w, ...)``.
    """
    width, classes = x.shape[0], x.shape[1]
    if classes < 2:
        raise InputError(f"a tournament needs at least 2 candidates, got {classes}.")
    values, offsets = x, None
    while True:
        count = values.shape[1]
        pairs = count // 2
        left, right = values[:, 0 : 2 * pairs : 2], values[:, 1 : 2 * pairs : 2]
        sel = less_than(b, left, right, signed=signed)
        final = count == 2
        keep_values = want_max or not final
        carried_left = [left] if keep_values else []
        carried_right = [right] if keep_values else []
        if offsets is not None:
            carried_left.append(offsets[:, 0 : 2 * pairs : 2])
            carried_right.append(offsets[:, 1 : 2 * pairs : 2])
        n_values = width if keep_values else 0
        muxed = None
        new_offsets = sel[None]
        if carried_left:
            muxed = mux(b, sel, np.concatenate(carried_left), np.concatenate(carried_right))
            new_offsets = np.concatenate([muxed[n_values:], new_offsets])
        if final:
            return new_offsets[:, 0], (muxed[:width, 0] if want_max and muxed is not None else None)
        assert muxed is not None
        new_values = muxed[:width]
        if count % 2:
            lone_offsets = [offsets[:, count - 1 :]] if offsets is not None else []
            lone_offsets.append(b.zeros_like(sel[None, :1]))
            new_values = np.concatenate([new_values, values[:, count - 1 :]], axis=1)
            new_offsets = np.concatenate([new_offsets, np.concatenate(lone_offsets)], axis=1)
        values, offsets = new_values, new_offsets


def noisy_argmax(
    b: CircuitBackend, *, share: np.ndarray, addends: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """The whole per-query circuit.

    Args:
        b: backend.
        share: the student's input S' = S + z1_s as bit planes ``(w, c, ...)``.
        addends: the guardian's inputs as bit planes ``(w, k, c, ...)``: ``[:, 0]`` is A + z2 and, for
            Confident-GNMax (k = 2), ``[:, 1]`` is A + z1 − T. The share broadcasts against both, so the
            two additions share one AND layer per bit; only the label sums' bits and the margins' sign
            bits are formed.

    Returns:
        ``(label_bits, passed)``: ``(⌈log2 c⌉, ...)`` argmax bits (zero where the query failed) and the pass
        bit ``(...)`` (None for GNMax).
    """
    width = len(share)
    x = share[:, None]
    carries, xcs = _carries(b, x, addends, bits=width - 1)
    label_part = [c[0] for c in carries], [xc[0] for xc in xcs]
    noisy = np.stack(_sum_bits(b, share, addends[:, 0], *label_part))
    label, _ = tournament(b, noisy, signed=True)
    if addends.shape[1] == 1:
        return label, None
    margin_sign = b.xor(b.xor(share[width - 1], addends[width - 1, 1]), carries[-1][1])
    passed = b.not_(all_of(b, margin_sign))
    return mask(b, label, passed), passed


def guardian_inputs(
    config: MpcConfig,
    *,
    guardian_share: np.ndarray,
    z2: np.ndarray,
    z1: np.ndarray | None,
    threshold: int | None,
) -> np.ndarray:
    """The guardian's clear-text addends A + z2 and A + z1_g − T, reduced mod 2^w.

    Also refuses noise that would push a noisy count or margin out of the signed ring for some possible vote
    count V ∈ [0, teachers] and some student noise |z1_s| ≤ ``config.student_noise``: wrapping around would
    silently return a wrong label.

    Args:
        config: session parameters.
        guardian_share: A, ``(B, c)``.
        z2: per-class noise, ``(B, c)`` integers.
        z1: the guardian's part z1_g of the threshold noise, ``(B,)`` integers (Confident-GNMax), else None.
        threshold: the threshold T (Confident-GNMax), else None.

    Returns:
        ``(B, k, c)`` int64: ``[:, 0]`` = A + z2 and, for Confident-GNMax (k = 2), ``[:, 1]`` = A + z1_g − T.

    Raises:
        InputError: shapes, dtypes, mode mismatch or noise outside the ring.
    """
    shape = guardian_share.shape
    lo, hi = _noise_room(config)
    z2 = _integer_array(z2, "z2", shape)
    _check_ring(z2, lo=lo, hi=hi, what="z2 (per-class noise)", config=config)
    label_addend = reduce_shares(guardian_share + z2, width=config.width)
    if config.mode == "gnmax":
        if z1 is not None or threshold is not None:
            raise InputError("GNMax mode has no threshold step: pass z1=None and threshold=None.")
        return label_addend[:, None]
    if z1 is None or threshold is None:
        raise InputError(
            "Confident-GNMax needs the guardian's threshold noise z1 (one per query) and the threshold T."
        )
    if isinstance(threshold, bool) or not isinstance(threshold, int | np.integer):
        raise InputError(f"the threshold T must be an integer, got {threshold!r}.")
    margin = _integer_array(z1, "z1", shape[:1]) - int(threshold)
    _check_ring(margin, lo=lo, hi=hi, what="z1 − T (threshold margin)", config=config)
    pass_addend = reduce_shares(guardian_share + margin[:, None], width=config.width)
    return np.stack([label_addend, pass_addend], axis=1)


def student_inputs(config: MpcConfig, *, share_sum: np.ndarray, z1_student: np.ndarray | None) -> np.ndarray:
    """The student's circuit input S + z1_s (the same z1_s added to every class of a query), reduced mod 2^w.

    Args:
        config: session parameters.
        share_sum: S, ``(B, c)`` integers (any representatives mod 2^w).
        z1_student: the student's part z1_s of the threshold noise, ``(B,)`` integers with
            |z1_s| ≤ ``config.student_noise`` (Confident-GNMax); None for GNMax.

    Returns:
        ``(B, c)`` int64 in [0, 2^w).

    Raises:
        InputError: shapes, dtypes, mode mismatch or noise beyond the configured bound. The message never
            contains noise values: a refused batch's error may be logged and sent on to the guardian.
    """
    share_sum = np.asarray(share_sum)
    if share_sum.ndim != 2 or share_sum.shape[0] < 1 or share_sum.shape[1] != config.classes:
        raise InputError(f"share_sum must have shape (queries ≥ 1, {config.classes}), got {share_sum.shape}.")
    if not np.issubdtype(share_sum.dtype, np.integer):
        raise InputError(f"share_sum must be an integer array, got {share_sum.dtype}.")
    share = reduce_shares(share_sum, width=config.width)
    if config.student_noise is None:
        if z1_student is not None:
            raise InputError("GNMax mode has no threshold step: pass z1_student=None.")
        return share
    if z1_student is None:
        raise InputError(
            "Confident-GNMax needs the student's threshold noise z1_student (one N_Z(0, σ1²) draw per query, "
            "from the student's own CSPRNG: capc_common.aggregation.draw_student_noise)."
        )
    z1 = _integer_array(z1_student, "z1_student", share.shape[:1])
    bound = config.student_noise
    if z1.size and int(np.abs(z1).max()) > bound:
        raise InputError(
            f"{int((np.abs(z1) > bound).sum())} of {z1.size} values of z1_student lie outside [−{bound}, "
            f"{bound}], the bound MpcConfig.student_noise that keeps every noisy value inside the signed "
            f"{config.width}-bit ring; check the noise sampler or derive the config from the same σ1."
        )
    return reduce_shares(share + z1[:, None], width=config.width)


def _noise_room(config: MpcConfig) -> tuple[int, int]:
    """Where the guardian's noise (z2 and z1_g − T) must lie so that, with any V ∈ [0, teachers] and any
    student noise the config allows, every noisy count and margin stays in [−2^{w−1}, 2^{w−1})."""
    half = 1 << (config.width - 1)
    room = config.student_noise or 0
    return -half + room, half - 1 - config.teachers - room


def _integer_array(values: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
    values = np.asarray(values)
    if values.shape != shape or not np.issubdtype(values.dtype, np.integer):
        raise InputError(
            f"{name} must be an integer array of shape {shape}, got {values.dtype} {values.shape}."
        )
    return values.astype(np.int64)


def _check_ring(values: np.ndarray, *, lo: int, hi: int, what: str, config: MpcConfig) -> None:
    """Refuse noise outside the ring's room; the message counts the values but never shows one (noise is
    secret, and this error may be logged or sent on to a peer)."""
    outside = int(((values < lo) | (values > hi)).sum())
    if outside:
        raise InputError(
            f"{outside} of {values.size} values of {what} lie outside [{lo}, {hi}], the room that keeps "
            f"every noisy value with up to {config.teachers} votes and student noise up to "
            f"±{config.student_noise or 0} inside the signed {config.width}-bit ring; derive a wider width "
            "with ring_width(tails=...) or check the noise sampler."
        )
