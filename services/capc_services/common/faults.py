"""Fault points: a party process kills itself (SIGKILL) at a named point of the protocol, for chaos runs.

A kill from outside lands in a window of a few milliseconds only by luck; the campaign
(``benchmarks/chaos.py``) also aims at the windows that matter by arming points here. ``CAPC_FAULTS`` is a
comma-separated list of ``point`` or ``point@n`` — die the n-th time (default: the first) this process
reaches ``point``. Unset, every point is a no-op. The kill is the real thing (SIGKILL: no cleanup, no
flush), so what survives is exactly what a crash at that instant leaves. A process with points armed says
so, loudly, when it starts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from capc_common.errors import InputError

_log = logging.getLogger(__name__)
ENV = "CAPC_FAULTS"
POINTS = {
    "guardian.decoded": "guardian: every pass bit decoded, before the ledger settles the batch",
    "guardian.settled": "guardian: the batch settled, before the label decoding bits are sent",
    "student.labelled": "student: the labels decoded (the guardian has settled), before the label store",
    "teacher.shared": "teacher: its seed is with the guardian, before its vote share goes to the student",
}
_armed: dict[str, int] | None = None
_seen: dict[str, int] = {}
_lock = threading.Lock()


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition("@")
        if name not in POINTS:
            raise InputError(f"{ENV}: unknown fault point {name!r}; known: {sorted(POINTS)}")
        if nth and not (nth.isdigit() and int(nth) >= 1):
            raise InputError(f"{ENV}: {item!r} must be POINT or POINT@N with N ≥ 1")
        armed[name] = int(nth or 1)
    return armed


def arm_from_environment() -> dict[str, int]:
    """Read ``CAPC_FAULTS`` (once per process) and warn when any point is armed.

    Raises:
        InputError: an unknown point or a malformed count.
    """
    global _armed
    with _lock:
        if _armed is None:
            _armed = _parse(os.environ.get(ENV, ""))
            if _armed:
                _log.warning(
                    "FAULT INJECTION ARMED: this process will SIGKILL itself at %s (chaos testing only)",
                    ", ".join(f"{p}@{n}" for p, n in sorted(_armed.items())),
                )
        return dict(_armed)


def reached(point: str) -> None:
    """Mark that this process reached ``point``; die here (SIGKILL) if it is armed for this visit."""
    armed = arm_from_environment()
    if point not in armed:
        return
    with _lock:
        _seen[point] = _seen.get(point, 0) + 1
        due = _seen[point] == armed[point]
    if due:
        _log.warning("fault point reached: killing this process", extra={"point": point})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
