"""``njit``: numba kernels compiled (or loaded from numba's on-disk cache) at their first call.

Importing numba costs about 0.2 s of CPU. The MPC layer is imported by every party (a teacher shares its
votes with it), but only the guardian and the student run its kernels, and only once a batch arrives: with
the decorator applied lazily a party starts without numba and one that never garbles never loads it. The
kernel is the same function numba would have decorated at import (same module, same name, so numba's
``cache=True`` finds the same cache entries); kernels here never call one another, which a lazy decorator
could not compile.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["njit"]


def njit(**options: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``numba.njit(**options)``, applied at the kernel's first call instead of at import."""

    def decorate(kernel: Callable[..., None]) -> Callable[..., None]:
        lock = threading.Lock()
        compiled: list[Callable[..., None]] = []

        @functools.wraps(kernel)
        def call(*args: Any) -> None:
            if not compiled:
                with lock:
                    if not compiled:
                        import numba

                        compiled.append(numba.njit(**options)(kernel))
            compiled[0](*args)

        return call

    return decorate
