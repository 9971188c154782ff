"""Exact rejection samplers of Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian for Differential
Privacy", NeurIPS 2020, Algorithms 1–3), in pure integer/rational arithmetic, and the exact exponential
mechanism built on their Bernoulli(exp(−γ)).

They are slow (a few Fraction operations per attempt). The discrete Laplace and Gaussian samplers are the
reference the fast table sampler of :mod:`.tables` is tested against; the exponential mechanism is the
production sampler of :class:`~capc_common.mechanisms.PublicPrototypes`. Every random choice is a uniform
integer drawn by rejection from the source's 64-bit words, so with a CSPRNG-backed source these samplers
are exact: no floating point touches the distribution.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.noise.source import NoiseSource

__all__ = [
    "bernoulli_exp_neg",
    "discrete_gaussian_exact",
    "discrete_laplace_exact",
    "exponential_mechanism_exact",
]


class _Randomness:
    """Uniform integers by rejection from a source's words, read in chunks (one call per 1024 words)."""

    _CHUNK = 1024

    def __init__(self, source: NoiseSource) -> None:
        self._source = source
        self._words: list[int] = []

    def _word(self) -> int:
        if not self._words:
            self._words = self._source.uniform_words(self._CHUNK).tolist()[::-1]
        return self._words.pop()

    def randbelow(self, n: int) -> int:
        """A uniform integer in ``[0, n)``: the low ``bit_length(n-1)`` bits of whole words, else retry."""
        bits = (n - 1).bit_length()
        mask = (1 << bits) - 1
        while True:
            value = 0
            for _ in range(max(1, -(-bits // 64))):
                value = (value << 64) | self._word()
            value &= mask
            if value < n:
                return value


def _bernoulli_exp_neg_unit(num: int, den: int, rng: _Randomness) -> bool:
    """Bernoulli(exp(-γ)), ``γ = num/den ∈ [0, 1]``: first failure of Bernoulli(γ/k), k = 1, 2, … at odd k."""
    k = 1
    while rng.randbelow(den * k) < num:
        k += 1
    return k % 2 == 1


def _bernoulli_exp_neg(num: int, den: int, rng: _Randomness) -> bool:
    """Bernoulli(exp(-γ)) for rational ``γ = num/den ≥ 0`` (CKS 2020, Algorithm 1 and its extension to γ > 1).

    For ``γ ≤ 1`` it counts how long a run of Bernoulli(γ/k) successes lasts (k = 1, 2, …) and returns 1 when
    the first failure comes at an odd k (the series of exp(-γ)); for larger γ it multiplies ``⌊γ⌋`` draws of
    Bernoulli(exp(-1)) with one of Bernoulli(exp(⌊γ⌋ - γ)). Integers only: no Fraction on the hot path.
    """
    whole, rest = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_neg_unit(1, 1, rng):
            return False
    return _bernoulli_exp_neg_unit(rest, den, rng)


def _fraction(name: str, value: float | Fraction) -> Fraction:
    """``value`` as its exact rational (a float's binary value); inf/NaN refused (``Fraction`` would raise a
    bare ValueError/OverflowError)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value}")
    return Fraction(value)


def bernoulli_exp_neg(*, gamma: float | Fraction, n: int, source: NoiseSource) -> npt.NDArray[np.bool_]:
    """Draw ``n`` exact Bernoulli(exp(-γ)) bits, the building block of both rejection samplers.

    Args:
        gamma: ``γ ≥ 0`` (a float is taken as its exact binary value).
        n: how many bits.
        source: the randomness.

    Raises:
        InputError: ``γ < 0`` or not finite.
    """
    g = _fraction("gamma", gamma)
    if g < 0:
        raise InputError(f"Bernoulli(exp(-gamma)) needs gamma ≥ 0, got {gamma}")
    rng = _Randomness(source)
    return np.array([_bernoulli_exp_neg(g.numerator, g.denominator, rng) for _ in range(n)], dtype=np.bool_)


def _laplace_one(t: int, s: int, rng: _Randomness) -> int:
    """One draw of the discrete Laplace with scale ``t/s`` (CKS 2020, Algorithm 2)."""
    while True:
        u = rng.randbelow(t)
        if not _bernoulli_exp_neg(u, t, rng):
            continue
        v = 0
        while _bernoulli_exp_neg(1, 1, rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.randbelow(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def _positive_fraction(name: str, value: float | Fraction) -> Fraction:
    q = _fraction(name, value)
    if q <= 0:
        raise InputError(f"{name} must be positive, got {value}")
    return q


def discrete_laplace_exact(*, scale: float | Fraction, n: int, source: NoiseSource) -> npt.NDArray[np.int64]:
    """Draw ``n`` values with ``Pr[x] ∝ exp(-|x|/scale)`` exactly (CKS 2020, Algorithm 2).

    Args:
        scale: the scale ``b = t/s`` (a float is taken as its exact binary value).
        n: how many values.
        source: the randomness.

    Returns:
        int64 array of length ``n``.

    Raises:
        InputError: ``scale ≤ 0`` or not finite.
    """
    b = _positive_fraction("scale", scale)
    rng = _Randomness(source)
    return np.array([_laplace_one(b.numerator, b.denominator, rng) for _ in range(n)], dtype=np.int64)


def discrete_gaussian_exact(*, sigma: float | Fraction, n: int, source: NoiseSource) -> npt.NDArray[np.int64]:
    """Draw ``n`` values of ``N_Z(0, σ²)`` exactly (CKS 2020, Algorithm 3).

    Proposes ``Y`` from the discrete Laplace with scale ``t = ⌊σ⌋ + 1`` and accepts with probability
    ``exp(-(|Y| - σ²/t)²/(2σ²))``.

    Args:
        sigma: σ; ``σ²`` is its exact square (the same value the table sampler uses for a float σ).
        n: how many values.
        source: the randomness.

    Returns:
        int64 array of length ``n``.

    Raises:
        InputError: ``σ ≤ 0`` or not finite.
    """
    s = _positive_fraction("sigma", sigma)
    sigma2 = s * s
    p, q = sigma2.numerator, sigma2.denominator
    t = math.floor(s) + 1
    # (|y| - σ²/t)² / (2σ²) = (|y|·t·q - p)² / (2·p·q·t²) with σ² = p/q.
    den = 2 * p * q * t * t
    rng = _Randomness(source)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        while True:
            y = _laplace_one(t, 1, rng)
            if _bernoulli_exp_neg((abs(y) * t * q - p) ** 2, den, rng):
                out[i] = y
                break
    return out


def exponential_mechanism_exact(scores: npt.ArrayLike, *, eta: float | Fraction, source: NoiseSource) -> int:
    """One draw of the exponential mechanism, ``Pr[j] ∝ exp(η · scores[j])``, exactly.

    Rejection from the uniform proposal: a candidate ``j`` drawn uniformly is accepted with probability
    ``exp(-η (max − scores[j]))`` (an exact Bernoulli of CKS 2020, Algorithm 1), so the accepted index has
    exactly the target law and no floating point touches it; the best candidate is accepted with
    probability 1, so a draw takes at most ``len(scores)`` proposals on average. (Gumbel-max on floats would
    approximate the same law, with the rounding problems of floating-point DP samplers; Mironov 2012,
    Ilvento 2020.) The number of proposals depends on the scores: run it where its timing is not observed.

    Args:
        scores: integer scores ``(M,)`` (fixed point), ``M ≥ 1``.
        eta: ``η ≥ 0`` (a float is taken as its exact binary value); 0 draws uniformly.
        source: the randomness.

    Returns:
        The index drawn.

    Raises:
        InputError: no candidate, non-integer scores, or ``η`` negative or not finite.
    """
    u = np.asarray(scores)
    if u.ndim != 1 or u.size == 0 or not np.issubdtype(u.dtype, np.integer):
        raise InputError(
            f"the exponential mechanism needs a non-empty 1-D integer score vector, got {u.dtype} {u.shape}"
        )
    e = _fraction("eta", eta)
    if e < 0:
        raise InputError(f"the exponential mechanism needs eta ≥ 0, got {eta}")
    gaps = (int(u.max()) - u.astype(object)).tolist()
    rng = _Randomness(source)
    while True:
        j = rng.randbelow(len(gaps))
        gamma = e * gaps[j]
        if _bernoulli_exp_neg(gamma.numerator, gamma.denominator, rng):
            return j
