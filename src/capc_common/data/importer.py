"""``capc data import``: a hospital's images — an image folder, or a CSV of (path, label) — into the ``.npz``
a site file names (``data: {dataset: /data/site.npz}``).

Labels become the federation's class indices: by name, when the coordinator's class names are given in
the federation's order (``classes``), or as integer indices already. The images are decoded as the folder
loader decodes them (:func:`~capc_common.data.files.decode_images`), optionally converted to the
federation's query size. Every problem — an unreadable image, images of mixed sizes, a label that is no
class, a row without a file — is an :class:`InputError` naming the file or row, and nothing is written
until everything has been read (the file appears whole, or not at all).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from capc_common.data.dataset import Dataset
from capc_common.data.files import decode_images, image_folder_files
from capc_common.errors import InputError

__all__ = ["import_images", "npz_target", "read_table", "write_npz"]

#: Most unknown labels a message lists.
_SHOWN = 5


def read_table(path: str | Path) -> list[tuple[Path, str]]:
    """The rows of a CSV file with a header naming ``path`` and ``label`` columns (others are ignored);
    relative paths are relative to the CSV file's directory.

    Raises:
        InputError: a missing or unreadable file, missing columns, an empty table, or a row with an empty
            field or a path that is not a file (the row number says which).
    """
    table = Path(path)
    if not table.is_file():
        raise InputError(
            f"CSV file {table} does not exist (expected a header `path,label` and one row per image)"
        )
    try:
        with table.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            missing = [c for c in ("path", "label") if c not in columns]
            if missing:
                raise InputError(
                    f"CSV file {table} has columns {columns}; it needs a header naming `path` and `label` "
                    f"(missing: {missing})"
                )
            raw = [
                (number, row.get("path") or "", row.get("label") or "")
                for number, row in enumerate(reader, 2)
            ]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"CSV file {table} cannot be read ({exc}); is it a UTF-8 text file?") from exc
    if not raw:
        raise InputError(f"CSV file {table} has a header but no rows")
    rows = []
    for number, location, label in raw:
        if not location.strip() or not label.strip():
            raise InputError(f"CSV file {table} line {number}: empty path or label ({location!r}, {label!r})")
        image = Path(location.strip())
        image = image if image.is_absolute() else table.parent / image
        if not image.is_file():
            raise InputError(
                f"CSV file {table} line {number}: image {image} does not exist (relative paths are read from "
                f"{table.parent})"
            )
        rows.append((image, label.strip()))
    return rows


def _indices(
    names: Sequence[str], classes: Sequence[str] | None, *, where: Sequence[str]
) -> tuple[npt.NDArray[np.int64], tuple[str, ...]]:
    """Class indices of each label and the class names; ``where[i]`` says where label ``i`` came from.

    With ``classes``, a label is one of those names, or an integer index into them; without, an integer.
    """
    known = {name: i for i, name in enumerate(classes or ())}
    labels, unknown = [], []
    for i, name in enumerate(names):
        if name in known:
            labels.append(known[name])
        elif name.isdigit() and (classes is None or int(name) < len(classes)):
            labels.append(int(name))
        else:
            unknown.append(f"{name!r} ({where[i]})")
    unknown = list(dict.fromkeys(unknown))  # an image folder's files share their folder's label
    if unknown:
        shown = ", ".join(unknown[:_SHOWN]) + (
            f" and {len(unknown) - _SHOWN} more" if len(unknown) > _SHOWN else ""
        )
        if classes is None:
            raise InputError(
                f"{len(unknown)} label(s) are not class indices: {shown}; name the classes in the "
                "federation's order with --classes NAME,NAME,… (docs/data.md), or use indices 0, 1, …"
            )
        raise InputError(
            f"{len(unknown)} label(s) are not among the {len(classes)} classes {list(classes)}: {shown}; "
            "fix the labels, or add the class to --classes in the federation's order"
        )
    names = tuple(classes) if classes is not None else tuple(map(str, range(max(labels, default=-1) + 1)))
    return np.asarray(labels, dtype=np.int64), names


def import_images(
    source: str | Path, *, classes: Sequence[str] | None = None, size: tuple[int, int, int] | None = None
) -> Dataset:
    """Read a hospital's labelled images.

    Args:
        source: an image folder (``<class>/<image>.png|.jpg``, or ``train/<class>/…``; a class is its
            folder's name) or a ``.csv`` file of ``path,label`` rows.
        classes: the federation's class names in its order (a label's index is its position); None: an
            image folder's classes are its folder names in sorted order, a CSV's labels are indices.
        size: ``(height, width, channels)`` to convert every image to; None: keep them as they are (all
            the same size).

    Raises:
        InputError: a missing source, an unreadable image, mixed sizes without ``size``, a label that is
            no class, a duplicate class name.
    """
    path = Path(source)
    if classes is not None and len(set(classes)) != len(classes):
        raise InputError(f"--classes names a class twice: {list(classes)}")
    if path.is_dir():
        files, root = image_folder_files(path)
        if classes is None:
            classes = sorted({name for _, name in files})
        where = [f"folder {root / name}" for _, name in files]
    elif path.suffix.lower() == ".csv":
        files = read_table(path)
        where = [f"{image.name}" for image, _ in files]
    else:
        raise InputError(
            f"{path} is neither an image folder (one sub-folder per class) nor a .csv file of path,label rows"
        )
    labels, names = _indices([label for _, label in files], classes, where=where)
    images = decode_images([image for image, _ in files], size=size)
    return Dataset(images=images, labels=labels, num_classes=len(names), class_names=names, name=str(path))


def npz_target(out: str | Path, *, force: bool = False) -> Path:
    """Where :func:`write_npz` may write (checked before any image is read, so a bad ``--out`` fails fast).

    Raises:
        InputError: ``out`` does not end in ``.npz``, or exists and ``force`` is not set.
    """
    target = Path(out)
    if target.suffix != ".npz":
        raise InputError(
            f"--out {target} must end in .npz (a site file's `dataset:` reads it by that suffix)"
        )
    if target.exists() and not force:
        raise InputError(f"{target} exists; choose another --out, or pass --force to replace it")
    return target


def write_npz(dataset: Dataset, out: str | Path, *, force: bool = False) -> Path:
    """Write ``dataset`` as the ``.npz`` a site file names (``images``, ``labels``, ``class_names``),
    atomically: a temporary file in the same directory, renamed once complete.

    Raises:
        InputError: see :func:`npz_target`.
    """
    target = npz_target(out, force=force)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    with partial.open("wb") as handle:
        np.savez(
            handle,
            images=dataset.images,
            labels=dataset.labels,
            class_names=np.asarray(dataset.class_names, dtype=str),
        )
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(target)
    return target
