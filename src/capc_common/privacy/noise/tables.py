"""Exact-to-2^-90 inverse-CDF tables for the discrete Gaussian and discrete Laplace distributions.

A table stores the cumulative distribution of ``X`` on ``[-K, K]`` as 128-bit fixed-point integers
computed from 256-bit fixed-point probabilities (pure integer arithmetic after two high-precision ``exp``
values), split into a high and a low 64-bit word. Sampling draws one uniform 64-bit word per value and runs
``numpy.searchsorted`` on the high words; only when that word equals a table word (probability about
``(2K+1)·2^-64``) is a second word drawn to compare the low halves, so the result is exactly what a 128-bit
uniform would give at the cost of one word per draw.

Statistical distance to the true distribution (both are symmetric unimodal on the integers with weights
``w_x = exp(-x²/(2σ²))`` or ``exp(-|x|/b)``):

* the tail cut ``Pr[|X| > K]`` is bounded with the geometric bound ``Σ_{x>K} w_x ≤ w_K·r_K/(1-r_K)``, where
  ``r_x = w_{x+1}/w_x`` is non-increasing, and ``K`` is the first point where that bound is ≤ 2^-96 of the
  mass already accumulated;
* every cumulative value is rounded down to a multiple of 2^-128, which moves each cell by < 2^-128;
* the 256-bit recursion loses < 2^-200 relative per step.

:attr:`SamplerTable.distance_bound` reports the sum of those bounds for each table; it is below 2^-90 for
every table this module builds (``K < 2^31``).
"""

from __future__ import annotations

import decimal
import functools
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

if TYPE_CHECKING:
    from capc_common.privacy.noise.source import NoiseSource

__all__ = [
    "MAX_LAPLACE_SCALE",
    "MAX_SIGMA",
    "SamplerTable",
    "discrete_gaussian_table",
    "discrete_laplace_table",
]

_PREC = 256  # bits of the fixed-point weights
_CDF_BITS = 128  # bits of the stored cumulative distribution
_TAIL_BITS = 96  # the tail cut leaves at most 2^-96 of the mass outside [-K, K]
_MASK64 = (1 << 64) - 1
#: Largest σ the table sampler accepts: a table of about 7 million entries, 110 MB, built in about 8 s with
#: about 1 GB of transient memory, once per process and σ (1e5 until 2026-12-02: 2.3 million entries). A
#: secure-aggregation DP-SGD at ε 1 needs σ ≈ 267,000 for an encoding whose rounding costs under 1/64 of the
#: clip (:func:`~capc_common.mechanisms.dpsgd.fixed_point_for`).
MAX_SIGMA = 3e5
#: Largest discrete Laplace scale ``b`` the table sampler accepts (about 1.3 million entries).
MAX_LAPLACE_SCALE = 1e4


def _exp_neg_fixed(x: Fraction) -> int:
    """``floor(exp(-x) · 2^256)`` for a non-negative rational ``x``, from a 100-digit decimal exp."""
    ctx = decimal.Context(prec=100)
    value = ctx.exp(ctx.minus(ctx.divide(decimal.Decimal(x.numerator), decimal.Decimal(x.denominator))))
    return int(
        ctx.multiply(value, decimal.Decimal(1 << _PREC)).to_integral_value(rounding=decimal.ROUND_FLOOR)
    )


@dataclass(frozen=True)
class SamplerTable:
    """An inverse-CDF table of a symmetric distribution on ``[-K, K]``.

    Attributes:
        name: what the table samples, e.g. ``"discrete_gaussian(sigma=40)"``.
        radius: ``K``; values lie in ``[-K, K]``.
        high: high 64-bit words of the 128-bit cumulative probabilities of ``-K .. K-1`` (non-decreasing).
        low: the matching low 64-bit words.
        distance_bound: upper bound on the statistical distance to the exact distribution.
    """

    name: str
    radius: int
    high: npt.NDArray[np.uint64]
    low: npt.NDArray[np.uint64]
    distance_bound: float

    def pmf(self) -> npt.NDArray[np.float64]:
        """The probabilities the table assigns to ``-K .. K`` (as float64, for tests and diagnostics)."""
        cdf = [(int(h) << 64) | int(lo) for h, lo in zip(self.high, self.low, strict=True)]
        cells = np.diff(np.array([0, *cdf, 1 << _CDF_BITS], dtype=object))
        return np.array([float(Fraction(int(c), 1 << _CDF_BITS)) for c in cells], dtype=np.float64)

    def index_of(self, high_word: int, low_word: int) -> int:
        """Index (value + K) selected by the 128-bit uniform ``high_word·2^64 + low_word``.

        This is the exact rule the vectorised :meth:`sample` implements: the first cell whose cumulative
        probability exceeds the uniform.
        """
        right = int(np.searchsorted(self.high, np.uint64(high_word), side="right"))
        left = int(np.searchsorted(self.high, np.uint64(high_word), side="left"))
        return left + int(np.searchsorted(self.low[left:right], np.uint64(low_word), side="right"))

    def sample(self, source: NoiseSource, shape: tuple[int, ...]) -> npt.NDArray[np.int64]:
        """Draw ``prod(shape)`` values using ``source``'s uniform words (one each, rarely two).

        Args:
            source: where the uniform 64-bit words come from.
            shape: output shape.

        Returns:
            int64 array of ``shape``.
        """
        n = int(np.prod(shape, dtype=np.int64))
        words = source.uniform_words(n)
        index = np.searchsorted(self.high, words, side="right")
        # A word equal to a table word leaves the comparison to the low halves: draw them (in order).
        below = self.high[np.maximum(index - 1, 0)]
        tied = np.flatnonzero((index > 0) & (below == words))
        if tied.size:
            lows = source.uniform_words(int(tied.size))
            for position, low_word in zip(tied.tolist(), lows.tolist(), strict=True):
                index[position] = self.index_of(int(words[position]), int(low_word))
        return (index.astype(np.int64) - self.radius).reshape(shape)


