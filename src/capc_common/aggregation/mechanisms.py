"""Plaintext PATE mechanisms on vote histograms: GNMax, Confident-GNMax and LNMax.

These are the reference semantics the federation's secure protocol must reproduce bit for bit, and the
mechanisms of the central (single-machine) research mode.

**Noise.** Confident-GNMax's threshold noise is split between the guardian (z1_g, drawn with z2) and the
student (z1_s); :mod:`capc_common.aggregation.noise` fixes who draws what, from which source, in which
(canonical) order. :func:`confident_gnmax` draws both parts, from its two sources, exactly as a federation
does, so a central run and a federation given the same seeded sources produce the same labels.

**Plaintext rule (MUST)** — :func:`confident_rule`, which the garbled circuit must agree with: for histogram
row ``H`` and total threshold noise ``z1 = z1_g + z1_s``, ``pass = max_j H_j + z1 ≥ T`` and
``label = argmax_j (H_j + z2_j)`` with ties going to the lowest class index; the output is ``label`` if
``pass`` else :data:`UNANSWERED` (−1). Because ``H`` and ``z1`` are integers, ``≥ T`` is the same test as
``≥ ceil(T)``.

Noise comes from :class:`~capc_common.privacy.NoiseSource` s; the production ones draw from a CSPRNG. A
seeded source is only ever *injected* (tests, the differential test against the federation). Privacy
accounting is not done here: see :mod:`capc_common.privacy` (screening for every query, GNMax for each
answered one; LNMax with discrete Laplace scale ``b`` is ``2/b``-DP per answer). Splitting z1 leaves the
screening charge at σ1: each non-colluding party sees the pass bits through the other's N_Z(0, σ1²) part.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from capc_common.aggregation.histogram import check_histograms
from capc_common.aggregation.noise import draw_confident_noise, draw_student_noise
from capc_common.errors import InputError
from capc_common.privacy import NoiseSource, SystemNoise

__all__ = [
    "UNANSWERED",
    "confident_gnmax",
    "confident_rule",
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
        z1: integer threshold noise ``(B,)``, the total of both parties' parts ``z1_g + z1_s``.
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


def confident_gnmax(
    histograms: npt.ArrayLike,
    *,
    threshold: float,
    sigma1: float,
    sigma2: float,
    noise: NoiseSource | None = None,
    student_noise: NoiseSource | None = None,
    teachers: int | None = None,
) -> npt.NDArray[np.int64]:
    """Confident-GNMax (Papernot et al. 2018) on one batch, with exact discrete Gaussian noise.

    The threshold noise is ``z1_g + z1_s`` (each ``N_Z(0, σ1²)``), drawn from the guardian's and the
    student's sources as a federation draws them (:mod:`capc_common.aggregation.noise`).

    Args:
        histograms: vote histograms ``(B, c)``.
        threshold: ``T`` of the screening step.
        sigma1: σ1 of each part of the screening noise.
        sigma2: σ2 of the argmax noise.
        noise: the guardian's source (z1_g, then z2). Default: a fresh
            :class:`~capc_common.privacy.SystemNoise` (CSPRNG).
        student_noise: the student's source (z1_s); default a fresh SystemNoise. Inject both sources or
            neither: a seeded source beside a CSPRNG one would make a "reproducible" run silently random.
        teachers: if given, every histogram row must sum to it.

    Returns:
        ``int64`` labels ``(B,)``, :data:`UNANSWERED` for queries that failed the screening.

    Raises:
        InputError: if the input is not a histogram (e.g. a label array), a parameter is out of range, or
            only one of the two noise sources is given.
    """
    hist = check_histograms(histograms, teachers=teachers)
    _threshold(threshold)
    if (noise is None) != (student_noise is None):
        raise InputError(
            "confident_gnmax draws from two sources (the guardian's and the student's): inject both "
            "(e.g. capc_common.aggregation.mechanism_noise(seed=...)) or neither"
        )
    batch, classes = hist.shape
    z1, z2 = draw_confident_noise(
        noise or SystemNoise(), batch=batch, classes=classes, sigma1=sigma1, sigma2=sigma2
    )
    z1 = z1 + draw_student_noise(student_noise or SystemNoise(), batch=batch, sigma1=sigma1)
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
