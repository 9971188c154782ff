"""The one in-memory dataset type every part of the library passes around.

A frozen dataclass over two read-only arrays: uint8 images ``(N, H, W, C)`` and int64 labels ``(N,)``. It is
validated once, on construction, so code downstream (teachers, student, benchmarks) can trust shapes and label
ranges instead of re-checking them or failing deep inside torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = ["Dataset"]


def _readonly(array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    view = array.view()
    view.setflags(write=False)
    return view


@dataclass(frozen=True)
class Dataset:
    """Labelled images held in memory.

    Attributes:
        images: uint8 array ``(N, H, W, C)`` (C is 1 or 3), read-only.
        labels: int64 array ``(N,)`` with values in ``[0, num_classes)``, read-only.
        num_classes: number of classes (may exceed the labels present, e.g. in a small shard).
        class_names: one human-readable name per class.
        name: where the data came from (``"fashion-mnist/train"``, a path, ...), for messages and reports.
    """

    images: npt.NDArray[np.uint8]
    labels: npt.NDArray[np.int64]
    num_classes: int
    class_names: tuple[str, ...]
    name: str

    def __post_init__(self) -> None:
        images, labels = self.images, self.labels
        if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4:
            got = (
                f"{images.dtype} {images.shape}" if isinstance(images, np.ndarray) else type(images).__name__
            )
            raise InputError(
                f"dataset {self.name!r}: images must be a uint8 array (N, H, W, C), got {got}; "
                "convert with np.asarray(x, dtype=np.uint8) and add a channel axis for grey images"
            )
        if images.shape[3] not in (1, 3):
            raise InputError(
                f"dataset {self.name!r}: images must have 1 (grey) or 3 (RGB) channels, got {images.shape[3]}"
            )
        if not isinstance(labels, np.ndarray) or labels.dtype != np.int64 or labels.ndim != 1:
            got = (
                f"{labels.dtype} {labels.shape}" if isinstance(labels, np.ndarray) else type(labels).__name__
            )
            raise InputError(f"dataset {self.name!r}: labels must be an int64 array (N,), got {got}")
        if len(labels) != len(images):
            raise InputError(
                f"dataset {self.name!r}: {len(images)} images but {len(labels)} labels; "
                "every image needs exactly one label"
            )
        if self.num_classes < 1:
            raise InputError(f"dataset {self.name!r}: num_classes must be at least 1, got {self.num_classes}")
        if len(self.class_names) != self.num_classes:
            raise InputError(
                f"dataset {self.name!r}: {len(self.class_names)} class names for {self.num_classes} classes"
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            bad = int(labels.min()) if labels.min() < 0 else int(labels.max())
            raise InputError(
                f"dataset {self.name!r}: label {bad} is outside [0, {self.num_classes}); "
                "labels must be class indices 0..num_classes-1"
            )
        object.__setattr__(self, "images", _readonly(images))
        object.__setattr__(self, "labels", _readonly(labels))
        object.__setattr__(self, "class_names", tuple(str(n) for n in self.class_names))

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """Image shape ``(H, W, C)``."""
        _, h, w, c = self.images.shape
        return int(h), int(w), int(c)

    def subset(self, indices: npt.ArrayLike, *, name: str | None = None) -> Dataset:
        """Return the examples at ``indices`` (e.g. one shard of :func:`capc_common.data.partition`)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (len(idx) and (idx.min() < 0 or idx.max() >= len(self))):
            raise InputError(f"dataset {self.name!r}: subset indices must be 1-D and within [0, {len(self)})")
        return Dataset(
            images=self.images[idx],
            labels=self.labels[idx],
            num_classes=self.num_classes,
            class_names=self.class_names,
            name=name or f"{self.name}[{len(idx)}]",
        )
