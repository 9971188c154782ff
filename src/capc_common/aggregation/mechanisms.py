"""Plaintext PATE mechanisms on vote histograms: GNMax, Confident-GNMax and LNMax.

These are the reference semantics the federation's secure protocol must reproduce bit for bit, and the
mechanisms of the central (single-machine) research mode.

**Canonical noise order (MUST).** For one batch of ``B`` queries and ``c`` classes, Confident-GNMax draws its
noise with :func:`draw_confident_noise` in exactly this order from one noise source::

    z1 = noise.discrete_gaussian(sigma=sigma1, shape=(B,))      # threshold noise, one per query
    z2 = noise.discrete_gaussian(sigma=sigma2, shape=(B, c))    # argmax noise, for every query and class

``z2`` is drawn for every query, answered or not, so the number of draws never depends on the data. The
guardian calls the same function, so a central run and a federation given the same seeded noise source
produce the same labels, query by query.

**Plaintext rule (MUST)** — :func:`confident_rule`, which the garbled circuit must agree with: for histogram
row ``H``, ``pass = max_j H_j + z1 ≥ T`` and ``label = argmax_j (H_j + z2_j)`` with ties going to the lowest
class index; the output is ``label`` if ``pass`` else :data:`UNANSWERED` (−1). Because ``H`` and ``z1`` are
integers, ``≥ T`` is the same test as ``≥ ceil(T)``.

Noise comes from a :class:`~capc_common.privacy.NoiseSource`; the production one draws from a CSPRNG. A
seeded source is only ever *injected* (tests, the differential test against the federation). Privacy
accounting is not done here: see :mod:`capc_common.privacy` (screening for every query, GNMax for each
answered one; LNMax with discrete Laplace scale ``b`` is ``2/b``-DP per answer).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from capc_common.aggregation.histogram import check_histograms
from capc_common.errors import InputError
from capc_common.privacy import NoiseSource, SystemNoise

__all__ = [
    "UNANSWERED",
    "confident_gnmax",
    "confident_rule",
    "draw_confident_noise",
    "gnmax",
    "lnmax",
    "noisy_argmax",
]

UNANSWERED = -1
"""Label of a query whose noisy top vote failed the threshold."""


def _real(value: object) -> bool:
    return (
        isinstance(value, int | float | np.integer | np.floating)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _positive(name: str, value: float) -> float:
    if not _real(value) or value <= 0:
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _threshold(value: float) -> float:
    if not _real(value) or value < 0:
        raise InputError(f"threshold T must be a finite number >= 0, got {value!r}")
    return float(value)


def noisy_argmax(noisy_counts: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Index of each row's maximum; ties go to the lowest index (the tournament tree of the circuit).

    Args:
        noisy_counts: integer array ``(queries, classes)``.

    Returns:
        ``int64`` labels ``(queries,)``.
    """
    # np.argmax returns the first occurrence of the maximum, i.e. the lowest index on ties.
    return np.argmax(noisy_counts, axis=1).astype(np.int64)


def confident_rule(
    histograms: npt.ArrayLike,
    *,
    threshold: float,
    z1: npt.ArrayLike,
    z2: npt.ArrayLike,
) -> npt.NDArray[np.int64]:
    """Confident-GNMax's output for given histograms and given noise (no randomness here).

    Args:
        histograms: vote histograms ``(B, c)`` (checked with :func:`check_histograms`).
        threshold: ``T``; a query passes when ``max_j H_j + z1 ≥ T``.
        z1: integer threshold noise ``(B,)``.
        z2: integer argmax noise ``(B, c)``.

    Returns:
        ``int64`` labels ``(B,)``: ``argmax_j (H_j + z2_j)`` (lowest index on ties) where the query passes,
        :data:`UNANSWERED` elsewhere.

    Raises:
        InputError: if the histograms are not histograms or the noise shapes do not match them.
    """
    hist = check_histograms(histograms)
    t = _threshold(threshold)
    n1 = np.asarray(z1)
    n2 = np.asarray(z2)
    if n1.shape != (hist.shape[0],) or n2.shape != hist.shape:
        raise InputError(
            f"noise shapes z1 {n1.shape}, z2 {n2.shape} do not match histograms {hist.shape}: "
            f"expected z1 ({hist.shape[0]},) and z2 {hist.shape}"
        )
    if not (np.issubdtype(n1.dtype, np.integer) and np.issubdtype(n2.dtype, np.integer)):
        raise InputError(f"noise must be integer (discrete), got dtypes {n1.dtype} and {n2.dtype}")
    passed = hist.max(axis=1) + n1.astype(np.int64) >= t
    labels = noisy_argmax(hist + n2.astype(np.int64))
    return np.where(passed, labels, UNANSWERED).astype(np.int64)


