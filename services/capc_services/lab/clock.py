"""A party whose wall clock is minutes off: an ``LD_PRELOAD`` shim that shifts only the wall clock.

``clockshift.c`` interposes ``clock_gettime`` (the realtime clocks only), ``gettimeofday`` and ``time``: a
process started with it reads the date ``seconds`` off — Python's ``time.time()``, the TLS library checking a
certificate's validity, log stamps — while its monotonic clocks, sleeps and timed waits stay the kernel's.
(Debian's libfaketime shifts those too, and a Python party under it fails in ``time.sleep`` with EINVAL or
hangs in its lock timeouts; a time namespace cannot shift the wall clock at all.) The shim is compiled once
per source version with the system C compiler; :func:`available` says whether there is one.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from capc_common.errors import UnavailableError

__all__ = ["available", "skewed"]
_SOURCE = Path(__file__).with_name("clockshift.c")


def available() -> tuple[bool, str]:
    """Whether the shim can be built here (and why not)."""
    if shutil.which("cc") is None:
        return False, "no C compiler (cc) to build the clock shim"
    return True, ""


def _library() -> Path:
    source = _SOURCE.read_bytes()
    built = Path(tempfile.gettempdir()) / f"capc-clockshift-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if not built.exists():
        partial = built.with_suffix(f".{tempfile.gettempprefix()}.part")
        proc = subprocess.run(
            ["cc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(_SOURCE), "-ldl"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise UnavailableError(f"could not build the clock shim: {proc.stderr.strip()[:500]}")
        partial.replace(built)
    return built


def skewed(seconds: int) -> dict[str, str]:
    """The environment that starts a process with its wall clock ``seconds`` ahead (negative: behind).

    Raises:
        UnavailableError: the shim cannot be built.
    """
    return {"LD_PRELOAD": str(_library()), "CAPC_CLOCK_OFFSET_S": str(int(seconds))}
