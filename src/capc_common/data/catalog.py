"""``load_dataset(name)``: the named datasets and the prefixes that point at a site's own files.

Names: ``fashion-mnist`` (IDX files; directory from ``root``, else ``$CAPC_FASHION_MNIST``, else the Debian
package's ``/usr/share/datasets/fashion-mnist``), ``digits`` (scikit-learn's 8×8 digits), ``digits-28`` (the
same digits in MNIST's layout: each 8×8 image enlarged to 20×20 and centred in a 28×28 frame, so the
28×28 backbone reads them; the second real dataset the joining benchmark measures), ``idx:<dir>`` (any
MNIST-style IDX directory), ``npz:<path>`` (or any path ending in ``.npz``) and ``folder:<path>`` (a
hospital's own data).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from capc_common.data.dataset import Dataset
from capc_common.data.files import load_image_folder, load_npz
from capc_common.data.idx import load_idx
from capc_common.errors import InputError

__all__ = ["DATASET_NAMES", "FASHION_MNIST_CLASSES", "FASHION_MNIST_DIR", "load_dataset"]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
DATASET_NAMES = (
    "fashion-mnist",
    "digits",
    "digits-28",
    "idx:<dir>",
    "npz:<path>",
    "<path>.npz",
    "folder:<path>",
)
_SPLITS = ("train", "test")
_IDX_PREFIX = {"train": "train", "test": "t10k"}
# scikit-learn's digits have no official split: a fixed, seeded 80/20 split keeps every run comparable.
_DIGITS_SPLIT_SEED = 20_240_601
_DIGITS_TEST_FRACTION = 0.2


def _idx_file(directory: Path, stem: str) -> Path:
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    raise InputError(
        f"IDX directory {directory} lacks {stem} (or {stem}.gz); expected the four MNIST-style files "
        "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte"
    )


def _load_idx_dir(
    directory: Path, split: str, *, name: str, class_names: tuple[str, ...] | None = None
) -> Dataset:
    if not directory.is_dir():
        hint = (
            " (install the Debian package fashion-mnist, or set CAPC_FASHION_MNIST to a directory holding "
            "the IDX files)"
            if name.startswith("fashion-mnist")
            else ""
        )
        raise InputError(f"dataset directory {directory} does not exist{hint}")
    prefix = _IDX_PREFIX[split]
    return load_idx(
        _idx_file(directory, f"{prefix}-images-idx3-ubyte"),
        _idx_file(directory, f"{prefix}-labels-idx1-ubyte"),
        num_classes=len(class_names) if class_names else None,
        class_names=class_names,
        name=name,
    )


def _digits_file() -> Path:
    """scikit-learn's copy of the UCI 8×8 digits (``digits.csv.gz``: 64 pixels in 0..16, then the label),
    found without importing scikit-learn: ``sklearn.datasets.load_digits`` reads the same file, after 1.2 s
    of imports that every process loading digits paid (dozens in the test suite)."""
    spec = importlib.util.find_spec("sklearn")
    locations = None if spec is None else spec.submodule_search_locations
    if not locations:
        raise InputError(
            "the digits dataset ships with scikit-learn, which is not installed: pip install scikit-learn"
        )
    path = Path(locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise InputError(f"scikit-learn's digits file is missing at {path}; reinstall scikit-learn")
    return path


def _load_digits(split: str) -> Dataset:
    table = np.loadtxt(_digits_file(), delimiter=",")  # what load_digits() parses
    pixels = table[:, :-1].reshape(-1, 8, 8)  # 0..16
    images = np.rint(pixels * (255.0 / 16.0)).astype(np.uint8)[..., np.newaxis]
    labels = table[:, -1].astype(np.int64)
    order = np.random.default_rng(_DIGITS_SPLIT_SEED).permutation(len(labels))
    n_test = round(len(labels) * _DIGITS_TEST_FRACTION)
    chosen = np.sort(order[:n_test] if split == "test" else order[n_test:])
    return Dataset(
        images=images[chosen],
        labels=labels[chosen],
        num_classes=10,
        class_names=tuple(str(i) for i in range(10)),
        name=f"digits/{split}",
    )


def _digits_28(split: str) -> Dataset:
    """The digits enlarged to 20×20 (bilinear, Pillow) and centred in a 28×28 frame: MNIST's layout."""
    from PIL import Image

    small = _load_digits(split)
    frames = np.zeros((len(small.labels), 28, 28, 1), dtype=np.uint8)
    for i, image in enumerate(small.images[..., 0]):
        frames[i, 4:24, 4:24, 0] = np.asarray(
            Image.fromarray(image).resize((20, 20), Image.Resampling.BILINEAR)
        )
    return replace(small, images=frames, name=f"digits-28/{split}")


def load_dataset(name: str, *, split: str = "train", root: str | Path | None = None) -> Dataset:
    """Load a dataset by name.

    Args:
        name: ``fashion-mnist``, ``digits``, ``digits-28``, ``idx:<dir>``, ``npz:<path>`` or
            ``folder:<path>``.
        split: ``train`` or ``test``.
        root: directory overriding the default location of ``fashion-mnist``.

    Returns:
        The dataset, validated (uint8 images ``(N, H, W, C)``, int64 labels in range).

    Raises:
        InputError: unknown name or split, or any missing/corrupt file (the message names the path).
    """
    if split not in _SPLITS:
        raise InputError(f"unknown split {split!r}; expected one of {', '.join(_SPLITS)}")
    if name == "fashion-mnist":
        env = os.environ.get("CAPC_FASHION_MNIST")
        directory = Path(root) if root is not None else Path(env) if env else FASHION_MNIST_DIR
        return _load_idx_dir(
            directory, split, name=f"fashion-mnist/{split}", class_names=FASHION_MNIST_CLASSES
        )
    if name == "digits":
        return _load_digits(split)
    if name == "digits-28":
        return _digits_28(split)
    kind, sep, location = name.partition(":")
    if sep and location:
        if kind == "idx":
            return _load_idx_dir(Path(location), split, name=f"{location}/{split}")
        if kind == "npz":
            return load_npz(location, split=split)
        if kind == "folder":
            return load_image_folder(location, split=split)
    if name.endswith(".npz"):
        return load_npz(name, split=split)
    hint = ""
    if "/" in name:
        hint = (
            f"; a path names its format with a prefix (npz:{name}, folder:{name} or idx:{name}) unless it "
            "is a file ending in .npz"
        )
    raise InputError(f"unknown dataset {name!r}; expected one of {', '.join(DATASET_NAMES)}{hint}")
