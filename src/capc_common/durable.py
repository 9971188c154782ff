"""Durability helpers for the files the system must not lose (the budget ledger, a teacher's cap record)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["appended_lines", "create_durably", "fsync_dir"]


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a new directory entry durable: a freshly created (or linked) file survives a power cut only once
    the directory that names it is synced too, not just the file's own contents."""
    fd = os.open(Path(directory), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_durably(path: str | os.PathLike[str], first_line: str) -> bool:
    """Create ``path`` (and its directory) holding ``first_line``, fsynced with its directory entry, unless it
    exists: a record that is created once and never again (it would forget what it holds).

    Returns:
        False if ``path`` already existed (it is left as it is).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with target.open("x") as handle:
            handle.write(first_line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except FileExistsError:
        return False
    fsync_dir(target.parent)  # a new file survives a power cut only once its directory entry does
    return True


def appended_lines(path: str | os.PathLike[str], *, offset: int) -> tuple[int, list[str]]:
    """The lines of an append-only file past ``offset`` (bytes), and the offset after them: a record several
    writers append to is folded in by reading only what is new since the last look."""
    with Path(path).open("rb") as handle:
        handle.seek(offset)
        tail = handle.read()
    return offset + len(tail), tail.decode("utf-8", errors="replace").splitlines()
