"""Thread limits for a call: torch's intra-op threads and numpy's BLAS, together.

Torch's products run on MKL and its OpenMP pool, numpy's on OpenBLAS (the linear heads' products among them,
:func:`capc_common.learn._optim.bmm`): capping one and not the other leaves the other's threads spinning
against it, and a product's bits may depend on its thread count. So both are capped at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["threads_limited"]


@contextmanager
def threads_limited(threads: int | None) -> Iterator[None]:
    """Run the body on at most ``threads`` threads, torch's and the BLAS's (``None``: as they are); both
    counts are restored on exit, also when the body raises (``torch.set_num_threads`` is process-wide, so
    the caller's later work does not run on the cap)."""
    if threads is None:
        yield
        return
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    with threadpool_limits(limits=threads, user_api="blas"):  # restores the BLAS limits on exit
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)
