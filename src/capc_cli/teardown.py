"""End the ``capc`` process without tearing down its interpreter.

A party's process exits once its work is done or its server has stopped: by then every exit handler has
run, threads are joined, its files are closed and its ledger is committed. What Python still does is tear
the interpreter down: it collects garbage and clears every module, and torch's libraries deregister their
operators one by one. Measured on this project's 2-core machines: 0.65 s of CPU after the last exit handler
of one hospital's ``capc teacher train`` (26.4 s in all), about 0.4 s for a bare ``import torch``. A demo
starts 14 such processes, the test suite about 300.

:func:`arm` registers a last exit handler that flushes the standard streams and ends the process with the
code it was exiting with (:func:`exiting_with`), skipping only that teardown. Exit handlers registered
earlier would run after it, so :func:`arm` must run first thing (the CLI's entry point calls it before any
other module of the process could register one, and tests check the order). A process that exits by an
uncaught exception records no code and tears down as usual.
"""

from __future__ import annotations

import atexit
import os
import sys

__all__ = ["arm", "exit_status", "exiting_with"]

_status: list[int] = []


def exit_status(code: object) -> int:
    """The process status ``SystemExit(code)`` ends with: None is 0, an int itself, anything else 1 (Python
    prints it to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def exiting_with(code: object) -> None:
    """Record the ``SystemExit`` code the process is about to exit with."""
    _status[:] = [exit_status(code)]


def arm() -> None:
    """At exit, after every exit handler registered after this call, flush stdout and stderr and end the
    process with the recorded status (no status recorded: the usual teardown)."""
    atexit.register(_end)


def _end() -> None:
    if not _status:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by a caller
            continue
    os._exit(_status[0])
