"""A content-addressed cache of the features of *public* images, shared by the parties on one machine.

In a local federation (``capc local up``, ``capc demo``) every hospital featurises the same synthetic query
batch, and the student featurises all of them again to train: four times the same work. Under the chunking
rule (:func:`~capc_common.models.chunk_starts`) a chunk's features are a function of the backbone, the
BatchNorm mode and that chunk's images alone, so they can be computed once and read by everyone: the key is
the feature code's version (:func:`~capc_common.models.features.features_version`), the backbone's SHA-256,
the mode and the SHA-256 of the chunk's bytes, and whoever wrote the value, it is what the reader would have
computed. Processes that reach a chunk together do not both compute it: each takes the
chunk's lock without waiting, leaves a chunk another holds for later (so several parties featurise a batch
side by side, one chunk each), and finally waits for those locks and reads what their holders wrote.

The synthetic queries themselves are kept too (:meth:`FeatureCache.images`), by their recipe: each party would
otherwise generate every batch again. Only public images belong here (synthetic queries, a public test set):
a party's private data is never written to a cache. A hospital on its own machine shares it with no one, but
its own cache may hold what the coordinator computed once and shipped (``capc federation basis``: the public
basis, checked against ``federation.yaml``'s pin when read). Writes are atomic (a temporary file, then a
rename), so a reader sees a whole value or none.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from capc_common.models.features import chunk_starts, extract_features, features_version
from capc_common.models.files import sources_digest

if TYPE_CHECKING:
    from capc_common.models.backbone import Backbone
    from capc_common.synth import SyntheticSpec

__all__ = ["FeatureCache"]

_STRIPES = 64  # lock files: a chunk's lock is one of these, by its key
_T = TypeVar("_T", bound=np.generic)


@functools.cache
def _synth_version() -> str:
    """The synth package's sources and numpy's version: what generated images depend on beside their recipe
    (a cache written by other code is never read)."""
    import capc_common.synth as synth

    return sources_digest(Path(synth.__file__).parent, np.__version__)


def _images_key(spec: SyntheticSpec, start: int, count: int) -> str:
    """The key of ``count`` images of the spec's stream from its image ``start``."""
    shape = f"{spec.height}x{spec.width}x{spec.channels}"
    recipe = (
        f"{_synth_version()}\0{spec.generator}\0{spec.seed}\0{spec.first_index + start}\0{count}\0{shape}"
    )
    return hashlib.sha256(recipe.encode()).hexdigest()


