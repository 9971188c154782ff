"""IDX files (the MNIST / Fashion-MNIST format), plain or gzipped, parsed with every check spelled out.

Format (LeCun): two zero bytes, a type byte (0x08 = unsigned byte, the only type image datasets use), the
number of dimensions, then one big-endian uint32 per dimension, then the row-major payload. A file that is
truncated, has the wrong magic or a payload that does not match its header fails here with the path and the
expected vs found sizes, instead of as a reshape error deep inside numpy.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import numpy.typing as npt

from capc_common.data.dataset import Dataset
from capc_common.errors import InputError

__all__ = ["load_idx", "read_idx"]

_UBYTE = 0x08


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise InputError(f"IDX file {path} does not exist (expected a file, plain or .gz)")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(
            f"IDX file {path} cannot be read ({exc}); the gzip stream is truncated or corrupt — "
            "download the file again"
        ) from exc


def read_idx(path: str | Path, *, ndim: int) -> npt.NDArray[np.uint8]:
    """Read one unsigned-byte IDX file with ``ndim`` dimensions.

    Args:
        path: ``*-idx?-ubyte`` file, optionally gzipped (``.gz``).
        ndim: expected number of dimensions (3 for images ``N×H×W``, 1 for labels).

    Returns:
        The payload as a uint8 array of the header's shape.

    Raises:
        InputError: missing or unreadable file, bad magic, wrong type or dimension count, truncated or
            oversized payload.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise InputError(f"IDX file {path} is {len(data)} bytes long: too short for the 4-byte magic number")
    zero0, zero1, dtype, dims = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0:
        raise InputError(
            f"IDX file {path} has bad magic {data[:4].hex()}: an IDX file starts with two zero bytes "
            "(is this really an IDX file, or an HTML error page / image?)"
        )
    if dtype != _UBYTE:
        raise InputError(
            f"IDX file {path} stores type 0x{dtype:02x}; only unsigned bytes (0x08) are supported"
        )
    if dims != ndim:
        raise InputError(
            f"IDX file {path} has {dims} dimensions, expected {ndim} "
            f"({'images N×H×W' if ndim == 3 else 'labels N'}); were the image and label files swapped?"
        )
    header = 4 + 4 * dims
    if len(data) < header:
        raise InputError(f"IDX file {path} is truncated inside its header ({len(data)} of {header} bytes)")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    expected = int(np.prod(shape, dtype=np.int64))
    found = len(data) - header
    if found < expected:
        raise InputError(
            f"IDX file {path} is truncated: its header announces shape {shape} ({expected} bytes of data) "
            f"but only {found} bytes follow; download the file again"
        )
    if found > expected:
        raise InputError(
            f"IDX file {path} has {found - expected} bytes after the {expected} bytes its header {shape} "
            "announces; the file is corrupt or the header is wrong"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape).copy()


def load_idx(
    images_path: str | Path,
    labels_path: str | Path,
    *,
    num_classes: int | None = None,
    class_names: tuple[str, ...] | None = None,
    name: str | None = None,
) -> Dataset:
    """Load an IDX image file and its label file into a :class:`Dataset`.

    Args:
        images_path: IDX file of shape ``N×H×W`` (grey images).
        labels_path: IDX file of shape ``N``.
        num_classes: number of classes; defaults to ``len(class_names)`` or ``max(label) + 1``.
        class_names: class names; default ``("0", "1", ...)``.
        name: dataset name for messages; defaults to the image path.

    Raises:
        InputError: any file problem (see :func:`read_idx`), image/label count mismatch, label out of range.
    """
    images = read_idx(images_path, ndim=3)
    labels = read_idx(labels_path, ndim=1).astype(np.int64)
    if len(images) != len(labels):
        raise InputError(
            f"IDX files disagree: {images_path} holds {len(images)} images but {labels_path} holds "
            f"{len(labels)} labels; they must come from the same split"
        )
    if num_classes is None:
        num_classes = len(class_names) if class_names is not None else int(labels.max(initial=-1)) + 1
    if class_names is None:
        class_names = tuple(str(i) for i in range(num_classes))
    if len(labels) and int(labels.max()) >= num_classes:
        raise InputError(
            f"IDX label file {labels_path} contains label {int(labels.max())} but the dataset has "
            f"{num_classes} classes (0..{num_classes - 1}); the label file is corrupt or belongs to another "
            "dataset"
        )
    return Dataset(
        images=images[..., np.newaxis],
        labels=labels,
        num_classes=num_classes,
        class_names=class_names,
        name=name or str(images_path),
    )
