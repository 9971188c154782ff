"""The 2PC processes' memory policy (capc_common.memory): what they free, they reuse, in page faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from capc_common.memory import glibc

# In a fresh process: the minor page faults of filling a 256 MiB array, then of a second one of the same size
# after the first is freed. A block that went back to the kernel is faulted in again.
_PROBE = """
import json, resource, sys, threading
from capc_common.memory import keep_freed_memory
keep_freed_memory()
import numpy as np

def faults_of_a_new_array():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(1 << 25)  # 256 MiB of float64
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del a
    return after - before

def faults_of_two_arrays_in_a_thread():
    # 2 × 40 MiB alive at once: more than a thread arena's 64 MiB heap, so a second heap while they live
    faults = []
    def work():
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            a, b = np.ones(5 << 20), np.ones(5 << 20)
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
            del a, b
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return faults

thread = faults_of_two_arrays_in_a_thread()  # first: the main thread's arrays would be reused by it
first, second = faults_of_a_new_array(), faults_of_a_new_array()
print(json.dumps({"first": first, "second": second, "thread": thread}))
"""

Require = Callable[[bool, str], None]


def _probe(**env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_freed_array_is_reused_not_faulted_in_again(require: Require) -> None:
    require(glibc(), "the memory policy's allocator settings are glibc's (mallopt)")
    kept = _probe()
    assert kept["first"] > 0, kept  # the first array is fresh memory (page size and huge pages aside)
    assert kept["second"] < kept["first"] // 20, kept  # the second one reuses the first one's pages


def test_a_worker_thread_reuses_what_it_frees(require: Require) -> None:
    require(glibc(), "the memory policy's allocator settings are glibc's (mallopt)")
    # With glibc's arena per thread, the heap beyond the thread's first is handed back when its arrays are
    # freed, and each next pair is faulted in again (measured: 20,482 then 10,241 and 10,241 faults).
    first, *again = _probe()["thread"]
    assert first > 0 and all(n < first // 20 for n in again), (first, again)


def test_the_operators_environment_wins(require: Require) -> None:
    require(glibc(), "the memory policy's allocator settings are glibc's (mallopt)")
    # Any malloc setting of the operator's leaves glibc as set: here blocks this large are mapped on their own
    # and unmapped when freed, so the next one is faulted in again.
    for env in ({"MALLOC_MMAP_THRESHOLD_": str(32 << 20)}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=65536"}):
        mapped = _probe(**env)
        assert mapped["second"] > mapped["first"] // 2, (env, mapped)
    # An arena per thread, as the operator asks (glibc's own name has no trailing underscore): the thread's
    # second heap goes back when its arrays are freed, and the next pair is faulted in again.
    for env in ({"MALLOC_ARENA_MAX": "8"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=8"}):
        first, *again = _probe(**env)["thread"]
        assert all(n > first // 4 for n in again), (env, first, again)
