"""Exact data-independent cost of the threshold (screening) step of Confident-GNMax.

The step releases one bit, ``pass = [m + Z ≥ T]``, where ``m`` is the top vote count. Its Rényi divergence
between neighbours is that of two Bernoulli distributions,

    D_λ(Bern(p) ‖ Bern(p')) = 1/(λ-1) · log(p^λ p'^{1-λ} + (1-p)^λ (1-p')^{1-λ}),

with ``p = Pr[pass | top = m]`` and ``p' = Pr[pass | top = m ± 1]`` (one teacher changing its vote moves the
top count by at most one). Without seeing any histogram, the cost is the supremum over every feasible top
count ``m ∈ [⌈k_min/c⌉, k]`` and both neighbours — the analysis of Private-kNN's noisy screening (Zhu et al.
2020), done over *all* ``m``: the public Private-kNN code checks only two values of ``m`` and under-reports.

By the data-processing inequality the result never exceeds the Gaussian bound ``λ/(2σ1²)``; it is smaller
mainly at high orders.

Discrete noise: the guardian adds ``Z ~ N_Z(0, σ1²)``, an integer, so ``p = Pr[Z ≥ ⌈T⌉ - m]`` is a discrete
Gaussian tail, not ``Φc((T - m)/σ1)``. The continuous CDF is *not* a safe stand-in: the two sets of pass
probabilities differ, and nothing orders their divergences in general. ``noise="discrete"`` (the default
wherever the system charges a budget) therefore uses the exact discrete tails; ``noise="continuous"``
reproduces the continuous-noise analysis and the reference figures. Both are below ``λ/(2σ1²)``, which holds
for either noise (CKS 2020 give the discrete Gaussian the same RDP as the continuous one).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import special

from capc_common.errors import InputError
from capc_common.privacy.analysis._checks import count, non_negative, positive
from capc_common.privacy.analysis.discrete_gaussian import discrete_gaussian_log_sf
from capc_common.privacy.analysis.orders import as_orders
from capc_common.privacy.analysis.pate import _noise

__all__ = ["rdp_bernoulli", "rdp_screening_at", "rdp_screening_exact"]


def rdp_bernoulli(
    orders: npt.ArrayLike,
    *,
    log_p: npt.ArrayLike,
    log_1mp: npt.ArrayLike,
    log_q: npt.ArrayLike,
    log_1mq: npt.ArrayLike,
) -> npt.NDArray[np.float64]:
    """``D_λ(Bern(p) ‖ Bern(q))`` from log-probabilities, broadcast over pairs × orders.

    Args:
        orders: orders λ > 1, shape ``(L,)`` (or scalar).
        log_p: ``log p`` for each pair, shape ``(P,)`` (or scalar); likewise the other three.

    Returns:
        Shape ``(P, L)`` (squeezed like the inputs: scalars give ``(L,)``).
    """
    lam = as_orders(orders)
    arrays = [np.asarray(v, dtype=np.float64) for v in (log_p, log_1mp, log_q, log_1mq)]
    lp, l1p, lq, l1q = (a.reshape(a.shape + (1,) * lam.ndim) for a in arrays)
    with np.errstate(invalid="ignore"):
        first = np.where(lp == -np.inf, -np.inf, lam * lp + (1 - lam) * lq)
        second = np.where(l1p == -np.inf, -np.inf, lam * l1p + (1 - lam) * l1q)
    return np.maximum(np.logaddexp(first, second) / (lam - 1), 0.0)


def _pass_logs(
    tops: npt.NDArray[np.int64], *, threshold: float, sigma1: float, noise: str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``log Pr[pass]`` and ``log Pr[fail]`` for each top count, each as a direct tail probability."""
    if _noise(noise) == "continuous":
        z = (tops - threshold) / sigma1
        return special.log_ndtr(z), special.log_ndtr(-z)
    need = math.ceil(threshold) - tops
    return discrete_gaussian_log_sf(need, sigma=sigma1), discrete_gaussian_log_sf(1 - need, sigma=sigma1)


def rdp_screening_at(
    orders: npt.ArrayLike,
    *,
    top: int,
    neighbour: int,
    threshold: float,
    sigma1: float,
    noise: str = "continuous",
) -> npt.NDArray[np.float64]:
    """``D_λ(pass | top ‖ pass | neighbour)`` for two given top counts (one term of the supremum).

    Args:
        orders: orders λ > 1.
        top: top count m of the dataset.
        neighbour: top count of the neighbouring dataset (``m ± 1``).
        threshold: T.
        sigma1: σ1 of the threshold noise.
        noise: ``"continuous"`` or ``"discrete"``.
    """
    lam = as_orders(orders)
    tops = np.array([count("top", top), count("neighbour", neighbour)], dtype=np.int64)
    log_pass, log_fail = _pass_logs(
        tops, threshold=non_negative("threshold", threshold), sigma1=positive("sigma1", sigma1), noise=noise
    )
    return rdp_bernoulli(lam, log_p=log_pass[0], log_1mp=log_fail[0], log_q=log_pass[1], log_1mq=log_fail[1])


def rdp_screening_exact(
    orders: npt.ArrayLike,
    *,
    teachers: int,
    classes: int,
    threshold: float,
    sigma1: float,
    noise: str = "discrete",
    min_teachers: int | None = None,
) -> npt.NDArray[np.float64]:
    """Data-independent RDP of one screening step: the supremum over feasible top counts and neighbours.

    Args:
        orders: orders λ > 1.
        teachers: the most votes a query can get (k).
        classes: number of classes c (the top count is at least ``⌈k/c⌉``).
        threshold: T.
        sigma1: σ1 of the threshold noise.
        noise: ``"discrete"`` (integer noise, as deployed) or ``"continuous"``.
        min_teachers: the fewest votes a query can get, if fewer than ``teachers`` may vote (a partial
            quorum); the feasible range then starts at ``⌈min_teachers/c⌉``.

    Returns:
        RDP at each order (shape of ``orders``), never above ``λ/(2σ1²)``.

    Raises:
        InputError: bad orders or parameters.
    """
    lam = as_orders(orders)
    k = count("teachers", teachers, minimum=1)
    c = count("classes", classes, minimum=2)
    k_min = k if min_teachers is None else count("min_teachers", min_teachers, minimum=1)
    if k_min > k:
        raise InputError(f"min_teachers {k_min} exceeds teachers {k}")
    t = non_negative("threshold", threshold)
    s = positive("sigma1", sigma1)
    tops = np.arange(-(-k_min // c), k + 1, dtype=np.int64)
    gaussian = lam / (2 * s * s)
    if tops.size < 2:
        return np.zeros_like(lam)
    log_pass, log_fail = _pass_logs(tops, threshold=t, sigma1=s, noise=noise)
    flat = lam.ravel()
    worst = np.zeros_like(flat)
    # Pairs (m, m+1) in both directions; loop over orders to keep memory at O(k).
    for i, order in enumerate(flat.tolist()):
        up = rdp_bernoulli(
            order, log_p=log_pass[:-1], log_1mp=log_fail[:-1], log_q=log_pass[1:], log_1mq=log_fail[1:]
        )
        down = rdp_bernoulli(
            order, log_p=log_pass[1:], log_1mp=log_fail[1:], log_q=log_pass[:-1], log_1mq=log_fail[:-1]
        )
        worst[i] = max(float(up.max()), float(down.max()))
    return np.minimum(worst.reshape(lam.shape), gaussian)
