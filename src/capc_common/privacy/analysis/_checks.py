"""Argument checks shared by the analysis functions: precise :class:`InputError` messages."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError


def positive(name: str, value: float) -> float:
    """``value`` as a float if it is finite and > 0."""
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a positive number, got {value!r}") from exc
    if not math.isfinite(number) or number <= 0:
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def non_negative(name: str, value: float) -> float:
    """``value`` as a float if it is finite and ≥ 0."""
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a non-negative number, got {value!r}") from exc
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{name} must be a finite number ≥ 0, got {value!r}")
    return number


def count(name: str, value: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an int if it is an integer ≥ ``minimum`` (and ≤ ``maximum``, if given)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise InputError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise InputError(f"{name} must be an integer ≤ {maximum}, got {value!r}")
    return int(value)


def probability(name: str, value: float) -> float:
    """``value`` as a float if it lies strictly between 0 and 1."""
    number = positive(name, value)
    if number >= 1:
        raise InputError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return number


def histograms(counts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Vote histograms as int64 with at least 2 classes: one ``(c,)`` histogram or a batch ``(B, c)``.

    Vote *histograms* (one count per class), not per-teacher label arrays: passing labels where counts are
    expected is the mistake that makes the public DIET-PATE code understate ε.
    """
    try:
        arr = np.asarray(counts)
    except (TypeError, ValueError) as exc:
        raise InputError(f"vote histograms must be an array of counts, got {counts!r}") from exc
    if arr.ndim not in (1, 2) or arr.shape[-1] < 2:
        raise InputError(
            f"vote histograms must have shape (classes,) or (batch, classes) with ≥ 2 classes, got shape "
            f"{arr.shape}; pass per-class vote counts (np.bincount of the teachers' labels), not labels"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"vote histograms must be numeric, got dtype {arr.dtype}")
    as_float = arr.astype(np.float64)
    if not np.all(np.isfinite(as_float)) or np.any(as_float < 0) or np.any(as_float != np.round(as_float)):
        raise InputError("vote histograms must hold non-negative integer counts")
    return as_float.astype(np.int64)
