"""Batch feature extraction with the DESIGN §3 chunking rule, so every party computes identical features.

With current statistics a feature depends on the whole batch it was computed in, so teachers, the student
and users must cut a query set into the *same* chunks. The rule: consecutive chunks of exactly ``bn_batch``
images; if ``N`` is not a multiple of ``bn_batch`` the last chunk is the final ``bn_batch`` images (it
overlaps the previous one) and only its new rows are kept. Every chunk therefore has the same size, so the
statistics are always estimated from ``bn_batch`` images.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from capc_common.errors import InputError
from capc_common.models.backbone import Backbone, format_shape
from capc_common.models.batchnorm import BN_MODES, bn_stats
from capc_common.models.files import sources_digest

__all__ = ["FixedFront", "chunk_starts", "extract_features", "features_version", "to_tensor"]

#: Images per pass when :class:`FixedFront` computes its table (any size gives the same bits).
_FRONT_PASS = 64
#: Largest table :meth:`FixedFront.of` holds in memory (about 130,000 Fashion-MNIST images' scattering).
FRONT_MAX_BYTES = 2 << 30


def chunk_starts(n: int, *, bn_batch: int) -> list[int]:
    """Start index of every chunk of the chunking rule for ``n`` images (``n >= bn_batch``)."""
    starts = list(range(0, n - bn_batch + 1, bn_batch))
    if n % bn_batch:
        starts.append(n - bn_batch)
    return starts


def to_tensor(images: npt.NDArray[np.uint8], *, device: torch.device | None = None) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` → float32 ``(N, C, H, W)`` in ``[0, 1]``."""
    tensor = torch.from_numpy(np.array(images, dtype=np.uint8, copy=True)).to(device=device)
    return tensor.permute(0, 3, 1, 2).float().div_(255.0)


@functools.cache
def features_version() -> str:
    """The code that computes features (this package's sources and torch's version), for the keys of cached
    features: a change that moves a feature's bits (2026-12-03: the order-0 low-pass in float64) makes every
    cache computed before it a miss, never a mix of old and new bits."""
    return sources_digest(Path(__file__).parent, torch.__version__)


def _digests(images: npt.NDArray[np.uint8]) -> list[bytes]:
    """One content digest per image (what :class:`FixedFront` looks rows up by)."""
    return [hashlib.blake2b(image.tobytes(), digest_size=16).digest() for image in images]


class FixedFront:
    """The backbone's fixed front end (:meth:`~capc_common.models.Backbone.fixed_features`, the scattering)
    of a set of images, computed once and looked up by each image's content.

    The scattering is most of the cost of a feature and depends on its image alone (no weights, no
    statistics; the same bits however the images are batched), while what follows it depends on the chunk
    (current statistics). A party that featurises its records several ways — each teacher's shard in
    current statistics for its heads, every record alone for its records cache — computes the scattering
    once here and :func:`extract_features` takes the rest from it: the features are the same bits.
    """

    def __init__(self, backbone: Backbone, images: npt.NDArray[np.uint8], table: torch.Tensor) -> None:
        self.backbone = backbone
        self._rows = {digest: row for row, digest in enumerate(_digests(images))}
        self._table = table

    @classmethod
    def of(
        cls, backbone: Backbone, images: npt.NDArray[np.uint8], *, max_bytes: int = FRONT_MAX_BYTES
    ) -> FixedFront | None:
        """The fixed front end of ``images`` (uint8 ``(N, H, W, C)``), or None where the backbone has none
        (nothing to share) or the table would exceed ``max_bytes`` of memory (each use computes its own)."""
        if not backbone.has_fixed or len(images) == 0:
            return None
        device = backbone.device
        with torch.inference_mode():
            first = backbone.fixed_features(to_tensor(images[:_FRONT_PASS], device=device)).cpu()
            if first[0].numel() * first.element_size() * len(images) > max_bytes:
                return None
            table = torch.empty((len(images), *first.shape[1:]), dtype=first.dtype)
            table[: len(first)] = first
            for start in range(_FRONT_PASS, len(images), _FRONT_PASS):
                chunk = to_tensor(images[start : start + _FRONT_PASS], device=device)
                table[start : start + len(chunk)] = backbone.fixed_features(chunk).cpu()
        return cls(backbone, images, table)

    def index(self, images: npt.NDArray[np.uint8]) -> torch.Tensor | None:
        """The table's rows of ``images`` (None if one of them is not in it), for :meth:`take`."""
        rows = [self._rows.get(digest) for digest in _digests(images)]
        if any(row is None for row in rows):
            return None
        return torch.tensor(rows, dtype=torch.long)

    def take(self, rows: torch.Tensor) -> torch.Tensor:
        """The front end at these rows of the table (a chunk's worth at a time: the caller never holds a
        second copy of the table)."""
        return self._table[rows]


