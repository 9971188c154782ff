"""How a process's allocators treat memory it frees: keep it for the next allocation.

A party's work allocates and frees the same large buffers over and over (a featurisation chunk, a head's
gradient block, a file read into an array). By default glibc maps every block above its dynamic threshold
(at most 32 MiB) on its own and unmaps it when freed, and numpy asks for transparent huge pages for every
array of 4 MiB or more, so such a buffer is fresh memory that the kernel zeroes before its first use. On this
project's 2-core VMs that zeroing is unusually slow: in a whole-system `perf record -a` of one `capc demo`,
74 s of its 390 s of CPU went to the kernel zeroing huge pages (``clear_page_erms`` under
``do_huge_pmd_anonymous_page``). One hospital's `capc teacher train` (189 heads, 19,898 images, run alone)
took 34.4–38.6 s with glibc's and numpy's defaults and 24.6–27.6 s with this policy (system time 8–11 s
against 3–4 s).

The price is memory held: freed blocks stay in the process, so its resident size stays near the highest it
has reached, plus fragmentation (a large block freed under a small live one is not returned). Measured: a
student fitting 8,192 labelled queries in chunks of 2,048 peaked at 608 MB against 550 MB with the defaults.
Worker threads started after the call allocate from the same heap (one arena; glibc limits only arenas made
later, so a thread that allocated before keeps its own): a thread's own arena holds at most 64 MiB per heap
and hands a heap back as soon as it is empty, so a thread working through blocks of a few tens of MB (the
demo's three hospitals training their local heads side by side) got fresh memory for nearly every block.
Measured, those three threads over 30 Adam steps each: 1.89 M page faults and 4.4–5.0 s of system time with
one arena per thread, 0.75–0.83 M and 1.8–2.1 s with one for all. The price: the threads' larger mallocs take
one lock (small blocks come from each thread's cache, Python's small objects from its own allocator), and a
long-lived small block of one thread can keep the shared heap from shrinking after another's large free (the
trim threshold keeps such tops anyway).
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["glibc", "keep_freed_memory"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
#: Free memory at the heap's top that is kept rather than handed back: up to 2 GiB (a larger free top, after
#: an exceptional peak, still goes back).
_TRIM_THRESHOLD = 2**31 - 1


def glibc() -> bool:
    """Whether this process runs on glibc (whose ``mallopt`` :func:`keep_freed_memory` calls)."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # Windows, macOS, musl
        return False
    return version.startswith("glibc")


def _operator_tuned_malloc() -> bool:
    """Whether the environment tunes glibc's malloc itself: any ``MALLOC_*`` variable (``MALLOC_ARENA_MAX``
    has no trailing underscore, ``MALLOC_MMAP_MAX_`` has one) or ``glibc.malloc.*`` in ``GLIBC_TUNABLES``."""
    return any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc." in (
        os.environ.get("GLIBC_TUNABLES", "")
    )


def keep_freed_memory() -> None:
    """Keep freed memory in this process for reuse, and no huge pages for numpy's arrays.

    Call it once, at a process's start, before any thread is started and best before numpy is imported (the
    CLI's entry point does). The operator's settings win: any malloc setting in the environment (a
    ``MALLOC_*`` variable, or ``glibc.malloc.*`` in ``GLIBC_TUNABLES``) leaves glibc's allocator as the
    environment set it, and ``NUMPY_MADVISE_HUGEPAGE`` numpy's huge pages. Child processes inherit the numpy
    setting. Off glibc only numpy's setting applies.
    """
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")  # read once, when numpy is imported
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # imported already (a test runner's plugin): numpy's own switch, where it has one
        switch = getattr(getattr(numpy, "_core", None), "multiarray", None)
        if switch is not None and hasattr(switch, "_set_madvise_hugepage"):
            switch._set_madvise_hugepage(os.environ["NUMPY_MADVISE_HUGEPAGE"] != "0")
    if not glibc() or _operator_tuned_malloc():
        return
    libc = ctypes.CDLL(None)
    # The main arena takes every block from its heap, even a whole feature matrix, keeps a freed top, and
    # serves every thread.
    libc.mallopt(ctypes.c_int(_M_MMAP_MAX), ctypes.c_int(0))  # 0 (refused) leaves glibc's default
    libc.mallopt(ctypes.c_int(_M_TRIM_THRESHOLD), ctypes.c_int(_TRIM_THRESHOLD))
    libc.mallopt(ctypes.c_int(_M_ARENA_MAX), ctypes.c_int(1))  # threads too (before they first allocate)