def draw_confident_noise(
    noise: NoiseSource, *, batch: int, classes: int, sigma1: float, sigma2: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Draw one batch's Confident-GNMax noise in the canonical order (``z1`` first, then ``z2``).

    Args:
        noise: where the discrete Gaussian samples come from (a CSPRNG-backed source in production).
        batch: number of queries ``B`` in the batch.
        classes: number of classes ``c``.
        sigma1: standard-deviation parameter of the threshold noise ``N_Z(0, σ1²)``.
        sigma2: standard-deviation parameter of the argmax noise ``N_Z(0, σ2²)``.

    Returns:
        ``(z1, z2)`` with shapes ``(B,)`` and ``(B, c)``, ``int64``.

    Raises:
        InputError: on a non-positive size or σ.
    """
    if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch < 1:
        raise InputError(f"batch must be an integer >= 1, got {batch!r}")
    if isinstance(classes, bool) or not isinstance(classes, int | np.integer) or classes < 2:
        raise InputError(f"classes must be an integer >= 2, got {classes!r}")
    s1 = _positive("sigma1", sigma1)
    s2 = _positive("sigma2", sigma2)
    z1 = np.asarray(noise.discrete_gaussian(sigma=s1, shape=(int(batch),)), dtype=np.int64)
    z2 = np.asarray(noise.discrete_gaussian(sigma=s2, shape=(int(batch), int(classes))), dtype=np.int64)
    return z1, z2


def confident_gnmax(
    histograms: npt.ArrayLike,
    *,
    threshold: float,
    sigma1: float,
    sigma2: float,
    noise: NoiseSource | None = None,
    teachers: int | None = None,
) -> npt.NDArray[np.int64]:
    """Confident-GNMax (Papernot et al. 2018) on one batch, with exact discrete Gaussian noise.

    Args:
        histograms: vote histograms ``(B, c)``.
        threshold: ``T`` of the screening step.
        sigma1: σ1 of the screening noise.
        sigma2: σ2 of the argmax noise.
        noise: noise source; draws follow :func:`draw_confident_noise`. Default: a fresh
            :class:`~capc_common.privacy.SystemNoise` (CSPRNG); inject a seeded source only for tests.
        teachers: if given, every histogram row must sum to it.

    Returns:
        ``int64`` labels ``(B,)``, :data:`UNANSWERED` for queries that failed the screening.

    Raises:
        InputError: if the input is not a histogram (e.g. a label array) or a parameter is out of range.
    """
    hist = check_histograms(histograms, teachers=teachers)
    _threshold(threshold)
    z1, z2 = draw_confident_noise(
        noise or SystemNoise(), batch=hist.shape[0], classes=hist.shape[1], sigma1=sigma1, sigma2=sigma2
    )
    return confident_rule(hist, threshold=threshold, z1=z1, z2=z2)


def gnmax(
    histograms: npt.ArrayLike,
    *,
    sigma: float,
    noise: NoiseSource | None = None,
    teachers: int | None = None,
) -> npt.NDArray[np.int64]:
    """GNMax: ``argmax_j (H_j + N_Z(0, σ²))`` for every query, ties to the lowest index.

    Args:
        histograms: vote histograms ``(B, c)``.
        sigma: σ of the discrete Gaussian noise.
        noise: noise source; one draw of shape ``(B, c)`` (default: a fresh CSPRNG-backed source).
        teachers: if given, every histogram row must sum to it.

    Returns:
        ``int64`` labels ``(B,)``.

    Raises:
        InputError: if the input is not a histogram or σ is not positive.
    """
    hist = check_histograms(histograms, teachers=teachers)
    noise = noise or SystemNoise()
    z = np.asarray(noise.discrete_gaussian(sigma=_positive("sigma", sigma), shape=hist.shape), dtype=np.int64)
    return noisy_argmax(hist + z)


def lnmax(
    histograms: npt.ArrayLike,
    *,
    scale: float,
    noise: NoiseSource | None = None,
    teachers: int | None = None,
) -> npt.NDArray[np.int64]:
    """LNMax (Papernot et al. 2017): ``argmax_j (H_j + discrete Laplace(b))``, ties to the lowest index.

    Args:
        histograms: vote histograms ``(B, c)``.
        scale: ``b`` of the discrete Laplace noise ``Pr[x] ∝ exp(−|x|/b)``; each answer is ``2/b``-DP.
        noise: noise source; one draw of shape ``(B, c)`` (default: a fresh CSPRNG-backed source).
        teachers: if given, every histogram row must sum to it.

    Returns:
        ``int64`` labels ``(B,)``.

    Raises:
        InputError: if the input is not a histogram or the scale is not positive.
    """
    hist = check_histograms(histograms, teachers=teachers)
    noise = noise or SystemNoise()
    z = np.asarray(noise.discrete_laplace(scale=_positive("scale", scale), shape=hist.shape), dtype=np.int64)
    return noisy_argmax(hist + z)
