"""Data-dependent analysis of PATE's GNMax and threshold steps (Papernot et al. 2018, "Scalable Private
Learning with PATE", ICLR 2018).

* :func:`log_q_gnmax` — Proposition 7: the union bound on ``q̃ = Pr[noisy argmax ≠ i*]``, capped at
  ``1 - 1/c`` (never worse than a uniform guess).
* :func:`rdp_gnmax_data_dependent` — Theorem 6 with Proposition 10's choice of orders
  ``μ2 = σ·sqrt(log(1/q̃))``, ``μ1 = μ2 + 1``; falls back to the data-independent ``λ/σ²`` wherever the
  theorem's conditions fail.
* :func:`log_pass_probability` and :func:`rdp_threshold_data_dependent` — the same theorem applied to the
  binary outcome of the threshold step (sensitivity 1, so the data-independent curve is ``λ/(2σ1²)``).

These values depend on the vote histograms, so they are themselves private: a data-dependent ε is
*unsanitised* unless a smooth-sensitivity bound is added (Papernot et al. 2018, Section 4). The federation
never sees histograms and charges only data-independent costs; central research runs may report these next
to them, labelled as unsanitised.

Every function takes vote *histograms* (per-class counts), not per-teacher labels. ``noise="continuous"``
reproduces the paper's Gaussian analysis; ``noise="discrete"`` uses the exact tails of the integer noise
``N_Z(0, σ²)`` the system actually adds (CKS 2020); the RDP parameters of Theorem 6 are the same for both.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.analysis import _special as special
from capc_common.privacy.analysis._checks import histograms, non_negative, positive
from capc_common.privacy.analysis.discrete_gaussian import (
    discrete_gaussian_log_sf,
    discrete_gaussian_log_sf_difference,
)
from capc_common.privacy.analysis.orders import as_orders

__all__ = [
    "Noise",
    "log_pass_probability",
    "log_q_gnmax",
    "rdp_gnmax_data_dependent",
    "rdp_threshold_data_dependent",
]

Noise = Literal["continuous", "discrete"]


def _noise(noise: str) -> Noise:
    if noise not in ("continuous", "discrete"):
        raise InputError(f"noise must be 'continuous' or 'discrete', got {noise!r}")
    return noise  # type: ignore[return-value]


def _log1mexp(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``log(1 - exp(x))`` for ``x ≤ 0``, accurate at both ends (Mächler 2012)."""
    return np.where(x > -math.log(2), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def log_q_gnmax(counts: npt.ArrayLike, *, sigma: float, noise: str = "continuous") -> npt.NDArray[np.float64]:
    """``log q̃``, an upper bound on the log-probability that GNMax does not output the top class.

    Union bound over the other classes ``j`` of ``Pr[n_j + Z_j ≥ n_i* + Z_i*]`` (Prop. 7), capped at
    ``log(1 - 1/c)``. For continuous noise each term is ``Φc((n_i* - n_j)/(√2σ))``; for discrete noise it is
    the exact tail of the difference of two ``N_Z(0, σ²)`` (ties counted as losses).

    Args:
        counts: one vote histogram ``(c,)`` or a batch ``(B, c)``.
        sigma: σ of the noise added to each count.
        noise: ``"continuous"`` (the paper) or ``"discrete"`` (integer noise, as deployed).

    Returns:
        ``log q̃``: a 0-d array for one histogram, ``(B,)`` for a batch.

    Raises:
        InputError: not histograms, σ ≤ 0 or an unknown noise kind.
    """
    hist = histograms(counts)
    s = positive("sigma", sigma)
    kind = _noise(noise)
    batch = np.atleast_2d(hist)
    classes = batch.shape[1]
    top = np.argmax(batch, axis=1)
    gaps = batch[np.arange(batch.shape[0]), top][:, None] - batch  # n_i* - n_j ≥ 0
    others = np.ones_like(batch, dtype=bool)
    others[np.arange(batch.shape[0]), top] = False
    if kind == "continuous":
        terms = special.log_ndtr(-gaps / (math.sqrt(2) * s))
    else:
        terms = discrete_gaussian_log_sf_difference(gaps, sigma=s)
    terms = np.where(others, terms, -np.inf)
    log_q = np.minimum(special.logsumexp(terms, axis=1), math.log1p(-1 / classes))
    return log_q.reshape(hist.shape[:-1])


def rdp_gnmax_data_dependent(orders: npt.ArrayLike, *, log_q: float, sigma: float) -> npt.NDArray[np.float64]:
    """Data-dependent RDP of one GNMax answer (Papernot et al. 2018, Theorem 6 with Proposition 10).

    With ``ε_i = μ_i/σ²`` (GNMax is ``(μ, μ/σ²)``-RDP for every μ: L2 sensitivity √2), for
    ``λ < μ1``, ``μ2 > 1``, ``q̃ e^{ε2} < 1`` and ``q̃ ≤ e^{(μ2-1)ε2} / (μ1/(μ1-1) · μ2/(μ2-1))^{μ2}``:

        RDP(λ) ≤ 1/(λ-1) · log((1-q̃)·A^{λ-1} + q̃·B^{λ-1}),
        A = (1-q̃)/(1 - (q̃ e^{ε2})^{(μ2-1)/μ2}),   B = e^{ε1}/q̃^{1/(μ1-1)},

    and never more than the data-independent ``λ/σ²``. ``log_q = -inf`` (a certain outcome) costs 0.

    Args:
        orders: orders λ > 1.
        log_q: ``log q̃`` from :func:`log_q_gnmax` (≤ 0).
        sigma: σ of the GNMax noise.

    Returns:
        RDP at each order (shape of ``orders``).

    Raises:
        InputError: bad orders, σ ≤ 0 or ``log_q > 0``.
    """
    lam = as_orders(orders)
    s = positive("sigma", sigma)
    lq = float(log_q)
    if math.isnan(lq) or lq > 0:
        raise InputError(f"log_q must be a log-probability (≤ 0), got {log_q!r}")
    variance = s * s
    if lq == -math.inf:
        return np.zeros_like(lam)
    fallback = lam / variance
    mu2 = s * math.sqrt(-lq)
    mu1 = mu2 + 1
    eps1, eps2 = mu1 / variance, mu2 / variance
    if mu2 <= 1 or -lq <= eps2:
        return fallback
    log_q_limit = (mu2 - 1) * eps2 - mu2 * (math.log1p(1 / (mu1 - 1)) + math.log1p(1 / (mu2 - 1)))
    if lq > log_q_limit:
        return fallback
    log_1mq = float(_log1mexp(np.array(lq)))
    log_a = log_1mq - float(_log1mexp(np.array((lq + eps2) * (1 - 1 / mu2))))
    log_b = eps1 - lq / (mu1 - 1)
    bound = np.logaddexp(log_1mq + (lam - 1) * log_a, lq + (lam - 1) * log_b) / (lam - 1)
    return np.where(lam < mu1, np.minimum(bound, fallback), fallback)


def log_pass_probability(
    counts: npt.ArrayLike, *, threshold: float, sigma1: float, noise: str = "continuous"
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(log p, log(1 - p))`` with ``p = Pr[max_j n_j + Z ≥ T]``, the threshold step's pass probability.

    Both are tail probabilities evaluated directly (a log-CDF for ``1 - p``), never ``log(1 - p)`` from an
    ``exp`` that rounded to 1. Continuous noise: ``p = Φc((T - m)/σ1)``. Discrete noise: ``Z`` is an integer,
    so ``p = Pr[Z ≥ ⌈T⌉ - m]``.

    Args:
        counts: one vote histogram ``(c,)`` or a batch ``(B, c)``; ``m`` is its (integer) maximum.
        threshold: T.
        sigma1: σ1 of the threshold noise.
        noise: ``"continuous"`` or ``"discrete"``.

    Returns:
        Two arrays, 0-d for one histogram or ``(B,)`` for a batch.
    """
    hist = histograms(counts)
    t = non_negative("threshold", threshold)
    s = positive("sigma1", sigma1)
    top = hist.max(axis=-1)
    if _noise(noise) == "continuous":
        z = (top - t) / s
        return np.asarray(special.log_ndtr(z)), np.asarray(special.log_ndtr(-z))
    need = math.ceil(t) - top  # pass iff Z ≥ need; fail iff Z ≤ need - 1 iff -Z ≥ 1 - need
    return discrete_gaussian_log_sf(need, sigma=s), discrete_gaussian_log_sf(1 - need, sigma=s)


def rdp_threshold_data_dependent(
    orders: npt.ArrayLike, *, log_pass: float, log_fail: float, sigma1: float
) -> npt.NDArray[np.float64]:
    """Data-dependent RDP of one threshold step (Papernot et al. 2018, Theorem 6 on its binary outcome).

    The less likely of pass/fail plays the role of ``q̃``; the threshold step releases a function of the
    maximum vote (sensitivity 1), so it is ``(μ, μ/(2σ1²))``-RDP: Theorem 6 applies with σ replaced by
    ``√2·σ1``, and the result never exceeds ``λ/(2σ1²)``.

    Args:
        orders: orders λ > 1.
        log_pass: ``log p`` from :func:`log_pass_probability`.
        log_fail: ``log(1 - p)`` from :func:`log_pass_probability`.
        sigma1: σ1 of the threshold noise.

    Returns:
        RDP at each order (shape of ``orders``).
    """
    s = positive("sigma1", sigma1)
    log_q = min(float(log_pass), float(log_fail))
    return rdp_gnmax_data_dependent(orders, log_q=log_q, sigma=math.sqrt(2) * s)
