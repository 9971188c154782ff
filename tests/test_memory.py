"""A process's memory policy (capc_common.memory): what it frees, it reuses, measured in page faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

# In a fresh process: the minor page faults of filling a 256 MiB array, then of a second one of the same size
# after the first is freed. A block that went back to the kernel is faulted in again, page by page.
_PROBE = """
import json, resource, sys
from capc_common.memory import keep_freed_memory
keep_freed_memory()
import numpy as np

def faults_of_a_new_array():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(1 << 25)  # 256 MiB of float64
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del a
    return after - before

first, second = faults_of_a_new_array(), faults_of_a_new_array()
huge = bool(np._core.multiarray._get_madvise_hugepage())
print(json.dumps({"first": first, "second": second, "huge": huge}))
"""

_PAGES = (256 << 20) // 4096


def _probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "NUMPY_MADVISE"))}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _glibc() -> bool:
    return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")


def test_a_freed_array_is_reused_not_faulted_in_again(require: Callable[[bool, str], None]) -> None:
    require(_glibc(), "the memory policy's allocator settings are glibc's (mallopt)")
    kept = _probe()
    assert kept["huge"] is False  # numpy asks for no transparent huge pages
    assert kept["first"] > _PAGES // 2  # the first array is fresh memory, faulted in 4 KiB at a time
    assert kept["second"] < _PAGES // 20, kept  # the second one reuses the first one's pages


def test_the_operators_environment_wins(require: Callable[[bool, str], None]) -> None:
    require(_glibc(), "the memory policy's allocator settings are glibc's (mallopt)")
    # glibc's defaults, set explicitly: the freed array is unmapped and the next one faults in again
    default = _probe(MALLOC_MMAP_MAX_="65536", MALLOC_TRIM_THRESHOLD_="131072", NUMPY_MADVISE_HUGEPAGE="0")
    assert default["second"] > _PAGES // 2, default
