"""Volumes that fill up and turn read-only, for tests and fault campaigns: a real tmpfs per volume.

A tmpfs mounted with ``size=`` returns a real ENOSPC when it is full, and a remount changes its size or
makes it read-only, so the parties see exactly what a full or read-only disk gives them — no mock. Mounting
needs root (CAP_SYS_ADMIN); :func:`mounts_allowed` says whether this process may, and callers that need it
ask through the test suite's ``require``.

Linux refuses to remount a volume read-only while a process holds a file on it open for writing (EBUSY):
only the kernel itself does that, after a filesystem error, and such a volume is not made writable again
without ``fsck``. So a read-only volume is made while no writer has it open — a party restarting onto a
volume that came back read-only — and made writable again under the running party.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path

from capc_common.errors import InputError, UnavailableError
from capc_common.storage import free_bytes

__all__ = ["Volume", "mounts_allowed"]
_FILLER = ".capc-filler"


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise UnavailableError(f"mount {' '.join(args)} failed: {proc.stderr.strip() or proc.returncode}")


def mounts_allowed() -> bool:
    """Whether this process can mount a tmpfs (root with CAP_SYS_ADMIN, and the ``mount`` tool)."""
    if os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/capc-mount-probe-{uuid.uuid4().hex[:8]}")
    probe.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
    except (UnavailableError, OSError):
        return False
    else:
        subprocess.run(["umount", str(probe)], capture_output=True, timeout=30, check=False)
        return True
    finally:
        probe.rmdir()


class Volume:
    """A tmpfs of ``size`` bytes mounted at ``path`` (created if missing) until :meth:`close`.

    Args:
        path: the mount point; it must be empty (or not exist).
        size: the volume's size in bytes (tmpfs rounds it up to whole pages).

    Raises:
        InputError: ``path`` is not an empty directory.
        UnavailableError: the mount failed (not root, or no tmpfs).
    """

    def __init__(self, path: str | os.PathLike[str], *, size: int) -> None:
        self.path = Path(path)
        self._created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        if any(self.path.iterdir()):
            raise InputError(f"{self.path} is not empty; a volume is mounted on an empty directory only")
        _mount("-t", "tmpfs", "-o", f"size={int(size)}", "tmpfs", str(self.path))
        self.size = int(size)
        self._mounted = True

    def __enter__(self) -> Volume:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def free(self) -> int:
        """Bytes free on the volume now."""
        return free_bytes(self.path)

    def fill(self, *, leave: int = 0) -> None:
        """Take all but ``leave`` bytes of the free space with a filler file (:meth:`drain` gives it back)."""
        filler, chunk = self.path / _FILLER, b"\0" * (1 << 16)
        with filler.open("ab") as handle:
            for _ in range(self.size // len(chunk) + 2):  # each write takes a chunk (or the last pages)
                room = self.free() - leave
                if room <= 0:
                    break
                try:
                    handle.write(chunk[: min(room, len(chunk))])
                    handle.flush()
                except OSError:  # the last, partial page: the volume is as full as it gets
                    break

    def drain(self) -> None:
        """Remove the filler: the space it took is free again."""
        (self.path / _FILLER).unlink(missing_ok=True)

    def read_only(self, on: bool = True) -> None:
        """Remount read-only (``on``) or read-write.

        Raises:
            UnavailableError: Linux refused (EBUSY: a process holds a file on it open for writing).
        """
        _mount("-o", f"remount,{'ro' if on else 'rw'}", str(self.path))

    def resize(self, size: int) -> None:
        """Grow (or shrink, down to what is used) the volume to ``size`` bytes."""
        _mount("-o", f"remount,size={int(size)}", str(self.path))
        self.size = int(size)

    def close(self) -> None:
        """Unmount (lazily if a process still holds a file on it; the files go with the volume)."""
        if not self._mounted:
            return
        self._mounted = False
        proc = subprocess.run(["umount", str(self.path)], capture_output=True, timeout=30, check=False)
        if proc.returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30, check=False)
        if self._created:
            with contextlib.suppress(OSError):
                self.path.rmdir()
