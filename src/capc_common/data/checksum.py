"""A site's data file checked against the SHA-256 its operator wrote down, and waited for while it is copied.

A hospital's images reach the machine that trains on them by a copy it does not see the end of: a ``kubectl
cp`` into a Kubernetes volume, an ``scp`` or a USB disk. A copy cut short or the wrong file is still a
readable ``.npz`` of fewer or other images, and a teacher trained on it would vote, and release, from data the
hospital did not mean to use. So the site file may pin the file's SHA-256 (``data.sha256``, what
``sha256sum FILE`` prints on the machine it was made on), and every reader compares before loading: the
party refuses anything else (:func:`verify_file`), and a loader waits until the copy is complete
(:func:`await_file`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from capc_common.errors import InputError, IntegrityError, UnavailableError

__all__ = ["await_file", "dataset_file", "file_sha256", "verify_file"]

_BLOCK = 1 << 20


def dataset_file(name: str) -> Path | None:
    """The one file a dataset string names (``npz:PATH`` or a path ending in ``.npz``), or None for a
    library dataset, a folder of images or an IDX directory, which no single checksum covers."""
    kind, sep, location = name.partition(":")
    if sep and kind == "npz" and location:
        return Path(location)
    if not sep and name.endswith(".npz"):
        return Path(name)
    return None


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks (a hospital's file may be larger than its memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: Path, sha256: str) -> None:
    """Refuse a data file whose SHA-256 is not the pinned one.

    Raises:
        InputError: the file does not exist.
        IntegrityError: its SHA-256 differs (an incomplete copy, or another file).
    """
    if not path.is_file():
        raise InputError(f"data file {path} does not exist; copy it there (its SHA-256 must be {sha256})")
    found = file_sha256(path)
    if found != sha256:
        raise IntegrityError(_mismatch(path, found, sha256))


def _mismatch(path: Path, found: str, sha256: str) -> str:
    return (
        f"data file {path} has SHA-256 {found} ({path.stat().st_size} bytes), the site file's data.sha256 is "
        f"{sha256}: the copy is incomplete or another file. Copy the file again, or, if the site's data "
        "really changed, write its new `sha256sum` into data.sha256"
    )


def await_file(
    path: Path,
    sha256: str,
    *,
    timeout: float | None = None,
    poll: float = 2.0,
    say: Callable[[str], None] = lambda _: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until ``path`` exists and its SHA-256 is ``sha256``.

    A file still being written is hashed only once its size and modification time held still for one poll
    (or it was last written longer ago than that); a complete file with another checksum is reported once and
    hashed again only when it changes (a copy over it). ``say`` gets one line per change of what is seen.

    Raises:
        UnavailableError: ``timeout`` seconds passed first (the message says what was last seen).
    """
    deadline = None if timeout is None else clock() + timeout
    said = ""
    last: tuple[int, int] | None = None
    checked: tuple[int, int] | None = None
    while True:
        try:
            stat = os.stat(path)
            seen: tuple[int, int] | None = (stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            seen = None
        if seen is None:
            line = f"waiting for {path} (SHA-256 {sha256}) to be copied in"
        elif seen != last and time.time() - seen[1] / 1e9 < poll:  # written to within the last poll
            line = f"found {path}; checking it once it stops changing"
        elif seen != checked:
            checked = seen
            found = file_sha256(path)
            if found == sha256:
                say(f"{path}: SHA-256 {found} matches the site file ({seen[0]} bytes)")
                return
            line = _mismatch(path, found, sha256) + "; waiting for a new copy"
        else:
            line = said
        if line != said:
            say(line)
            said = line
        last = seen
        left = None if deadline is None else deadline - clock()
        if left is not None and left <= 0:
            raise UnavailableError(f"gave up after {timeout:g} s: {said}")
        sleep(poll if left is None else min(poll, left))
