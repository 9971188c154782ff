"""Durability helpers for the files the system must not lose (the budget ledger, a teacher's cap record)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir"]


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a new directory entry durable: a freshly created (or linked) file survives a power cut only once
    the directory that names it is synced too, not just the file's own contents."""
    fd = os.open(Path(directory), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
