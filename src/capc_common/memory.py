"""How a process's allocators treat memory it frees: keep it for the next allocation.

A party's work allocates and frees the same large buffers over and over (a featurisation chunk, a head's
gradient block, a file read into an array). By default glibc hands every freed block above 128 KiB back
to the kernel, and numpy asks for transparent huge pages on every array of 4 MiB or more, so each new
buffer is fresh memory that the kernel must zero before first use. On this project's 2-core VMs, zeroing
fresh memory is unusually slow: the hypervisor reclaims guest memory that has been freed, so the kernel
re-faults it from the host. Measured there (`perf record -a`, one `capc demo`), 74 s of its 390 CPU-s
went to zeroing huge pages. One hospital's `capc teacher train` (189 heads, 19,898 images, run alone)
took 37.3–38.6 s by default and 29.0–31.7 s with the settings below (system time 8–11 s against 3–4 s).
On other machines these settings cost little: a process keeps its peak heap, which it needed anyway.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["keep_freed_memory"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
#: Free memory at the heap's top that is kept rather than handed back: 2 GiB, the most mallopt takes.
_TRIM_THRESHOLD = 2**31 - 1


def keep_freed_memory() -> None:
    """Keep freed memory in this process for reuse, and no huge pages for numpy's arrays.

    Call it once, at a process's start, best before numpy is imported (the CLI's entry point does). A
    setting the operator made in the environment wins (glibc's ``MALLOC_TRIM_THRESHOLD_`` and
    ``MALLOC_MMAP_MAX_``, numpy's ``NUMPY_MADVISE_HUGEPAGE``); child processes inherit numpy's. Off glibc
    only numpy's setting applies.
    """
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")  # read once, when numpy is imported
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # imported already (a test runner's plugin): numpy's own switch, where it has one
        switch = getattr(getattr(numpy, "_core", None), "multiarray", None)
        if switch is not None and hasattr(switch, "_set_madvise_hugepage"):
            switch._set_madvise_hugepage(os.environ["NUMPY_MADVISE_HUGEPAGE"] != "0")
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # not a glibc system
        glibc = ""
    if not glibc.startswith("glibc"):
        return
    libc = ctypes.CDLL(None)
    for param, value, variable in (
        (_M_MMAP_MAX, 0, "MALLOC_MMAP_MAX_"),  # every block from the heap, even a whole feature matrix
        (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
    ):
        if variable not in os.environ:
            libc.mallopt(ctypes.c_int(param), ctypes.c_int(value))  # 0 (refused) leaves glibc's default
