"""RDP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar & Zhang 2019, "Rényi Differential
Privacy of the Sampled Gaussian Mechanism", Sections 3.2–3.3).

Each record is included independently with probability ``q`` and the sum gets ``N(0, σ²)`` noise, σ in
units of the L2 sensitivity (the noise multiplier). With ``A_λ = E_{z∼μ0}[((1-q) + q·μ1(z)/μ0(z))^λ]``,
``μ0 = N(0, σ²)``, ``μ1 = N(1, σ²)``, the RDP is ``log(A_λ)/(λ-1)``:

* integer λ (Section 3.2): ``A_λ = Σ_{k=0}^{λ} C(λ,k) (1-q)^{λ-k} q^k exp((k²-k)/(2σ²))``;
* fractional λ (Section 3.3): the same expectation split at ``z0 = σ² log(1/q - 1) + 1/2`` into two series
  with terms ``C(λ,k)(1-q)^{λ-k} q^k e^{(k²-k)/(2σ²)}·½erfc((k - z0)/(√2σ))`` and
  ``C(λ,k) q^{λ-k} (1-q)^k e^{((λ-k)²-(λ-k))/(2σ²)}·½erfc((z0 - (λ-k))/(√2σ))``, summed with their signs
  until the terms vanish, plus the last term as a bound on the alternating tail. (dp-accounting sums the
  magnitudes instead: also an upper bound, but tens of percent larger below λ = 2.) Where the series
  converges too slowly, the convexity of ``λ ↦ log A_λ`` bounds it from the neighbouring integer orders.

Private-kNN answers queries from a Poisson sample of the private data; its accounting uses this curve with
σ expressed per unit of its vote histogram's sensitivity.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.analysis import _special as special
from capc_common.privacy.analysis._checks import positive
from capc_common.privacy.analysis.orders import as_orders

__all__ = ["rdp_subsampled_gaussian"]

_TOLERANCE = math.log(1e-16)  # stop once a term is below 1e-16 of the partial sum
_CHUNK = 8192
_MAX_TERMS = 1 << 20


def _log_a_integer(q: float, sigma: float, order: int) -> float:
    k = np.arange(order + 1, dtype=np.float64)
    log_terms = (
        special.gammaln(order + 1)
        - special.gammaln(k + 1)
        - special.gammaln(order - k + 1)
        + k * math.log(q)
        + (order - k) * math.log1p(-q)
        + (k * k - k) / (2 * sigma * sigma)
    )
    return float(special.logsumexp(log_terms))


def _log_a_convex(q: float, sigma: float, order: float) -> float:
    """Upper bound on ``log A_λ`` from the convexity of ``λ ↦ log A_λ`` between neighbouring integers.

    ``log A_λ = log E[X^λ]`` is convex in λ (Hölder), and ``log A_1 = 0``.
    """
    low = math.floor(order)
    log_low = 0.0 if low == 1 else _log_a_integer(q, sigma, low)
    log_high = _log_a_integer(q, sigma, low + 1)
    t = order - low
    return (1 - t) * log_low + t * log_high


def _log_a_fractional(q: float, sigma: float, order: float) -> float:
    """``log A_λ`` for fractional λ from the series of Section 3.3, or the convexity bound.

    The two series share the coefficient ``C(λ, k)``, whose sign is ``(-1)^(k - ⌈λ⌉)`` past ``k = ⌈λ⌉``:
    the combined terms alternate, so once their magnitudes decrease the truncation error is below the last
    term, which is added to make the result an upper bound. Slowly converging cases (terms decaying only
    polynomially, e.g. large ``q``) that do not reach 1e-16 within 2^20 terms use :func:`_log_a_convex`.
    """
    z0 = sigma * sigma * math.log(1 / q - 1) + 0.5
    log_q, log_1mq = math.log(q), math.log1p(-q)
    first_negative = math.ceil(order)
    total, total_sign = -math.inf, 1.0
    start = 0
    while start < _MAX_TERMS:
        k = np.arange(start, start + _CHUNK, dtype=np.float64)
        j = order - k
        log_c = special.gammaln(order + 1) - special.gammaln(k + 1) - special.gammaln(j + 1)
        sign = np.where((k >= first_negative) & ((k - first_negative) % 2 == 1), -1.0, 1.0)
        log_first = (
            k * log_q + j * log_1mq + (k * k - k) / (2 * sigma**2)
            + _log_erfc((k - z0) / (math.sqrt(2) * sigma))
        )  # fmt: skip
        log_second = (
            j * log_q + k * log_1mq + (j * j - j) / (2 * sigma**2)
            + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        )  # fmt: skip
        log_term = log_c + math.log(0.5) + np.logaddexp(log_first, log_second)
        chunk_sum, chunk_sign = special.logsumexp(log_term, b=sign, return_sign=True)
        if chunk_sign != 0:
            total, total_sign = special.logsumexp(
                [total, chunk_sum], b=[total_sign, chunk_sign], return_sign=True
            )
        start += _CHUNK
        tail = log_term[k > first_negative]
        if (
            total_sign > 0
            and tail.size > 1
            and bool(np.all(np.diff(tail) <= 0))
            and float(tail[-1]) < float(total) + _TOLERANCE
        ):
            return float(np.logaddexp(total, tail[-1]))
    return _log_a_convex(q, sigma, order)


def _log_erfc(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``log erfc(x)`` without underflow for large x (``erfc(x) = 2Φ(-x√2)``)."""
    return math.log(2) + special.log_ndtr(-x * math.sqrt(2))


def rdp_subsampled_gaussian(
    orders: npt.ArrayLike, *, sampling_rate: float, noise_multiplier: float
) -> npt.NDArray[np.float64]:
    """RDP of one Poisson-subsampled Gaussian step (Mironov, Talwar & Zhang 2019).

    Args:
        orders: orders λ > 1.
        sampling_rate: inclusion probability ``q ∈ [0, 1]`` of each record.
        noise_multiplier: σ divided by the L2 sensitivity.

    Returns:
        RDP at each order (shape of ``orders``); ``λ/(2σ²)`` at ``q = 1`` and 0 at ``q = 0``.

    Raises:
        InputError: bad orders, ``q`` outside ``[0, 1]`` or σ ≤ 0.
    """
    lam = as_orders(orders)
    sigma = positive("noise_multiplier", noise_multiplier)
    try:
        q = float(sampling_rate)
    except (TypeError, ValueError) as exc:
        raise InputError(f"sampling_rate must be a probability, got {sampling_rate!r}") from exc
    if not 0 <= q <= 1:
        raise InputError(f"sampling_rate must be in [0, 1], got {sampling_rate!r}")
    if q == 0:
        return np.zeros_like(lam)
    if q == 1:
        return lam / (2 * sigma * sigma)
    out = np.empty(lam.size, dtype=np.float64)
    for i, order in enumerate(lam.ravel().tolist()):
        if float(order).is_integer():
            log_a = _log_a_integer(q, sigma, int(order))
        else:
            log_a = _log_a_fractional(q, sigma, order)
        out[i] = max(log_a, 0.0) / (order - 1)
    return np.minimum(out.reshape(lam.shape), lam / (2 * sigma * sigma))
