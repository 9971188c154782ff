"""A content-addressed cache for repeated runs (benchmarks, sweeps): features, teachers and their votes.

Every cached object is a deterministic function of the inputs named in its description — the backbone (by
hash), which images (dataset, split, shards, or synthetic stream), the BatchNorm chunk size and mode, the
teachers' settings — so reusing it never changes a result. Each entry is one file named by the SHA-256 of a
canonical JSON description, written atomically. Without a cache directory every call computes.

The cache holds data derived from the *private* training set (shard features, teacher heads, vote
histograms): keep it on the research machine, like the dataset itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from capc_common.learn.teachers import TeacherEnsemble

__all__ = ["FeatureCache", "digest_indices"]

_log = logging.getLogger(__name__)
#: The warning for a stored file that is not what its entry describes (its path, why).
_DAMAGED = "cache file %s %s: computing it again and replacing the file"
#: A temporary file of :meth:`FeatureCache.store_with` this much older than its last write was left by a
#: writer that died (killed, out of memory) and is removed: a live writer's file is written every few seconds.
STALE_TMP_S = 600.0


def digest_indices(index: npt.ArrayLike) -> str:
    """Short SHA-256 of an index array (to name *which* images a feature matrix holds)."""
    return hashlib.sha256(np.ascontiguousarray(index, dtype=np.int64).tobytes()).hexdigest()[:32]


class FeatureCache:
    """``get_or_compute(description, compute)``: load the matrix for ``description`` or compute and store it.

    Args:
        directory: where entries live; ``None`` disables caching.
    """

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = None if directory is None else Path(directory)

    def _path(self, description: dict[str, Any], suffix: str = ".npy") -> Path | None:
        if self.directory is None:
            return None
        key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()
        return self.directory / f"{description.get('kind', 'features')}-{key[:40]}{suffix}"

    def load(
        self, description: dict[str, Any], *, valid: Callable[[npt.NDArray[Any]], bool] | None = None
    ) -> npt.NDArray[Any] | None:
        """The stored array for ``description``, or ``None``.

        Also ``None``, with a warning naming the file and why, for a stored file that is no array (truncated,
        overwritten) or fails ``valid`` (another shape or dtype than its description implies: edited, or
        written by other code): the caller computes the value again and :meth:`store` replaces the file
        atomically, rather than use it or fail on it. (A file edited to other values of the same shape and
        dtype cannot be told from a good one.)
        """
        path = self._path(description)
        if path is None or not path.is_file():
            return None
        try:
            found = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            reason = f"does not load ({type(exc).__name__}: {exc})"
        else:
            if not isinstance(found, np.ndarray):  # an .npz archive
                found.close()
                reason = f"holds a {type(found).__name__}, not one array"
            elif valid is None or valid(found):
                return found
            else:
                reason = f"holds a {found.dtype} array of shape {found.shape}, not what its entry describes"
        _log.warning(_DAMAGED, path, reason)
        return None

    def store(self, description: dict[str, Any], features: npt.NDArray[Any]) -> None:
        """Store an array under ``description`` (atomically: temporary file, then rename)."""
        self.store_with(description, lambda handle: np.save(handle, features, allow_pickle=False))

    def store_with(self, description: dict[str, Any], write: Callable[[BinaryIO], None]) -> Path | None:
        """Store the ``.npy`` file ``write`` writes under ``description`` (atomically: temporary file, then
        rename), for an array written a block at a time rather than held; its path (None: no caching)."""
        path = self._path(description)
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while it is written: no sweep removes a live writer's file
            with os.fdopen(fd, "wb") as handle:
                write(handle)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def stored(
        self, description: dict[str, Any], *, shape: tuple[int, ...], dtype: npt.DTypeLike
    ) -> Path | None:
        """The file stored for ``description`` if it holds a whole array of ``shape`` and ``dtype``, read from
        its header alone (its values are not loaded); else None, with :meth:`load`'s warning for a file that
        does not load or holds another array."""
        path = self._path(description)
        if path is None or not path.is_file():
            return None
        try:
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)  # checks the file holds every value
        except (OSError, ValueError, EOFError) as exc:
            reason = f"does not load ({type(exc).__name__}: {exc})"
        else:
            if not isinstance(mapped, np.ndarray):  # an .npz archive (np.load ignores mmap_mode for one)
                mapped.close()
                reason = f"holds a {type(mapped).__name__}, not one array"
            else:
                found = (mapped.shape, mapped.dtype)
                del mapped
                if found == (shape, np.dtype(dtype)):
                    return path
                reason = f"holds a {found[1]} array of shape {found[0]}, not what its entry describes"
        _log.warning(_DAMAGED, path, reason)
        return None

    def load_teachers(self, description: dict[str, Any]) -> TeacherEnsemble | None:
        """Teachers stored under ``description``, or ``None``."""
        from capc_common.learn.teachers import TeacherEnsemble

        path = self._path(description, ".safetensors")
        return TeacherEnsemble.load(path) if path is not None and path.is_file() else None

    def store_teachers(self, description: dict[str, Any], teachers: TeacherEnsemble) -> None:
        """Store ``teachers`` under ``description`` (atomically)."""
        path = self._path(description, ".safetensors")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            teachers.save(path)

    def get_or_compute(
        self,
        description: dict[str, Any],
        compute: Callable[[], npt.NDArray[np.float32]],
        *,
        valid: Callable[[npt.NDArray[Any]], bool] | None = None,
    ) -> npt.NDArray[np.float32]:
        """Cached features for ``description``, computing (and storing) them on a miss, or where the stored
        file does not load or fails ``valid`` (:meth:`load`)."""
        found = self.load(description, valid=valid)
        if found is not None:
            return found
        features = compute()
        self.store(description, features)
        return features


def _sweep_stale(directory: Path) -> None:
    """Remove the temporary files of :meth:`FeatureCache.store_with` that no writer holds: a writer killed
    outright (SIGKILL, out of memory) cannot remove its own, and a records cache would otherwise keep a few
    hundred MB of a party's features per such death. A writer holds its file locked (``flock``) while it
    writes, so a live one is never removed however slow it is; a file is also left alone until it is
    :data:`STALE_TMP_S` old (the moment between its creation and its lock). Only this class's files
    (``.NAME.npy.XXXX.tmp``); a file that cannot be examined is logged and left."""
    cutoff = time.time() - STALE_TMP_S
    for tmp in directory.glob(".*.npy.*.tmp"):
        try:
            if tmp.stat().st_mtime >= cutoff:
                continue
            fd = os.open(tmp, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a writer holds it
                continue
            else:
                tmp.unlink()
                _log.info("removed a stale temporary cache file %s", tmp)
            finally:
                os.close(fd)
        except FileNotFoundError:  # removed by another process meanwhile
            continue
        except OSError as exc:
            _log.warning("could not examine the temporary cache file %s (%s): left as it is", tmp, exc)
