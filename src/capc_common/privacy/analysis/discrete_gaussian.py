"""The discrete Gaussian ``N_Z(0, σ²)`` (Canonne, Kamath & Steinke 2020) as a distribution to compute with.

Tail probabilities in log space (for the pass probability of the screening step and for the data-dependent
analysis with integer noise), the exact variance, and the exact ``δ(ε)`` of the one-dimensional mechanism
(CKS 2020, Theorem 7), next to the continuous Gaussian's ``δ(ε)`` (Balle & Wang 2018, Theorem 8), which is
also the exact privacy profile of a composition of Gaussian mechanisms with ``μ = sqrt(Σ Δ_i²/σ_i²)``
(Dong, Roth & Su 2019, Gaussian differential privacy).

Example:
    >>> round(discrete_gaussian_variance(sigma=1.0), 12)
    0.999999788768
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from capc_common.privacy.analysis import _special as special
from capc_common.privacy.analysis._checks import count, non_negative, positive

__all__ = [
    "discrete_gaussian_delta",
    "discrete_gaussian_log_sf",
    "discrete_gaussian_log_sf_difference",
    "discrete_gaussian_variance",
    "gaussian_delta",
]

# Terms more than 40σ past the start of a tail are below e^-800 of its first term: invisible in float64.
_SPAN = 40.0


def _log_normaliser(sigma: float) -> float:
    """``log Σ_x exp(-x²/(2σ²))`` over the integers.

    For σ ≥ 1 by Poisson summation, ``σ·sqrt(2π)·(1 + 2Σ_k exp(-2π²σ²k²))`` (two terms reach double
    precision); for smaller σ by direct summation.
    """
    if sigma >= 1:
        k = np.arange(1, 6, dtype=np.float64)
        return math.log(sigma * math.sqrt(2 * math.pi)) + math.log1p(
            2 * float(np.sum(np.exp(-2 * math.pi**2 * sigma**2 * k**2)))
        )
    x = np.arange(-50, 51, dtype=np.float64)
    return float(special.logsumexp(-(x**2) / (2 * sigma**2)))


def _log_tail_table(start: int, stop: int, sigma: float) -> npt.NDArray[np.float64]:
    """``log Σ_{x ≥ a} exp(-x²/(2σ²))`` (unnormalised) for every integer ``a`` in ``[start, stop]``."""
    end = max(stop, 0) + math.ceil(_SPAN * sigma) + 2
    x = np.arange(start, end + 1, dtype=np.float64)
    log_w = -(x**2) / (2 * sigma**2)
    tails = np.logaddexp.accumulate(log_w[::-1])[::-1]
    return tails[: stop - start + 1]


def discrete_gaussian_log_sf(a: npt.ArrayLike, *, sigma: float) -> npt.NDArray[np.float64]:
    """``log Pr[Z ≥ a]`` for ``Z ~ N_Z(0, σ²)`` and integers ``a`` (vectorised).

    Right tails (``a ≥ 1``) are summed directly in log space from ``a``; for ``a ≤ 0`` the value is
    ``log(1 - Pr[Z ≥ 1 - a])`` by symmetry, so neither tail is ever computed as one minus a rounded number.

    Args:
        a: integer thresholds (any shape).
        sigma: σ > 0.

    Returns:
        float64 array with the shape of ``a``.
    """
    s = positive("sigma", sigma)
    arr = np.asarray(a)
    flat = np.asarray(np.round(arr), dtype=np.int64).ravel()
    if flat.size == 0:
        return np.zeros(arr.shape, dtype=np.float64)
    right = np.where(flat >= 1, flat, 1 - flat)  # every tail is evaluated at a point ≥ 1
    lo, hi = int(right.min()), int(right.max())
    log_tail = _log_tail_table(lo, hi, s)[right - lo] - _log_normaliser(s)
    log_tail = np.minimum(log_tail, math.log(0.5))  # Pr[Z ≥ 1] < 1/2 exactly; guard rounding
    out = np.where(flat >= 1, log_tail, np.log1p(-np.exp(log_tail)))
    return out.reshape(arr.shape)


def discrete_gaussian_log_sf_difference(d: npt.ArrayLike, *, sigma: float) -> npt.NDArray[np.float64]:
    """``log Pr[Z1 - Z2 ≥ d]`` for independent ``Z1, Z2 ~ N_Z(0, σ²)`` and integers ``d`` (vectorised).

    The difference of two discrete Gaussians is not a discrete Gaussian; this sums
    ``Pr[Z2 = y]·Pr[Z1 ≥ d + y]`` over every ``y`` within 40σ of where the summand can peak (between
    ``y = 0`` and ``y = -d/2``).
    Ties (``Z1 - Z2 = d``) count as ``≥``, so the GNMax failure probability built on it is an upper bound
    whatever the tie-breaking rule.
    """
    s = positive("sigma", sigma)
    arr = np.asarray(d)
    flat = np.asarray(np.round(arr), dtype=np.int64).ravel()
    out = np.empty(flat.size, dtype=np.float64)
    half = math.ceil(_SPAN * s)
    log_z = _log_normaliser(s)
    for value in np.unique(flat).tolist():
        centre = -value // 2
        y = np.arange(min(centre, 0) - half, max(centre, 0) + half + 1)
        log_p_y = -(y.astype(np.float64) ** 2) / (2 * s**2) - log_z
        total = special.logsumexp(log_p_y + discrete_gaussian_log_sf(value + y, sigma=s))
        out[flat == value] = min(float(total), 0.0)
    return out.reshape(arr.shape)


def discrete_gaussian_variance(*, sigma: float) -> float:
    """``Var[Z]`` for ``Z ~ N_Z(0, σ²)``; strictly below σ² (CKS 2020, Corollary 9 bounds it).

    Summed over ``|x| ≤ 40σ + 50`` in float64, which holds every term that matters in double precision.
    """
    s = positive("sigma", sigma)
    radius = math.ceil(_SPAN * s) + 50
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    log_w = -(x**2) / (2 * s**2)
    w = np.exp(log_w - log_w.max())
    return float(np.sum(w * x**2) / np.sum(w))


def discrete_gaussian_delta(epsilon: float, *, sigma: float, sensitivity: int = 1) -> float:
    """Exact ``δ(ε)`` of ``q(x) + N_Z(0, σ²)`` for an integer query of sensitivity Δ (CKS 2020, Theorem 7).

    ``δ = Pr[Z > εσ²/Δ - Δ/2] - e^ε·Pr[Z > εσ²/Δ + Δ/2]``, slightly larger than the continuous Gaussian's
    ``δ`` for the same σ: integer noise has the same RDP but not the same privacy profile.

    Args:
        epsilon: ε ≥ 0.
        sigma: σ > 0.
        sensitivity: the query's integer sensitivity Δ ≥ 1.
    """
    eps = non_negative("epsilon", epsilon)
    s = positive("sigma", sigma)
    delta_q = count("sensitivity", sensitivity, minimum=1)
    # Pr[Z > t] = Pr[Z ≥ floor(t) + 1] for integer Z.
    lo = math.floor(eps * s * s / delta_q - delta_q / 2) + 1
    hi = math.floor(eps * s * s / delta_q + delta_q / 2) + 1
    log_a, log_b = discrete_gaussian_log_sf(np.array([lo, hi]), sigma=s)
    return _difference(float(log_a), eps + float(log_b))


def _difference(log_a: float, log_b: float) -> float:
    """``exp(log_a) - exp(log_b)`` without cancelling the leading digits when both are close."""
    return -math.exp(log_a) * math.expm1(log_b - log_a)


def gaussian_delta(epsilon: float, *, mu: float) -> float:
    """Exact ``δ(ε)`` of a Gaussian mechanism with ``μ = Δ/σ`` (Balle & Wang 2018, Theorem 8).

    ``δ = Φ(-ε/μ + μ/2) - e^ε·Φ(-ε/μ - μ/2)``. A composition of Gaussian mechanisms is exactly one Gaussian
    mechanism with ``μ = sqrt(Σ Δ_i²/σ_i²)`` (Dong, Roth & Su 2019), so this is the exact privacy profile any
    RDP bound for such compositions must dominate.
    """
    eps = non_negative("epsilon", epsilon)
    m = positive("mu", mu)
    return _difference(
        float(special.log_ndtr(-eps / m + m / 2)), eps + float(special.log_ndtr(-eps / m - m / 2))
    )
