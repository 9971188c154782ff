"""RDP of *any* mechanism run on a Poisson sample (Zhu & Wang 2019, "Poisson Subsampled Rényi Differential
Privacy", ICML, Theorem 6: the general upper bound).

Each record is included independently with probability ``q``; the base mechanism is ``(α, ε(α))``-RDP under
add/remove adjacency. For integer ``α ≥ 2`` the subsampled mechanism is ``(α, log(A_α)/(α-1))``-RDP with

    A_α ≤ (1-q)^α + α q (1-q)^(α-1) + C(α,2) q² (1-q)^(α-2) e^(ε(2))
          + 3 Σ_{ℓ=3}^{α} C(α,ℓ) q^ℓ (1-q)^(α-ℓ) e^((ℓ-1) ε(ℓ)).

For the continuous Gaussian the same expansion *without* the factor 3 is exact (Mironov, Talwar & Zhang 2019;
:func:`~capc_common.privacy.analysis.rdp_subsampled_gaussian`); the factor 3 is the price of not knowing the
base mechanism's privacy-loss distribution. Fractional orders are bounded from the neighbouring integers by
the convexity of ``α ↦ log A_α`` (``log A_1 = 0``), and the result is capped by the base mechanism's own
curve (subsampling never hurts).

Why this matters here: the exact subsampled-Gaussian analysis is proven for the continuous Gaussian. The
engine adds *discrete* Gaussian noise ``N_Z(0, σ²)`` to integer (fixed-point) sums, whose RDP at every order
is at most the continuous one, ``αΔ²/(2σ²)`` for an integer-valued query of L2 sensitivity Δ (Canonne, Kamath
& Steinke 2020: one coordinate; independent coordinates add up). Plugging that curve into the general bound
(:func:`rdp_subsampled_discrete_gaussian`) is rigorous for Private-kNN's and secure-aggregation DP-SGD's
discrete noise, at a cost measured in ``docs/mechanisms.md``.

Example:
    >>> import numpy as np
    >>> from capc_common.privacy.analysis import rdp_subsampled_gaussian
    >>> a = rdp_subsampled_discrete_gaussian(np.array([2.0]), sampling_rate=0.01, noise_multiplier=1.0)
    >>> b = rdp_subsampled_gaussian(np.array([2.0]), sampling_rate=0.01, noise_multiplier=1.0)
    >>> bool(abs(a[0] - b[0]) < 1e-15)  # at α = 2 the general bound is exact for the Gaussian
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.analysis import _special as special
from capc_common.privacy.analysis._checks import positive
from capc_common.privacy.analysis.orders import as_orders

__all__ = ["rdp_poisson_subsampled", "rdp_subsampled_discrete_gaussian"]

BaseRdp = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]

#: Beyond this integer order the bound is not evaluated term by term (its cost grows with α); such orders
#: get the base mechanism's own curve, which is always valid.
MAX_INTEGER_ORDER = 4096


def _log_a_integer(order: int, q: float, base: BaseRdp) -> float:
    """``log A_α`` of Theorem 6 at integer ``α ≥ 2``."""
    ell = np.arange(order + 1, dtype=np.float64)
    eps = np.zeros(order + 1)
    if order >= 2:
        eps[2:] = base(ell[2:])
    log_binom = special.gammaln(order + 1) - special.gammaln(ell + 1) - special.gammaln(order - ell + 1)
    log_terms = log_binom + ell * math.log(q) + (order - ell) * math.log1p(-q) + (ell - 1) * eps
    log_terms[0] = order * math.log1p(-q)  # (ℓ - 1)ε(ℓ) does not apply to ℓ = 0, 1: those terms carry no ε
    log_terms[1] = math.log(order) + math.log(q) + (order - 1) * math.log1p(-q)
    log_terms[3:] += math.log(3.0)
    return float(special.logsumexp(log_terms))


def rdp_poisson_subsampled(
    orders: npt.ArrayLike, *, sampling_rate: float, base_rdp: BaseRdp
) -> npt.NDArray[np.float64]:
    """RDP of a base mechanism run on a Poisson sample of rate ``q`` (Zhu & Wang 2019, Theorem 6).

    Args:
        orders: orders λ > 1.
        sampling_rate: inclusion probability ``q ∈ [0, 1]`` of each record.
        base_rdp: the base mechanism's RDP curve under add/remove adjacency, a vectorised function of an
            array of orders (called at integer orders and at ``orders``).

    Returns:
        RDP at each order (shape of ``orders``): the general upper bound, capped by ``base_rdp(orders)``.

    Raises:
        InputError: bad orders or ``q`` outside ``[0, 1]``.
    """
    lam = as_orders(orders)
    try:
        q = float(sampling_rate)
    except (TypeError, ValueError) as exc:
        raise InputError(f"sampling_rate must be a probability, got {sampling_rate!r}") from exc
    if not 0 <= q <= 1:
        raise InputError(f"sampling_rate must be in [0, 1], got {sampling_rate!r}")
    direct = np.asarray(base_rdp(lam), dtype=np.float64)
    if q == 0:
        return np.zeros_like(lam)
    if q == 1:
        return direct
    cache: dict[int, float] = {1: 0.0}

    def log_a(order: int) -> float:
        if order not in cache:
            cache[order] = _log_a_integer(order, q, base_rdp)
        return cache[order]

    out = np.empty(lam.size, dtype=np.float64)
    for i, order in enumerate(lam.ravel().tolist()):
        low = math.floor(order)
        if low + 1 > MAX_INTEGER_ORDER:
            out[i] = math.inf
            continue
        t = order - low
        bound = log_a(low) if t == 0 else (1 - t) * log_a(low) + t * log_a(low + 1)
        out[i] = max(bound, 0.0) / (order - 1)
    return np.minimum(out.reshape(lam.shape), direct)


def rdp_subsampled_discrete_gaussian(
    orders: npt.ArrayLike, *, sampling_rate: float, noise_multiplier: float
) -> npt.NDArray[np.float64]:
    """RDP of one step of an integer sum over a Poisson sample plus discrete Gaussian noise.

    The base mechanism — an integer-valued sum of L2 sensitivity Δ plus independent ``N_Z(0, σ²)`` per
    coordinate — is ``(α, αΔ²/(2σ²))``-RDP at every order (Canonne, Kamath & Steinke 2020), so this is
    :func:`rdp_poisson_subsampled` with that curve.

    Args:
        orders: orders λ > 1.
        sampling_rate: inclusion probability ``q``.
        noise_multiplier: ``σ/Δ``.

    Returns:
        RDP at each order.
    """
    z = positive("noise_multiplier", noise_multiplier)

    def base(alpha: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return alpha / (2 * z * z)

    return rdp_poisson_subsampled(orders, sampling_rate=sampling_rate, base_rdp=base)