class FeatureCache:
    """Features of public images by content, in ``root`` (created on first use).

    Args:
        root: the cache directory, shared by the parties of one machine.

    Attributes:
        computed: chunks this object featurised (and stored).
        read: chunks it read from the cache.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.computed = 0
        self.read = 0

    def extract(
        self, backbone: Backbone, images: npt.NDArray[np.uint8], *, bn_batch: int, mode: str = "current"
    ) -> npt.NDArray[np.float32]:
        """:func:`~capc_common.models.extract_features` of ``images``, each chunk read from the cache or
        computed (and stored) here.

        Raises:
            InputError: as :func:`~capc_common.models.extract_features` (shape, dtype, ``bn_batch``).
        """
        if len(images) < bn_batch:  # let extract_features say what is wrong
            return extract_features(backbone, images, bn_batch=bn_batch, mode=mode)
        chunks = {
            start: self._key(backbone, images[start : start + bn_batch], mode)
            for start in chunk_starts(len(images), bn_batch=bn_batch)
        }
        values = self._shared(
            chunks,
            lambda start, key: self._get_or_compute(
                backbone, images[start : start + bn_batch], key, bn_batch, mode
            ),
        )
        out = np.empty((len(images), backbone.feature_dim), dtype=np.float32)
        done = 0
        for start in chunks:  # in order: the last chunk may overlap the previous one; keep its new rows only
            out[done : start + bn_batch] = values[start][done - start :]
            done = start + bn_batch
        return out

    def images(self, spec: SyntheticSpec) -> npt.NDArray[np.uint8]:
        """:meth:`SyntheticSpec.images <capc_common.synth.SyntheticSpec.images>`, a ``bn_batch`` block at a
        time read from the cache or generated (and stored) here.

        Every party of a local federation regenerates each query batch, and the student all of them again to
        train: generating 13,000 StyleGAN-like queries took about 4 s of CPU per party. A block is a function
        of the generator's code, its seed, its first image's index and the shape alone (images are addressed
        by index in their stream), so it is keyed by those — the synth package's source and numpy's version
        standing for the code — and co-located parties split a batch's blocks as they split its chunks'
        features. Only public synthetic images are stored.
        """
        size = spec.bn_batch  # a spec's count is a multiple of it (SyntheticSpec checks)
        blocks = {start: _images_key(spec, start, size) for start in range(0, spec.count, size)}
        values = self._shared(blocks, lambda start, key: self._images(spec, start, size, key))
        return np.concatenate([values[start] for start in blocks])

    def _images(self, spec: SyntheticSpec, start: int, count: int, key: str) -> npt.NDArray[np.uint8]:
        """A block's stored images, or generated and stored now (the caller holds the block's lock)."""
        from capc_common.synth import generate

        path = self.root / f"images-{key}.npy"
        shape = (count, spec.height, spec.width, spec.channels)
        stored = self._load(path, lambda a: a.shape == shape and a.dtype == np.uint8)
        if stored is not None:
            return stored
        block = generate(
            spec.generator,
            seed=spec.seed,
            start=spec.first_index + start,
            count=count,
            height=spec.height,
            width=spec.width,
            channels=spec.channels,
        )
        self.computed += 1
        self._store(path, block)
        return block

    def _shared(
        self, keys: dict[int, str], get: Callable[[int, str], npt.NDArray[_T]]
    ) -> dict[int, npt.NDArray[_T]]:
        """``get(start, key)`` of every block, under its key's lock: first the blocks no other process holds
        (so co-located parties work side by side, one block each), then, waiting for their locks, the blocks
        others were computing (their files are there once the locks are free)."""
        self.root.mkdir(parents=True, exist_ok=True)
        values: dict[int, npt.NDArray[_T]] = {}
        later = []
        for start, key in keys.items():
            with self._lock(key, wait=False) as held:
                if held:
                    values[start] = get(start, key)
                else:
                    later.append(start)
        for start in later:
            with self._lock(keys[start], wait=True):
                values[start] = get(start, keys[start])
        return values

    def array(
        self,
        name: str,
        compute: Callable[[], npt.NDArray[Any]],
        *,
        valid: Callable[[npt.NDArray[Any]], bool] = lambda _: True,
    ) -> npt.NDArray[Any]:
        """A named array made from public images alone (secure-aggregation DP-SGD's public basis): read, or
        computed here while the other parties wait for it (one computation per machine, not one per party).

        The name must say everything the value depends on (the caller's backbone hash, settings and code
        version). A stored file that does not load or fails ``valid`` (truncated, edited, another version's)
        is computed again and replaced, never used.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(name.encode()).hexdigest()
        path = self.root / f"array-{digest}.npy"
        # Its own lock file: the computation takes chunk locks of the stripes (no self-deadlock).
        with (self.root / f".lock-array-{digest[:16]}").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                stored = self._load(path, lambda a: a.size > 0 and valid(a))
                if stored is not None:
                    return stored
                value = compute()
                self.computed += 1
                self._store(path, value)
                return value
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _load(self, path: Path, valid: Callable[[npt.NDArray[Any]], bool]) -> npt.NDArray[Any] | None:
        """The stored array at ``path`` (counted as read), or None where there is none, it does not load
        (truncated, not an array) or fails ``valid``: the caller computes it again and replaces it."""
        if not path.exists():
            return None
        try:
            stored: npt.NDArray[Any] = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        if not valid(stored):
            return None
        self.read += 1
        return stored

    def _store(self, path: Path, value: npt.NDArray[Any]) -> None:
        """Write ``value`` to ``path`` atomically (a temporary file, then a rename)."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as handle:
                np.save(handle, value)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @staticmethod
    def _key(backbone: Backbone, chunk: npt.NDArray[np.uint8], mode: str) -> str:
        digest = hashlib.sha256(f"{features_version()}\0{backbone.sha256}\0{mode}\0{chunk.shape}\0".encode())
        digest.update(np.ascontiguousarray(chunk).tobytes())
        return digest.hexdigest()

    def _get_or_compute(
        self, backbone: Backbone, chunk: npt.NDArray[np.uint8], key: str, bn_batch: int, mode: str
    ) -> npt.NDArray[np.float32]:
        """The chunk's stored features, or computed and stored now (the caller holds the chunk's lock)."""
        path = self.root / f"{key}.npy"
        if path.exists():
            stored: npt.NDArray[np.float32] = np.load(path)
            if stored.shape == (len(chunk), backbone.feature_dim) and stored.dtype == np.float32:
                self.read += 1
                return stored
        features = extract_features(backbone, chunk, bn_batch=bn_batch, mode=mode)
        self.computed += 1
        self._store(path, features)
        return features

    @contextmanager
    def _lock(self, key: str, *, wait: bool) -> Iterator[bool]:
        """The exclusive lock of the key's stripe; yields whether it is held (always, with ``wait``)."""
        with (self.root / f".lock-{int(key[:8], 16) % _STRIPES:02d}").open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
