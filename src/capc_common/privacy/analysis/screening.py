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

Split threshold noise (``known_shift=True``): the federation draws the threshold noise in two parts,
``z1 = z1_g + z1_s``, one per non-colluding party, so each party sees a pass bit through the other's unknown
``N_Z(0, σ1²)`` at a threshold *shifted by its own known part*: ``1[m + z1_s ≥ T − z1_g]`` for the guardian.
The shift is data-independent but unbounded, and with ``T`` far from every feasible top count (``T > k``) the
worst pairs at ``T`` alone are far cheaper than at a shifted threshold (T = 300, k = 200, σ1 = 40: 5–12× at
orders 2–32). The supremum then also runs over every integer shift — over every ``d = ⌈T⌉ − m ∈ Z`` — which
equals the fixed-threshold supremum whenever the worst ``d`` lies among the feasible top counts (any
realistic ``T``). The scan over ``d`` stops once a bound on every farther term is below the best so far
(see :func:`_any_shift`).

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

from capc_common.errors import InputError
from capc_common.privacy.analysis import _special as special
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
    known_shift: bool = False,
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
        known_shift: the observer knows an integer shift of the threshold (its own part of split threshold
            noise): take the supremum over every shift too. Needs ``noise="discrete"``.

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
    if known_shift and _noise(noise) != "discrete":
        raise InputError(
            "a known shift of the threshold is a part of split integer noise: use noise='discrete'"
        )
    tops = np.arange(-(-k_min // c), k + 1, dtype=np.int64)
    gaussian = lam / (2 * s * s)
    if tops.size < 2:  # one possible top count: the pass bit never depends on the data
        return np.zeros_like(lam)
    flat = lam.ravel()
    if known_shift:
        worst = _any_shift(flat, sigma1=s)
    else:
        log_pass, log_fail = _pass_logs(tops, threshold=t, sigma1=s, noise=noise)
        worst = np.array([_worst_pair(order, log_pass, log_fail) for order in flat.tolist()])
    return np.minimum(worst.reshape(lam.shape), gaussian)


def _worst_pair(order: float, log_pass: npt.NDArray[np.float64], log_fail: npt.NDArray[np.float64]) -> float:
    """Largest divergence between neighbouring entries (m, m+1), in both directions, at one order."""
    up = rdp_bernoulli(
        order, log_p=log_pass[:-1], log_1mp=log_fail[:-1], log_q=log_pass[1:], log_1mq=log_fail[1:]
    )
    down = rdp_bernoulli(
        order, log_p=log_pass[1:], log_1mp=log_fail[1:], log_q=log_pass[:-1], log_1mq=log_fail[:-1]
    )
    return max(float(up.max()), float(down.max()))


def _any_shift(orders: npt.NDArray[np.float64], *, sigma1: float) -> npt.NDArray[np.float64]:
    """Supremum over every integer ``d`` (pass iff ``Z ≥ d``) of the neighbouring pairs' divergence.

    For each order, scans ``d ∈ [-D, D]``, doubling ``D`` until a bound on every term with ``|d| > D`` is
    below the best found (the pairs at ``−d`` mirror those at ``d`` with pass and fail swapped, by the
    symmetry of ``Z``, so one bound serves both sides). For ``d ≥ 1``, with ``p = Pr[Z ≥ d]``,
    ``q = Pr[Z ≥ d+1]`` and weights ``w_x = e^{-x²/(2σ²)}``: ``p ≤ P(d) = w_d / (1 − w_{d+1}/w_d)`` (the
    ratios ``w_{x+1}/w_x`` decrease) and ``p/q ≤ 1 + w_d/w_{d+1}``, so
    ``D_λ(p‖q) ≤ P(d)·(1 + e^{(2d+1)/(2σ²)})^{λ−1}/(λ−1)`` (decreasing for ``d > λ − 1``) and
    ``D_λ(q‖p) ≤ −log(1 − P(d)) + P(d)/(λ−1)`` (decreasing). An order whose tail these bounds cannot
    certify within ``D = λ + 40σ`` (very high orders at small σ, where the supremum is close to it anyway) is
    charged the Gaussian bound ``λ/(2σ²)``, which holds at every threshold.
    """
    cap = math.ceil(float(orders.max())) + math.ceil(_SPAN_SIGMAS * sigma1) + 2
    d = np.arange(-cap, cap + 2, dtype=np.int64)
    log_pass, log_fail = _pass_logs(-d, threshold=0.0, sigma1=sigma1, noise="discrete")
    worst = orders / (2 * sigma1 * sigma1)
    for i, order in enumerate(orders.tolist()):
        span = min(cap, math.ceil(order) + math.ceil(8 * sigma1) + 2)
        while True:
            window = slice(cap - span, cap + span + 2)
            best = _worst_pair(order, log_pass[window], log_fail[window])
            if _tail_below(order, edge=float(span), sigma1=sigma1, best=best):
                worst[i] = best
                break
            if span == cap:
                break
            span = min(cap, 2 * span)
    return worst


_SPAN_SIGMAS = 40.0  # beyond 40σ every tail term is below e^-800 of the mass: nothing left to find


def _tail_below(order: float, *, edge: float, sigma1: float, best: float) -> bool:
    """Whether every pair with ``|d| > edge`` is certainly below ``best`` (bounds of :func:`_any_shift`)."""
    if edge <= order - 1:
        return False
    log_p = -(edge**2) / (2 * sigma1**2) - math.log(-math.expm1(-(2 * edge + 1) / (2 * sigma1**2)))
    log_ratio = float(np.logaddexp(0.0, (2 * edge + 1) / (2 * sigma1**2)))  # log(1 + w_d/w_{d+1})
    if log_p + (order - 1) * log_ratio - math.log(order - 1) > math.log(best):
        return False
    p = math.exp(log_p)
    return p < 0.5 and -math.log1p(-p) + p / (order - 1) <= best
