"""Vote histograms: the only thing a PATE mechanism or accountant may ever be given.

A *histogram* is an ``int64`` array ``(queries, classes)`` whose row ``i`` counts how many teachers voted for
each class on query ``i``; every row sums to the same number of voters. The public DIET-PATE code passes
per-teacher *label arrays* where histograms are expected, which silently understates ε.
:func:`check_histograms` refuses anything that is not a histogram, and every mechanism here calls it first.

Conventions shared with the federation: teachers' predictions are an ``int`` array ``(teachers, queries)`` of
labels in ``[0, classes)``; a teacher party sums its own heads' one-hot votes into a per-party histogram
(:func:`vote_histogram`), and the federation's histogram is the sum of the per-party ones
(:func:`sum_histograms`) — which the secure protocol computes without anyone seeing it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = ["check_histograms", "sum_histograms", "vote_histogram"]


def vote_histogram(predictions: npt.ArrayLike, *, classes: int) -> npt.NDArray[np.int64]:
    """Turn teachers' labels into per-query vote counts.

    Args:
        predictions: integer labels, shape ``(teachers, queries)``: row ``t`` is teacher ``t``'s prediction
            for every query. A single teacher may be given as shape ``(1, queries)``.
        classes: number of classes ``c``; every label must lie in ``[0, c)``.

    Returns:
        ``int64`` array ``(queries, classes)``; each row sums to ``teachers``.

    Raises:
        InputError: if ``predictions`` is not a 2-D integer array or holds a label outside ``[0, classes)``.
    """
    if isinstance(classes, bool) or not isinstance(classes, int | np.integer) or classes < 2:
        raise InputError(f"classes must be an integer >= 2, got {classes!r}")
    preds = np.asarray(predictions)
    if preds.ndim != 2 or not np.issubdtype(preds.dtype, np.integer):
        raise InputError(
            f"predictions must be an integer array (teachers, queries), got shape {preds.shape} "
            f"dtype {preds.dtype}; pass one row per teacher"
        )
    teachers, queries = preds.shape
    if teachers == 0:
        raise InputError("predictions has no teacher rows: at least one teacher must vote")
    if preds.size and (preds.min() < 0 or preds.max() >= classes):
        raise InputError(
            f"predicted labels must lie in [0, {classes}), got values in [{preds.min()}, {preds.max()}]"
        )
    # Offset each query's labels into its own block of `classes` bins, then count all at once.
    flat = (np.arange(queries, dtype=np.int64)[None, :] * classes + preds.astype(np.int64)).ravel()
    counts = np.bincount(flat, minlength=queries * classes)
    return counts.reshape(queries, classes).astype(np.int64, copy=False)


def check_histograms(
    histograms: npt.ArrayLike, *, classes: int | None = None, teachers: int | None = None
) -> npt.NDArray[np.int64]:
    """Validate that ``histograms`` really are vote histograms, and return them as ``int64``.

    This is the guard against the public DIET-PATE bug: a label array ``(queries,)`` or a prediction array
    ``(teachers, queries)`` is not a histogram, and treating one as such reports a wrong ε. A histogram is
    2-D, integral, non-negative, and all its rows sum to the same (positive) number of voters.

    Args:
        histograms: candidate array ``(queries, classes)``.
        classes: if given, the required number of columns.
        teachers: if given, the required row sum (number of voting teachers).

    Returns:
        The histograms as a C-contiguous ``int64`` array.

    Raises:
        InputError: naming what is wrong and how to build proper histograms.
    """
    hist = np.asarray(histograms)
    hint = "build histograms with vote_histogram(predictions, classes=c) from labels (teachers, queries)"
    if hist.ndim != 2:
        raise InputError(
            f"expected vote histograms of shape (queries, classes), got a {hist.ndim}-D array of shape "
            f"{hist.shape} (a label array is not a histogram); {hint}"
        )
    if not np.issubdtype(hist.dtype, np.integer):
        raise InputError(f"vote histograms must hold integer counts, got dtype {hist.dtype}; {hint}")
    if classes is not None and hist.shape[1] != classes:
        raise InputError(
            f"vote histograms have {hist.shape[1]} columns but there are {classes} classes "
            f"(a (teachers, queries) label array has the wrong shape); {hint}"
        )
    if hist.shape[1] < 2:
        raise InputError(f"vote histograms need at least 2 classes (columns), got shape {hist.shape}")
    if hist.size and hist.min() < 0:
        raise InputError(f"vote counts must be non-negative, found {hist.min()}; {hint}")
    sums = hist.sum(axis=1)
    if sums.size:
        if np.any(sums != sums[0]) or sums[0] == 0:
            raise InputError(
                f"every histogram row must sum to the number of voting teachers, got row sums between "
                f"{sums.min()} and {sums.max()} (labels or predictions are not histograms); {hint}"
            )
        if teachers is not None and sums[0] != teachers:
            raise InputError(
                f"histogram rows sum to {sums[0]} votes but {teachers} teachers vote; every teacher must "
                "cast exactly one vote per query"
            )
    return np.ascontiguousarray(hist, dtype=np.int64)


def sum_histograms(per_party: Sequence[npt.ArrayLike]) -> npt.NDArray[np.int64]:
    """Add the per-party histograms of one batch into the federation's histogram.

    In the federation this sum is computed inside the secure protocol; here it is the plaintext reference.

    Args:
        per_party: one histogram ``(queries, classes)`` per teacher party, all of the same shape.

    Returns:
        The summed ``int64`` histogram.

    Raises:
        InputError: if the list is empty, an entry is not a histogram, or the shapes differ.
    """
    if len(per_party) == 0:
        raise InputError("no per-party histograms to sum: at least one teacher party must vote")
    checked = [check_histograms(h) for h in per_party]
    shapes = {h.shape for h in checked}
    if len(shapes) != 1:
        raise InputError(
            f"per-party histograms must share one shape (queries, classes), got {sorted(shapes)}"
        )
    return np.sum(np.stack(checked), axis=0, dtype=np.int64)
