"""The sum of independent discrete Gaussians: what the noise of a release split between parties guarantees.

Kairouz, Liu & Steinke 2021 ("The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure
Aggregation", ICML; arXiv:2102.06387, Theorem 1 and Proposition 14): a sum of discrete Gaussians is not a
discrete Gaussian, but for ``n`` independent ``N_Z(0, σ²)`` per coordinate (``σ ≥ 1/2``) of a
``d``-dimensional integer query of L2 sensitivity ``Δ``, the sum is ``(α, ε(α))``-RDP at every order with

    ε(α) = α/2 · (Δ/(√n σ) + τ √d)²,   τ = 10 Σ_{k=1}^{n-1} exp(−2π² σ² k/(k+1))

(the third of the proposition's three bounds, the one linear in ``α``: a zCDP bound, so it composes and
enters the Poisson-subsampling bound like a Gaussian's). Without ``τ`` it is the Gaussian of variance
``nσ²``; ``τ`` is below 1e-40 once ``σ ≥ 3``, so for the fixed-point sums of the release mechanisms it is
exactly the continuous bound, and it matters only for small ``σ`` (a count of records, a vote count).

:func:`share_sigma` uses it to split one planned discrete Gaussian ``N_Z(0, σ²)`` between parties that do not
collude: each draws ``N_Z(0, s²)`` with ``s`` the smallest (up to ``2^-40`` relative) for which the sum is
at least as private, by this bound, as the planned noise — ``s = σ/√n`` whenever ``τ`` is negligible, so
the total variance (the utility) is the plan's. Where the bound cannot reach the plan (``σ/√n < 1/2``, or
``τ`` too large), each part is the whole ``σ`` and the sum is at least as private by post-processing of
either part alone; the total variance is then ``nσ²``.

Example:
    >>> import numpy as np
    >>> one = rdp_distributed_discrete_gaussian(np.array([4.0]), sigma=50.0, parties=1, sensitivity=10.0)
    >>> float(one[0]) == 4.0 * 10.0**2 / (2 * 50.0**2)  # one party: the discrete Gaussian's own bound
    True
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.analysis._checks import count, positive
from capc_common.privacy.analysis.orders import as_orders

__all__ = ["distributed_tau", "rdp_distributed_discrete_gaussian", "share_sigma", "zcdp_distributed"]

#: Kairouz, Liu & Steinke's bound holds for parts of ``σ ≥ 1/2``.
MIN_PART_SIGMA = 0.5
#: Relative margin by which a part's σ exceeds the solution found in floating point (2^-40: far above the
#: few ulps of error in ``τ`` and the square roots, far below any effect on utility).
_MARGIN = 2.0**-40


def distributed_tau(*, sigma: float, parties: int) -> float:
    """``τ = 10 Σ_{k=1}^{n-1} exp(−2π²σ²k/(k+1))`` (Kairouz, Liu & Steinke 2021, Theorem 1)."""
    s = positive("sigma", sigma)
    n = count("parties", parties, minimum=1)
    return 10.0 * math.fsum(math.exp(-2 * math.pi**2 * s * s * k / (k + 1)) for k in range(1, n))


def zcdp_distributed(*, sigma: float, parties: int, sensitivity: float, dimension: int) -> float:
    """``ρ = ½ (Δ/(√n σ) + τ √d)²``: the zCDP of ``Δ``-sensitive integer sums plus the sum of ``parties``
    independent ``N_Z(0, σ²)`` per coordinate (Kairouz, Liu & Steinke 2021, Proposition 14).

    Raises:
        InputError: ``σ`` below 1/2 (outside the proposition) or a non-positive argument.
    """
    s = positive("sigma", sigma)
    if s < MIN_PART_SIGMA:
        raise InputError(
            f"the bound for a sum of discrete Gaussians needs each part's σ ≥ {MIN_PART_SIGMA}, got {s!r}"
        )
    n = count("parties", parties, minimum=1)
    d = count("dimension", dimension, minimum=1)
    delta = positive("sensitivity", sensitivity)
    return 0.5 * (delta / (math.sqrt(n) * s) + distributed_tau(sigma=s, parties=n) * math.sqrt(d)) ** 2


def rdp_distributed_discrete_gaussian(
    orders: npt.ArrayLike, *, sigma: float, parties: int, sensitivity: float, dimension: int = 1
) -> npt.NDArray[np.float64]:
    """RDP at each order of an integer query plus ``parties`` independent ``N_Z(0, σ²)`` per coordinate:
    ``α ρ`` with :func:`zcdp_distributed`'s ``ρ``.

    Args:
        orders: orders α > 1.
        sigma: σ of each party's part.
        parties: how many parts are summed (``n``).
        sensitivity: L2 sensitivity ``Δ`` of the query (integer units).
        dimension: coordinates ``d`` of the query.
    """
    rho = zcdp_distributed(sigma=sigma, parties=parties, sensitivity=sensitivity, dimension=dimension)
    return as_orders(orders) * rho


def share_sigma(sigma: float, *, sensitivity: float, dimension: int, parties: int = 2) -> float:
    """σ of each of ``parties`` parts whose sum is at least as private as one ``N_Z(0, σ²)`` (module doc).

    The smallest ``s > σ/√n`` (to ``2^-40`` relative) with :func:`zcdp_distributed` at ``s`` below the planned
    ``Δ²/(2σ²)`` by at least ``2^-40`` of it, found by bisection; ``σ`` itself where no ``s < σ`` does (each
    part alone then carries the plan's guarantee). Never below ``σ/√n``: the parts' total variance is at
    least the plan's.

    Args:
        sigma: the planned σ (integer units).
        sensitivity: the query's L2 sensitivity ``Δ``.
        dimension: the query's coordinates ``d``.
        parties: parts summed.
    """
    planned = positive("sigma", sigma)
    delta = positive("sensitivity", sensitivity)
    d = count("dimension", dimension, minimum=1)
    n = count("parties", parties, minimum=1)
    if n == 1:
        return planned
    target = delta * delta / (2 * planned * planned)

    def private_enough(s: float) -> bool:
        if s < MIN_PART_SIGMA:
            return False
        rho = zcdp_distributed(sigma=s, parties=n, sensitivity=delta, dimension=d)
        return rho <= target * (1 - _MARGIN)

    low = planned / math.sqrt(n) * (1 + _MARGIN)
    if private_enough(low):
        return low
    high = planned * (1 - _MARGIN)
    if not private_enough(high):
        return planned
    while high / low > 1 + _MARGIN:
        mid = math.sqrt(low * high)
        if private_enough(mid):
            high = mid
        else:
            low = mid
    return high
