"""Rényi orders: the default grid and the validation every RDP function applies to its ``orders``.

Every RDP curve in this package is a pure function of an array of orders ``λ > 1`` and returns an array of
the same shape, so curves add up across mechanisms and compose by summation (Mironov 2017, Prop. 1).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = ["DEFAULT_ORDERS", "as_orders"]

#: The order grid used when none is given: dense near 1 (large budgets, small δ) and up to 1024 (tiny
#: budgets). ε from the improved conversion is minimised over this grid.
DEFAULT_ORDERS: npt.NDArray[np.float64] = np.unique(
    np.concatenate(
        [
            np.round(np.arange(1.05, 3.0, 0.05), 2),
            np.round(np.arange(3.0, 10.0, 0.1), 1),
            np.arange(10.0, 32.0, 0.5),
            np.arange(32.0, 64.0, 1.0),
            [64.0, 80.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0, 1024.0],
        ]
    )
)
DEFAULT_ORDERS.setflags(write=False)


def as_orders(orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Return ``orders`` as a float64 array after checking every order is finite and > 1.

    Args:
        orders: one order or an array of orders.

    Returns:
        A float64 array with the shape of ``orders`` (0-d for a scalar).

    Raises:
        InputError: an order is ≤ 1, not finite or not a number.
    """
    try:
        arr = np.asarray(orders, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"Rényi orders must be numbers > 1, got {orders!r}") from exc
    if arr.size == 0:
        raise InputError("at least one Rényi order is needed; got an empty list")
    bad = arr[~(np.isfinite(arr) & (arr > 1))]
    if bad.size:
        raise InputError(
            f"Rényi orders must be finite and > 1 (order 1 is KL divergence, which RDP composition does not "
            f"use); got {bad.tolist()[:5]}"
        )
    return arr
