"""Bit-level layout helpers: the 128 × m bit-matrix transpose of IKNP and integer ⇄ bit-plane conversion.

The transpose is the one step of OT extension that numpy cannot vectorise well (an unpack/transpose/pack
round trip moves 64× the data), so it is a small numba kernel that transposes 8 × 8 bit blocks held in one
64-bit word with three delta-swaps (Hacker's Delight §7-3).
"""

from __future__ import annotations

import numpy as np

from capc_common.errors import InputError
from capc_common.mpc.primitives._njit import njit

OT_WIDTH = 128
"""Columns of the IKNP matrix: one per bit of a 128-bit label (the computational security parameter)."""


@njit(cache=True, nogil=True)
def _transpose_kernel(columns: np.ndarray, rows: np.ndarray) -> None:  # pragma: no cover - compiled
    n_col_groups = columns.shape[0] // 8
    n_row_groups = columns.shape[1]
    m7 = np.uint64(0x00AA00AA00AA00AA)
    m14 = np.uint64(0x0000CCCC0000CCCC)
    m28 = np.uint64(0x00000000F0F0F0F0)
    for jb in range(n_col_groups):
        for ib in range(n_row_groups):
            x = np.uint64(0)
            for k in range(8):
                x |= np.uint64(columns[jb * 8 + k, ib]) << np.uint64(8 * k)
            t = (x ^ (x >> np.uint64(7))) & m7
            x = x ^ t ^ (t << np.uint64(7))
            t = (x ^ (x >> np.uint64(14))) & m14
            x = x ^ t ^ (t << np.uint64(14))
            t = (x ^ (x >> np.uint64(28))) & m28
            x = x ^ t ^ (t << np.uint64(28))
            for k in range(8):
                rows[ib * 8 + k, jb] = np.uint8((x >> np.uint64(8 * k)) & np.uint64(0xFF))


def transpose_bits(columns: np.ndarray) -> np.ndarray:
    """Transpose a bit matrix stored column-major into row-major 128-bit rows.

    Bit ``i`` of column ``j`` is bit ``i % 8`` of ``columns[j, i // 8]`` (little-endian bit order, as
    ``np.packbits(..., bitorder="little")``). The result's row ``i`` holds bit ``j`` in bit ``j % 8`` of byte
    ``j // 8``, i.e. row ``i`` is the 128-bit label whose bit ``j`` is column ``j``'s bit ``i``.

    Args:
        columns: ``(c, m / 8)`` uint8 with ``c`` a multiple of 8 (128 for IKNP).

    Returns:
        ``(m, c / 8)`` uint8 rows.
    """
    if columns.dtype != np.uint8 or columns.ndim != 2 or columns.shape[0] % 8:
        raise InputError(
            f"transpose_bits needs a 2-D uint8 array with a multiple of 8 rows, got {columns.dtype} "
            f"{columns.shape}."
        )
    rows = np.empty((columns.shape[1] * 8, columns.shape[0] // 8), dtype=np.uint8)
    _transpose_kernel(np.ascontiguousarray(columns), rows)
    return rows


def to_bit_planes(values: np.ndarray, *, width: int) -> np.ndarray:
    """Split integers mod 2^width into little-endian bit planes.

    Args:
        values: ``(N, ...)`` integer array (reduced mod 2^width here), queries first.
        width: bits per value.

    Returns:
        ``(width, ..., N)`` bool array; plane ``i`` holds bit ``i`` and queries move last (the circuit's
        wire layout: one query per lane).
    """
    unsigned = np.moveaxis(values, 0, -1).astype(np.uint64)[None]
    shifts = np.arange(width, dtype=np.uint64).reshape((-1,) + (1,) * (unsigned.ndim - 1))
    return ((unsigned >> shifts) & np.uint64(1)).astype(bool)


def from_bit_planes(planes: np.ndarray) -> np.ndarray:
    """Inverse of :func:`to_bit_planes` for a ``(width, ...)`` bool array: returns unsigned int64 values."""
    weights = (np.int64(1) << np.arange(planes.shape[0], dtype=np.int64)).reshape(
        (-1,) + (1,) * (planes.ndim - 1)
    )
    return (planes.astype(np.int64) * weights).sum(axis=0)