def extract_features(
    backbone: Backbone,
    images: npt.NDArray[np.uint8],
    *,
    bn_batch: int,
    mode: str = "current",
    progress: bool = False,
    front: FixedFront | None = None,
) -> npt.NDArray[np.float32]:
    """Features of ``images`` computed chunk by chunk with BatchNorm statistics ``mode``.

    Args:
        backbone: the shared backbone.
        images: uint8 ``(N, H, W, C)`` matching ``backbone.input_shape``.
        bn_batch: chunk size (the query batch size of the protocol; ≥ 2 for ``current``, 16+ advised).
        mode: ``current`` (statistics of each chunk) or ``running`` (stored averages).
        progress: show a progress bar on stderr.
        front: this backbone's fixed front end of these images, computed before (the same features, from
            the table instead of computing it again); without all of them in it, computed as without it.

    Returns:
        float32 ``(N, backbone.feature_dim)``.

    Raises:
        InputError: wrong dtype or shape, ``N < bn_batch``, bad ``bn_batch`` or mode.
    """
    if mode not in BN_MODES:
        raise InputError(f"unknown BatchNorm statistics mode {mode!r}; expected 'current' or 'running'")
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4:
        got = f"{images.dtype} {images.shape}" if isinstance(images, np.ndarray) else type(images).__name__
        raise InputError(f"extract_features takes uint8 images (N, H, W, C), got {got}")
    if tuple(images.shape[1:]) != tuple(backbone.input_shape):
        raise InputError(
            f"images are {format_shape(images.shape[1:])} (HxWxC) but the backbone takes "
            f"{format_shape(backbone.input_shape)}; pick the backbone for this shape (default_backbone)"
        )
    if bn_batch < 1 or (mode == "current" and bn_batch < 2):
        raise InputError(
            f"bn_batch must be at least {2 if mode == 'current' else 1} in mode {mode!r}, got {bn_batch}"
        )
    n = len(images)
    if n < bn_batch:
        raise InputError(
            f"{n} images are fewer than one BatchNorm batch of {bn_batch}; the chunking rule needs at least "
            f"bn_batch images (send more queries or lower bn_batch)"
        )
    out = np.empty((n, backbone.feature_dim), dtype=np.float32)
    starts = chunk_starts(n, bn_batch=bn_batch)
    device = backbone.device
    done = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc="features", unit="img", file=sys.stderr, leave=False, dynamic_ncols=True)
    rows = None if front is None or front.backbone is not backbone else front.index(images)
    with torch.inference_mode(), bn_stats(backbone, mode):
        for start in starts:
            if rows is None or front is None:
                feats = backbone.features(to_tensor(images[start : start + bn_batch], device=device))
            else:
                feats = backbone.features_from_fixed(front.take(rows[start : start + bn_batch]).to(device))
            keep = done - start  # rows of this chunk already produced by the previous one
            out[done : start + bn_batch] = feats[keep:].float().cpu().numpy()
            if bar is not None:
                bar.update(start + bn_batch - done)
            done = start + bn_batch
    if bar is not None:
        bar.close()
    return out
