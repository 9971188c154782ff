"""Featurizers: what turns uint8 images into the feature vectors heads are trained on.

A featurizer applies one fixed map in chunks of exactly ``bn_batch`` images (the chunking rule of
:func:`capc_common.models.chunk_starts`), so a feature depends on its own chunk only and every party that
cuts a batch the same way gets the same numbers.

* :class:`BackboneFeaturizer` — the shared frozen backbone (DIET-PATE), via
  :func:`capc_common.models.extract_features`.
* :class:`PixelFeaturizer` — no backbone at all: raw pixels, standardised per chunk (``current``) or mapped
  to ``[-1, 1]`` (``running``). Heads trained on it from a random initialisation are the paper's "PATE
  without public data" baseline: nothing is pretrained, everything is learned from the private shard.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

if TYPE_CHECKING:
    from capc_common.models import Backbone, FixedFront

__all__ = ["BackboneFeaturizer", "Featurizer", "PixelFeaturizer"]


class Featurizer(Protocol):
    """A deterministic image → feature map applied in chunks of exactly ``bn_batch``."""

    @property
    def sha256(self) -> str:
        """Identifies the map (heads trained on one featurizer only fit that one)."""

    @property
    def name(self) -> str:
        """Human-readable name for reports."""

    @property
    def feature_dim(self) -> int:
        """Length of a feature vector."""

    def extract(self, images: npt.NDArray[np.uint8], *, bn_batch: int, mode: str) -> npt.NDArray[np.float32]:
        """Features ``(N, feature_dim)`` of uint8 images ``(N, H, W, C)``."""


class BackboneFeaturizer:
    """The shared frozen backbone as a featurizer; with ``front``, the fixed front end of the images it
    featurises is taken from that table (:class:`~capc_common.models.FixedFront`: the same features)."""

    def __init__(self, backbone: Backbone, *, front: FixedFront | None = None) -> None:
        self.backbone = backbone
        self.front = front
        self._sha = backbone.sha256

    @property
    def sha256(self) -> str:
        """The backbone's content hash."""
        return self._sha

    @property
    def name(self) -> str:
        """The architecture name."""
        return str(self.backbone.arch)

    @property
    def feature_dim(self) -> int:
        """The backbone's feature size."""
        return self.backbone.feature_dim

    def extract(self, images: npt.NDArray[np.uint8], *, bn_batch: int, mode: str) -> npt.NDArray[np.float32]:
        """:func:`capc_common.models.extract_features` with the given chunk size and statistics."""
        from capc_common.models import extract_features

        return extract_features(self.backbone, images, bn_batch=bn_batch, mode=mode, front=self.front)


class PixelFeaturizer:
    """Raw pixels as features: per-chunk standardisation (``current``) or a fixed ``[-1, 1]`` map."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = tuple(int(v) for v in shape)

    @property
    def sha256(self) -> str:
        """A hash of the map's definition (there are no weights)."""
        return hashlib.sha256(f"pixels-v1:{self.shape}".encode()).hexdigest()

    @property
    def name(self) -> str:
        """``pixels``."""
        return "pixels"

    @property
    def feature_dim(self) -> int:
        """``H·W·C``."""
        return int(np.prod(self.shape))

    def extract(self, images: npt.NDArray[np.uint8], *, bn_batch: int, mode: str) -> npt.NDArray[np.float32]:
        """Flattened pixels, standardised per chunk of exactly ``bn_batch`` in ``current`` mode.

        Raises:
            InputError: wrong dtype/shape, fewer images than ``bn_batch``, or an unknown mode.
        """
        from capc_common.models import chunk_starts

        if images.dtype != np.uint8 or tuple(images.shape[1:]) != self.shape:
            raise InputError(f"expected uint8 images (N, {self.shape}), got {images.dtype} {images.shape}")
        x = images.reshape(len(images), -1).astype(np.float32) / 255.0
        if mode == "running":
            return x * 2.0 - 1.0
        if mode != "current":
            raise InputError(f"unknown statistics mode {mode!r}; expected 'current' or 'running'")
        if len(images) < bn_batch or bn_batch < 2:
            raise InputError(f"{len(images)} images cannot be cut into chunks of bn_batch={bn_batch}")
        out = np.empty_like(x)
        done = 0
        for start in chunk_starts(len(x), bn_batch=bn_batch):
            chunk = x[start : start + bn_batch]
            z = (chunk - chunk.mean(axis=0)) / np.sqrt(chunk.var(axis=0) + 1e-5)
            out[done : start + bn_batch] = z[done - start :]
            done = start + bn_batch
        return out
