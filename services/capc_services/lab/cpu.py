"""A party slowed down: its process held to a fraction of one core by the kernel's CPU controller.

A cgroup with a CPU quota (``cpu.cfs_quota_us`` in cgroup v1, ``cpu.max`` in v2) lets the process run
``share`` of every 100 ms period on one core and makes it wait out the rest — what a starved virtual machine
or a slow host does to it, every thread of it, every call it serves. Root only; :func:`available` says
whether this machine has the controller.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from capc_common.errors import UnavailableError

__all__ = ["Throttle", "available"]
_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _root() -> tuple[Path, int] | None:
    """The CPU controller's mount and its cgroup version, or None."""
    if (_V1 / "cpu.cfs_quota_us").exists():
        return _V1, 1
    if (_V2 / "cgroup.controllers").exists() and "cpu" in (_V2 / "cgroup.controllers").read_text().split():
        return _V2, 2
    return None


def available() -> tuple[bool, str]:
    """Whether a process can be throttled here (and why not)."""
    if os.geteuid() != 0:
        return False, "a CPU quota needs root"
    if _root() is None:
        return False, "no cgroup CPU controller is mounted"
    return True, ""


class Throttle:
    """Hold process ``pid`` (all its threads) to ``share`` of one core until :meth:`close`.

    Raises:
        UnavailableError: no CPU controller, or the process could not be moved.
    """

    def __init__(self, pid: int, *, share: float) -> None:
        found = _root()
        if found is None:
            raise UnavailableError("no cgroup CPU controller is mounted: cannot slow a process down")
        root, self._version = found
        self.pid = pid
        self._home = self._cgroup_of(pid, root)
        self.group = root / f"capclab-slow-{secrets.token_hex(3)}"
        self.group.mkdir()
        quota = max(1000, int(share * PERIOD_US))
        try:
            if self._version == 1:
                (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.group / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (self.group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            (self.group / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            self.group.rmdir()
            raise UnavailableError(f"could not throttle process {pid}: {exc}") from None

    def _cgroup_of(self, pid: int, root: Path) -> Path:
        """The CPU cgroup ``pid`` is in now (where :meth:`close` puts it back)."""
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (self._version == 1 and "cpu" in controllers.split(",")) or (
                self._version == 2 and not controllers
            ):
                return root / path.lstrip("/")
        return root

    def close(self) -> None:
        """Give the process its CPU back and remove the cgroup."""
        with contextlib.suppress(OSError):  # the process may have exited meanwhile
            (self._home / "cgroup.procs").write_text(str(self.pid))
        with contextlib.suppress(OSError):
            self.group.rmdir()
