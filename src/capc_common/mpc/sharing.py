"""Additive secret sharing of vote histograms over Z_{2^w}, with the guardian's share compressed to a seed.

Teacher party p holds V_p (B × c counts). It draws a fresh 128-bit seed k_p, expands it with AES-CTR into
R_p, sends k_p to the guardian (16 bytes per batch) and V_p − R_p mod 2^w to the student. The student sums
its shares to S, the guardian expands and sums the seeds to A, and S + A = Σ_p V_p mod 2^w. Either share
alone is uniformly distributed, whatever the votes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from capc_common.errors import InputError
from capc_common.mpc.config import MAX_WIDTH
from capc_common.mpc.primitives.aes import KEY_BYTES, AesCtrStream

SEED_BYTES = KEY_BYTES


def _mask(width: int) -> np.uint64:
    if not 1 <= width <= MAX_WIDTH:
        raise InputError(f"share width must be in [1, {MAX_WIDTH}] bits, got {width}.")
    return np.uint64((1 << width) - 1)


def expand_share_seed(seed: bytes, *, shape: tuple[int, ...], width: int) -> np.ndarray:
    """R = AES-CTR(seed) read as little-endian uint64 words, each reduced mod 2^width.

    Masking a uniform 64-bit word to its low ``width`` bits is exactly uniform mod 2^width.

    Args:
        seed: 16-byte seed drawn by the teacher party.
        shape: shape of the vote array, e.g. ``(B, c)``.
        width: ring width in bits.

    Returns:
        int64 array of ``shape`` with values in [0, 2^width).
    """
    if not isinstance(seed, bytes | bytearray) or len(seed) != SEED_BYTES:
        raise InputError(
            f"a share seed is {SEED_BYTES} bytes, got {len(seed) if isinstance(seed, bytes) else seed!r}."
        )
    mask = _mask(width)
    count = int(np.prod(shape, dtype=np.int64))
    words = np.empty(count, dtype=np.uint64)
    AesCtrStream(bytes(seed)).read_into(words)
    return (words & mask).astype(np.int64).reshape(shape)


def reduce_shares(values: np.ndarray, *, width: int) -> np.ndarray:
    """Reduce integer shares (possibly negative) mod 2^width into [0, 2^width) as int64."""
    if not np.issubdtype(values.dtype, np.integer):
        raise InputError(f"shares must be an integer array, got dtype {values.dtype}.")
    return (values.astype(np.int64).astype(np.uint64) & _mask(width)).astype(np.int64)


def share_votes(votes: np.ndarray, *, width: int) -> tuple[bytes, np.ndarray]:
    """Split one party's vote counts into a guardian seed and a student share.

    Args:
        votes: ``(B, c)`` non-negative integer vote counts of this party.
        width: ring width in bits (from :func:`ring_width`).

    Returns:
        ``(seed, student_share)``: the fresh 16-byte seed for the guardian and the ``(B, c)`` int64 share
        V − AES-CTR(seed) mod 2^width for the student. Call once per batch: a seed is never reused.
    """
    votes = np.asarray(votes)
    if votes.ndim != 2 or not np.issubdtype(votes.dtype, np.integer):
        raise InputError(
            f"votes must be a 2-D integer array (queries, classes), got {votes.dtype} {votes.shape}."
        )
    if votes.size and votes.min() < 0:
        raise InputError(f"vote counts must be ≥ 0, got a minimum of {votes.min()}.")
    seed = os.urandom(SEED_BYTES)
    mask = expand_share_seed(seed, shape=votes.shape, width=width)
    return seed, reduce_shares(votes.astype(np.int64) - mask, width=width)


def sum_shares(shares: Iterable[np.ndarray], *, width: int) -> np.ndarray:
    """The student's share S = Σ_p share_p mod 2^width."""
    total: np.ndarray | None = None
    for share in shares:
        share = reduce_shares(np.asarray(share), width=width)
        if total is not None and share.shape != total.shape:
            raise InputError(f"shares have different shapes: {total.shape} and {share.shape}.")
        total = share if total is None else total + share
    if total is None:
        raise InputError("sum_shares needs at least one share.")
    return reduce_shares(total, width=width)


def sum_seeds(seeds: Sequence[bytes], *, shape: tuple[int, ...], width: int) -> np.ndarray:
    """The guardian's share A = Σ_p AES-CTR(k_p) mod 2^width."""
    if not seeds:
        raise InputError("the guardian needs at least one teacher party's seed.")
    return sum_shares((expand_share_seed(seed, shape=shape, width=width) for seed in seeds), width=width)