def _build(name: str, *, first_ratio: int, ratio_step: int, max_radius: int) -> SamplerTable:
    """Build the table of weights ``w_0 = 1, w_{x+1} = w_x·r_x, r_{x+1} = r_x·q`` (256-bit fixed point).

    ``first_ratio`` is ``r_0`` and ``ratio_step`` is ``q``, both already in 256-bit fixed point; ``q ≤ 1`` so
    the ratios never increase and the geometric tail bound holds.
    """
    one = 1 << _PREC
    weights = [one]
    ratio = first_ratio
    two_sided = one  # mass of [-x, x] so far (≤ the full normalising constant)
    # The recursion rounds down; ``ratio + 1`` upper-bounds the true ratio in the tail bound.
    while True:
        weight = weights[-1]
        upper_ratio = min(ratio + 1, one - 1)
        if (2 * weight * upper_ratio) << _TAIL_BITS <= two_sided * (one - upper_ratio):
            break
        if len(weights) > max_radius:
            raise InputError(
                f"{name}: the table would exceed {max_radius} entries per side; use a smaller scale"
            )
        weights.append((weight * ratio) >> _PREC)
        two_sided += 2 * weights[-1]
        ratio = (ratio * ratio_step) >> _PREC
    radius = len(weights) - 1
    symmetric = weights[:0:-1] + weights  # w_{-K} .. w_K
    total = sum(symmetric)
    cdf: list[int] = []
    running = 0
    for weight in symmetric[:-1]:
        running += weight
        cdf.append((running << _CDF_BITS) // total)
    high = np.array([c >> 64 for c in cdf], dtype=np.uint64)
    low = np.array([c & _MASK64 for c in cdf], dtype=np.uint64)
    # tail ≤ 2^-96, rounding < (2K+1)·2^-128, 256-bit recursion error < (K+1)·2^-200 (relative).
    bound = 2.0**-_TAIL_BITS + (2 * radius + 1) * 2.0**-_CDF_BITS + (radius + 1) * 2.0**-200
    high.setflags(write=False)
    low.setflags(write=False)
    return SamplerTable(name=name, radius=radius, high=high, low=low, distance_bound=bound)


_build_lock = threading.Lock()


@functools.lru_cache(maxsize=64)
def _gaussian_table(sigma2: Fraction) -> SamplerTable:
    return _build(
        f"discrete_gaussian(sigma^2={sigma2})",
        first_ratio=_exp_neg_fixed(1 / (2 * sigma2)),
        ratio_step=_exp_neg_fixed(1 / sigma2),
        max_radius=int(12 * MAX_SIGMA),
    )


@functools.lru_cache(maxsize=64)
def _laplace_table(scale: Fraction) -> SamplerTable:
    return _build(
        f"discrete_laplace(scale={scale})",
        first_ratio=_exp_neg_fixed(1 / scale),
        ratio_step=1 << _PREC,
        max_radius=int(70 * MAX_LAPLACE_SCALE),
    )


def _check_scale(name: str, value: float, limit: float) -> Fraction:
    if not isinstance(value, int | float | np.integer | np.floating) or not np.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value!r}")
    if not 0 < float(value) <= limit:
        raise InputError(
            f"{name} must be in (0, {limit:g}] for the table sampler, got {float(value)!r}; "
            "noise that large drowns any count a federation can produce"
        )
    return Fraction(float(value))


def discrete_gaussian_table(*, sigma: float) -> SamplerTable:
    """The (cached) table of ``N_Z(0, σ²)``: ``Pr[x] ∝ exp(-x²/(2σ²))`` on the integers.

    ``σ²`` is taken as the exact square of the binary float ``σ``, the same value the exact rejection
    sampler (:func:`~capc_common.privacy.noise.exact.discrete_gaussian_exact`) uses.

    Raises:
        InputError: ``σ`` is not a finite number in ``(0, MAX_SIGMA]``.
    """
    sigma_q = _check_scale("sigma", sigma, MAX_SIGMA)
    with _build_lock:
        return _gaussian_table(sigma_q * sigma_q)


def discrete_laplace_table(*, scale: float) -> SamplerTable:
    """The (cached) table of the discrete Laplace distribution ``Pr[x] ∝ exp(-|x|/b)``, ``b = scale``.

    Raises:
        InputError: ``scale`` is not a finite number in ``(0, MAX_LAPLACE_SCALE]``.
    """
    scale_q = _check_scale("scale", scale, MAX_LAPLACE_SCALE)
    with _build_lock:
        return _laplace_table(scale_q)
