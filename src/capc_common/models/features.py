"""Batch feature extraction with the DESIGN §3 chunking rule, so every party computes identical features.

With current statistics a feature depends on the whole batch it was computed in, so teachers, the student
and users must cut a query set into the *same* chunks. The rule: consecutive chunks of exactly ``bn_batch``
images; if ``N`` is not a multiple of ``bn_batch`` the last chunk is the final ``bn_batch`` images (it
overlaps the previous one) and only its new rows are kept. Every chunk therefore has the same size, so the
statistics are always estimated from ``bn_batch`` images.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt
import torch

from capc_common.errors import InputError
from capc_common.models.backbone import Backbone, format_shape
from capc_common.models.batchnorm import BN_MODES, bn_stats

__all__ = ["chunk_starts", "extract_features", "to_tensor"]


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


def extract_features(
    backbone: Backbone,
    images: npt.NDArray[np.uint8],
    *,
    bn_batch: int,
    mode: str = "current",
    progress: bool = False,
) -> npt.NDArray[np.float32]:
    """Features of ``images`` computed chunk by chunk with BatchNorm statistics ``mode``.

    Args:
        backbone: the shared backbone.
        images: uint8 ``(N, H, W, C)`` matching ``backbone.input_shape``.
        bn_batch: chunk size (the query batch size of the protocol; ≥ 2 for ``current``, 16+ advised).
        mode: ``current`` (statistics of each chunk) or ``running`` (stored averages).
        progress: show a progress bar on stderr.

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
    with torch.inference_mode(), bn_stats(backbone, mode):
        for start in starts:
            feats = backbone.features(to_tensor(images[start : start + bn_batch], device=device))
            keep = done - start  # rows of this chunk already produced by the previous one
            out[done : start + bn_batch] = feats[keep:].float().cpu().numpy()
            if bar is not None:
                bar.update(start + bn_batch - done)
            done = start + bn_batch
    if bar is not None:
        bar.close()
    return out
