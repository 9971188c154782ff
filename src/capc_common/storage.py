"""The volumes the system writes to, and their faults named for what they are (STYLE: SQLite says
SQLITE_FULL, not SQLITE_CORRUPT).

A full, read-only or failing volume is not damage: SQLite rolls a transaction it could not write back by
itself, so what was committed before is intact and the next write succeeds once the volume can take it.
Those faults become :class:`~capc_common.errors.StorageError` (exit code 7, gRPC RESOURCE_EXHAUSTED), whose
message names the volume, what is free and what is needed — never "restore a backup", which for a budget
ledger would roll spent privacy back. Only what SQLite finds corrupt stays an
:class:`~capc_common.errors.IntegrityError`, and ``capc budget verify`` decides whether a backup is needed.

Writers that must not fail half-way (the ledger between computing a batch and settling it, the student
between stashing and storing labels) call :func:`require_space` before their commit point, so a volume that
is nearly full refuses new work there, with nothing begun.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from capc_common.errors import CapcError, IntegrityError, StorageError, UnavailableError

__all__ = ["classify", "free_bytes", "read_only", "require_space", "volume"]

# SQLite's primary result codes (the low byte of an extended code), https://www.sqlite.org/rescode.html
_BUSY, _LOCKED, _READONLY, _IOERR, _FULL, _CANTOPEN = 5, 6, 8, 10, 13, 14
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def volume(path: str | os.PathLike[str]) -> Path:
    """The mount point of the volume holding ``path`` (or the nearest existing directory above it)."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    while not os.path.ismount(here) and here != here.parent:
        here = here.parent
    return here


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on the volume of ``path``."""
    stat = os.statvfs(volume(path))
    return stat.f_bavail * stat.f_frsize


def read_only(path: str | os.PathLike[str]) -> bool:
    """Whether the volume of ``path`` is mounted read-only."""
    return bool(os.statvfs(volume(path)).f_flag & os.ST_RDONLY)


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB"


def _full(path: Path, what: str, *, needed: int | None) -> StorageError:
    free = free_bytes(path)
    need = f", at least {_kib(needed)} needed" if needed is not None else ""
    return StorageError(
        f"{what} {path}: the volume {volume(path)} is full ({_kib(free)} free{need}); nothing was written. "
        "Free space on that volume or move the file to a larger one: writing resumes by itself"
    )


def _read_only(path: Path, what: str) -> StorageError:
    return StorageError(
        f"{what} {path}: the volume {volume(path)} is read-only; nothing was written (reads go on). "
        "Remount it read-write: writing resumes by itself"
    )


def require_space(path: str | os.PathLike[str], *, needed: int, what: str) -> None:
    """Refuse, before a commit point, to begin what the volume of ``path`` could not finish.

    Args:
        path: the file that will be written.
        needed: bytes the work needs on that volume (an upper bound: pages a transaction touches, its WAL
            frames, a receipt).
        what: what the file is, for the message (``"ledger"``, ``"label store"``).

    Raises:
        StorageError: the volume is read-only or has less than ``needed`` bytes free.
    """
    target = Path(path)
    if read_only(target):
        raise _read_only(target, what)
    if free_bytes(target) < needed:
        raise _full(target, what, needed=needed)


def classify(
    exc: sqlite3.Error | OSError, *, path: str | os.PathLike[str], what: str, needed: int | None = None
) -> CapcError:
    """The library error an SQLite or OS error on ``path`` stands for.

    Full (SQLITE_FULL, ENOSPC, EDQUOT), read-only (SQLITE_READONLY, EROFS, or any write on a volume mounted
    read-only) and failing (SQLITE_IOERR, SQLITE_CANTOPEN, EIO) volumes are :class:`StorageError`; a busy or
    locked database is :class:`UnavailableError` (try again); what SQLite finds corrupt, or a file that is
    not a database, is :class:`IntegrityError`.

    Args:
        exc: the error.
        path: the file being read or written.
        what: what the file is, for the message.
        needed: bytes the failed write needed, when known (named in a "full" message).
    """
    target = Path(path)
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if primary in (_BUSY, _LOCKED):
            return UnavailableError(f"{what} {target} is locked by another writer ({exc}); try again")
        if primary == _FULL:
            return _full(target, what, needed=needed)
        if primary in (_READONLY, _CANTOPEN, _IOERR) and read_only(target):
            return _read_only(target, what)
        if primary in (_READONLY, _CANTOPEN, _IOERR):
            return StorageError(
                f"{what} {target}: the volume {volume(target)} failed ({exc}); nothing was written. Check "
                "the volume (free space, permissions, the kernel log); what was committed before is intact"
            )
        return IntegrityError(f"{what} {target} is damaged ({exc})")  # SQLITE_CORRUPT, SQLITE_NOTADB, …
    if exc.errno in _FULL_ERRNOS:
        return _full(target, what, needed=needed)
    if exc.errno == errno.EROFS or read_only(target):
        return _read_only(target, what)
    return StorageError(
        f"{what} {target}: the volume {volume(target)} failed ({exc.strerror or exc}); nothing was written. "
        "Check the volume (free space, permissions, the kernel log)"
    )
