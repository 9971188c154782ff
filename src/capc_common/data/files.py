"""A hospital's own data: an ``.npz`` archive or a folder of PNG/JPEG/TIFF/DICOM images, one sub-folder per
class.

Both loaders check everything a site could get wrong (missing keys, wrong dtypes, ragged image sizes, empty
class folders, unreadable images) and say which file and what was expected, because the person reading the
message is an operator at a teacher site, not the author of this code.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.data.dataset import Dataset
from capc_common.data.pixels import IMAGE_SUFFIXES, read_images
from capc_common.errors import InputError

__all__ = ["IMAGE_SUFFIXES", "decode_images", "image_folder_files", "load_image_folder", "load_npz"]


def _as_uint8_images(array: npt.NDArray[Any], *, where: str) -> npt.NDArray[np.uint8]:
    """Bring ``(N, H, W)`` / ``(N, H, W, C)`` uint8, or float in [0, 1], to uint8 ``(N, H, W, C)``."""
    if array.ndim == 3:
        array = array[..., np.newaxis]
    if array.ndim != 4 or array.shape[3] not in (1, 3):
        raise InputError(
            f"{where}: images must have shape (N, H, W) or (N, H, W, C) with C 1 or 3, got {array.shape}"
        )
    if array.dtype == np.uint8:
        return np.asarray(array, dtype=np.uint8)
    if np.issubdtype(array.dtype, np.floating):
        lo, hi = (float(array.min()), float(array.max())) if array.size else (0.0, 1.0)
        if lo < 0.0 or hi > 1.0 or not np.isfinite([lo, hi]).all():
            raise InputError(
                f"{where}: float images must lie in [0, 1], found values in [{lo}, {hi}]; "
                "store uint8 pixels (0..255) or scale floats to [0, 1]"
            )
        return np.rint(array * 255.0).astype(np.uint8)
    raise InputError(f"{where}: images must be uint8 (0..255) or float in [0, 1], got dtype {array.dtype}")


def _as_labels(array: npt.NDArray[Any], *, where: str) -> npt.NDArray[np.int64]:
    if array.ndim != 1:
        raise InputError(f"{where}: labels must be a 1-D array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"{where}: labels must be integers (class indices), got dtype {array.dtype}")
    return array.astype(np.int64)


def load_npz(path: str | Path, *, split: str = "train") -> Dataset:
    """Load a dataset from an ``.npz`` archive.

    Keys: ``{split}_images``/``{split}_labels`` when present (e.g. ``train_images``, ``test_images``),
    otherwise ``images``/``labels`` (served as the ``train`` split: a site's private data is training data).
    Optional ``class_names`` (array of strings) and ``num_classes``. Images are uint8 ``(N, H, W[, C])`` or
    floats in [0, 1].

    Raises:
        InputError: missing/unreadable file, missing keys, wrong shapes or dtypes, labels out of range.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"npz dataset {path} does not exist (expected an .npz file from numpy.savez)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(
            f"npz dataset {path} cannot be read ({exc}); is it a complete numpy .npz file?"
        ) from exc
    if f"{split}_images" in arrays:
        image_key, label_key = f"{split}_images", f"{split}_labels"
    elif split == "train":
        image_key, label_key = "images", "labels"
    else:
        raise InputError(
            f"npz dataset {path} has no {split!r} split: expected keys {split}_images/{split}_labels, "
            f"found {sorted(arrays)}"
        )
    missing = [k for k in (image_key, label_key) if k not in arrays]
    if missing:
        raise InputError(f"npz dataset {path} lacks key(s) {missing}; found {sorted(arrays)}")
    where = f"npz dataset {path} [{image_key}]"
    images = _as_uint8_images(arrays[image_key], where=where)
    labels = _as_labels(arrays[label_key], where=f"npz dataset {path} [{label_key}]")
    if len(images) != len(labels):
        raise InputError(f"npz dataset {path}: {len(images)} images in {image_key} but {len(labels)} labels")
    names: tuple[str, ...] | None = None
    if "class_names" in arrays:
        names = tuple(str(n) for n in arrays["class_names"].tolist())
    if "num_classes" in arrays:
        num_classes = int(arrays["num_classes"])
    elif names is not None:
        num_classes = len(names)
    else:
        num_classes = int(labels.max(initial=-1)) + 1
    if names is None:
        names = tuple(str(i) for i in range(num_classes))
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise InputError(
            f"npz dataset {path}: labels span [{labels.min()}, {labels.max()}] but there are {num_classes} "
            f"classes; labels must be 0..{num_classes - 1}"
        )
    return Dataset(images=images, labels=labels, num_classes=num_classes, class_names=names, name=str(path))


def _class_dirs(root: Path) -> list[Path]:
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not dirs:
        raise InputError(
            f"image folder {root} has no class sub-folders; expected {root}/<class name>/<image>.png "
            "(one folder per class)"
        )
    return dirs


def image_folder_files(root: str | Path, *, split: str = "train") -> tuple[list[tuple[Path, str]], Path]:
    """The images of ``root/<class>/<image>`` (PNG, JPEG, TIFF or DICOM; or ``root/<split>/<class>/...``),
    each with its class folder's name, in sorted order; and the folder the classes are in.

    Raises:
        InputError: missing folder, no class folders, or an empty class folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(
            f"image folder {root} does not exist (expected a directory with one folder per class)"
        )
    if (root / split).is_dir():
        root = root / split
    elif split != "train":
        raise InputError(f"image folder {root} has no {split!r} sub-folder (expected {root / split})")
    files: list[tuple[Path, str]] = []
    empty: list[Path] = []
    for folder in _class_dirs(root):
        found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        empty += [] if found else [folder]
        files.extend((p, folder.name) for p in found)
    if empty:
        named = f"class folder {empty[0]} holds" if len(empty) == 1 else f"class folders {empty} hold"
        raise InputError(f"{named} no images (expected files ending in {', '.join(IMAGE_SUFFIXES)})")
    return files, root


def decode_images(
    paths: Sequence[Path], *, size: tuple[int, int, int] | None = None
) -> npt.NDArray[np.uint8]:
    """Decode image files into one uint8 ``(N, H, W, C)`` array, each file's depth and mode brought to 8
    bits as :mod:`capc_common.data.pixels` says (16-bit grey scaled, never clipped; palette looked up; alpha
    over black).

    Args:
        paths: PNG, JPEG, TIFF or DICOM files.
        size: ``(height, width, channels)`` to convert every image to (its aspect ratio kept by padding);
            None: keep their size, which must be the same for all, and make them RGB if any has colour
            (grey images are replicated), otherwise grey.

    Raises:
        InputError: every unreadable image, or (without ``size``) every image of another size.
    """
    images, _ = read_images(paths, size=size)
    return images


def load_image_folder(root: str | Path, *, split: str = "train") -> Dataset:
    """Load ``root/<class>/<image>`` (PNG, JPEG, TIFF or DICOM; or ``root/<split>/<class>/...`` when present).

    Classes are the sub-folder names in sorted order. Every image must have the same height and width. If
    any image has colour the dataset is RGB (grey images are replicated to three channels), otherwise grey.

    Raises:
        InputError: missing folder, no class folders, an empty class folder, an unreadable image, or images
            of different sizes.
    """
    files, root = image_folder_files(root, split=split)
    names = tuple(sorted({name for _, name in files}))
    return Dataset(
        images=decode_images([path for path, _ in files]),
        labels=np.asarray([names.index(name) for _, name in files], dtype=np.int64),
        num_classes=len(names),
        class_names=names,
        name=str(root),
    )
