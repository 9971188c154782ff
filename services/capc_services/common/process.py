"""Who this process is, for the places that must tell one process of a party from another.

A party's identity is its certificate's common name, and one identity must run as one process (DESIGN §4,
"One identity, one process"): its local cap record is locked by the process that charges it, and the student
keeps one work stream per identity. Both name the process they refuse for — pid, host and start time — so
an operator can find it; :data:`INSTANCE` tells a process's own reconnection from another process.
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket

import psutil

__all__ = ["INSTANCE", "describe"]

#: A random id of this process, fixed for its life (sent in the teacher's hello).
INSTANCE = secrets.token_hex(8)


def describe() -> str:
    """``"pid P on host H, started T"`` (T in UTC, ISO 8601) of this process."""
    started = datetime.datetime.fromtimestamp(psutil.Process().create_time(), datetime.UTC)
    return (
        f"pid {os.getpid()} on host {socket.gethostname()}, started {started.isoformat(timespec='seconds')}"
    )
