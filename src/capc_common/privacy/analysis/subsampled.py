"""RDP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar & Zhang 2019, "Rényi Differential
Privacy of the Sampled Gaussian Mechanism", Sections 3.2–3.3).

Each record is included independently with probability ``q`` and the sum gets ``N(0, σ²)`` noise, σ in
units of the L2 sensitivity (the noise multiplier). With ``A_λ = E_{z∼μ0}[((1-q) + q·μ1(z)/μ0(z))^λ]``,
``μ0 = N(0, σ²)``, ``μ1 = N(1, σ²)``, the RDP is ``log(A_λ)/(λ-1)``:

* integer λ (Section 3.2): ``A_λ = Σ_{k=0}^{λ} C(λ,k) (1-q)^{λ-k} q^k exp((k²-k)/(2σ²))``;
* fractional λ (Section 3.3): the same expectation split at ``z0 = σ² log(1/q - 1) + 1/2`` into two series
  with terms ``C(λ,k)(1-q)^{λ-k} q^k e^{(k²-k)/(2σ²)}·½erfc((k - z0)/(√2σ))`` and
  ``C(λ,k) q^{λ-k} (1-q)^k e^{((λ-k)²-(λ-k))/(2σ²)}·½erfc((z0 - (λ-k))/(√2σ))``, summed with their signs
  until the terms vanish.

Private-kNN answers queries from a Poisson sample of the private data; its accounting uses this curve with
σ expressed per unit of its vote histogram's sensitivity.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import special

from capc_common.errors import InputError
from capc_common.privacy.analysis._checks import positive
from capc_common.privacy.analysis.orders import as_orders

__all__ = ["rdp_subsampled_gaussian"]

_STOP = 40.0  # stop a series once its terms are e^-40 below the running sum
_MAX_CANCELLATION = math.log(1e8)


def _log_binom(
    n: float, k: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``log|C(n, k)|`` and ``sign(C(n, k))`` for real n and integer k ≥ 0."""
    # gammaln is log|Γ|; the sign of C(n, k) for k > n alternates like (-1)^(k - ⌈n⌉).
    log_abs = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
    return log_abs, np.sign(special.binom(n, k))


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


def _signed_log_sum(log_abs: npt.NDArray[np.float64], sign: npt.NDArray[np.float64]) -> float:
    """``log Σ sign_i·exp(log_abs_i)``, or the log of the sum of magnitudes if signs cancelled too much.

    The magnitudes' sum is an upper bound (what dp-accounting uses for every fractional order); it is taken
    when cancellation would leave fewer than about eight correct digits, so rounding never under-reports.
    """
    magnitude = float(special.logsumexp(log_abs))
    total, total_sign = special.logsumexp(log_abs, b=sign, return_sign=True)
    if total_sign <= 0 or magnitude - float(total) > _MAX_CANCELLATION:
        return magnitude
    return float(total)


def _log_a_fractional(q: float, sigma: float, order: float) -> float:
    z0 = sigma * sigma * math.log(1 / q - 1) + 0.5
    log_q, log_1mq = math.log(q), math.log1p(-q)
    terms: list[npt.NDArray[np.float64]] = []
    signs: list[npt.NDArray[np.float64]] = []
    start = 0
    chunk = max(64, math.ceil(order) + 16)
    while True:
        k = np.arange(start, start + chunk, dtype=np.float64)
        log_c, sign = _log_binom(order, k)
        j = order - k
        log_first = (
            log_c
            + k * log_q
            + j * log_1mq
            + (k * k - k) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((k - z0) / (math.sqrt(2) * sigma))
        )
        log_second = (
            log_c
            + j * log_q
            + k * log_1mq
            + (j * j - j) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        )
        terms += [log_first, log_second]
        signs += [sign, sign]
        start += chunk
        running = _signed_log_sum(np.concatenate(terms), np.concatenate(signs))
        tail = max(float(log_first[-16:].max()), float(log_second[-16:].max()))
        if start > order and tail < running - _STOP:
            return running
        if start > 100_000:
            raise ArithmeticError(f"subsampled-Gaussian series did not converge at order {order}")


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
