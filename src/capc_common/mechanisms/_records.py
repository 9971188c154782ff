"""A party's labelled records, checked, and per-class integer sums: shared by the prototype mechanisms."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = ["class_sums", "labelled"]


def labelled(
    features: npt.ArrayLike, labels: npt.ArrayLike, *, dim: int, classes: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """A party's records as ``(features (n, dim) float64, labels (n,) int64)``, checked.

    Non-finite features are refused: normalising a row with inf gives NaN, and NaN cast to int64 is
    ``−2^63``, so one such record would move its class's integer sums far beyond the sensitivity.

    Raises:
        InputError: shapes that do not fit, labels outside ``[0, classes)``, or inf/NaN features.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] != dim or y.shape != (x.shape[0],):
        raise InputError(f"features {x.shape} and labels {y.shape} do not match (n, {dim}) and (n,)")
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise InputError(f"labels must be class indices in [0, {classes})")
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        raise InputError(
            f"{len(bad)} record(s) hold inf or NaN features (first at row {int(bad[0])}); refusing to "
            "compute a contribution: check the feature extraction"
        )
    return x, y


def class_sums(
    values: npt.NDArray[np.int64], labels: npt.NDArray[np.int64], *, classes: int
) -> npt.NDArray[np.int64]:
    """``(classes, …)``: the rows of ``values`` summed per label (integers, so the parties' sums add up)."""
    return np.stack([values[labels == c].sum(axis=0) for c in range(classes)])
