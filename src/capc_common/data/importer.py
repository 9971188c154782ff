"""``capc data import``: a hospital's images — an image folder, or a CSV of (path, label) — into the ``.npz``
a site file names (``data: {dataset: /data/site.npz}``).

Labels become the federation's class indices: by name, when the federation's class names are given in its
order (``classes``: ``class_names`` of ``federation.yaml``, or the coordinator's list), or as integer
indices already. The images are decoded as :mod:`capc_common.data.pixels` says (every depth brought to 8
bits without clipping), optionally converted to the federation's query size with their aspect ratio kept.
Every problem — unreadable images, images of mixed sizes, labels that are no class, rows without a file —
is one :class:`InputError` listing each file or row, and nothing is written until everything has been read
(the file appears whole, or not at all).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from capc_common.data.dataset import Dataset
from capc_common.data.files import image_folder_files
from capc_common.data.pixels import Fit, PixelReport, read_images
from capc_common.errors import InputError

__all__ = ["Imported", "import_images", "npz_target", "read_table", "write_npz"]

#: Most unknown labels a message lists.
_SHOWN = 5


def read_table(path: str | Path) -> list[tuple[Path, str]]:
    """The rows of a CSV file with a header naming ``path`` and ``label`` columns (others are ignored);
    relative paths are relative to the CSV file's directory.

    Raises:
        InputError: a missing or unreadable file, missing columns, an empty table, or rows with an empty
            field or a path that is not a file (every such row, by its line number).
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
    rows, bad = [], []
    for number, location, label in raw:
        if not location.strip() or not label.strip():
            bad.append(f"line {number}: empty path or label ({location!r}, {label!r})")
            continue
        image = Path(location.strip())
        image = image if image.is_absolute() else table.parent / image
        if not image.is_file():
            bad.append(f"line {number}: image {image} does not exist")
        rows.append((image, label.strip()))
    if bad:
        raise InputError(
            f"CSV file {table}: {len(bad)} of {len(raw)} row(s) name no image (relative paths are read from "
            f"{table.parent}):\n" + "\n".join(f"  {line}" for line in bad)
        )
    return rows


def _indices(
    names: Sequence[str], classes: Sequence[str] | None, *, where: Sequence[str], named_by: str
) -> tuple[npt.NDArray[np.int64], tuple[str, ...]]:
    """Class indices of each label and the class names; ``where[i]`` says where label ``i`` came from and
    ``named_by`` where ``classes`` came from.

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
            f"{len(unknown)} label(s) are not among the {len(classes)} classes {list(classes)} "
            f"({named_by}): {shown}; rename the folders (or the CSV's labels) to those names or their "
            "indices 0, 1, …: a label that maps onto no class would silently train the wrong class"
        )
    names = tuple(classes) if classes is not None else tuple(map(str, range(max(labels, default=-1) + 1)))
    return np.asarray(labels, dtype=np.int64), names


@dataclass(frozen=True)
class Imported:
    """A hospital's images as read by :func:`import_images`.

    Attributes:
        dataset: the labelled 8-bit images.
        pixels: what was done to the pixels (depth scaling, resizing, aspect ratio, channels).
        labelled_by: how labels became class indices (for the import's output).
    """

    dataset: Dataset
    pixels: PixelReport
    labelled_by: str


def _folder_classes(folders: Sequence[str], *, sorted_names: bool) -> tuple[list[str] | None, str]:
    """An image folder's classes when none are named: integer folder names are indices; otherwise, if
    ``sorted_names``, the folder names in sorted order (as ``folder:`` loads them), else a refusal."""
    found = sorted(set(folders))
    if all(name.isdigit() for name in found):
        return None, "folder names as class indices"
    if sorted_names:
        return found, "folder names in sorted order (not checked against a federation)"
    raise InputError(
        f"the folders name classes {found}, but neither --classes nor the federation's class_names say "
        "which index each has, so another hospital's differently named folders could get other indices "
        "silently: pass --classes NAME,NAME,… in the federation's order (the coordinator's list), or ask "
        "the coordinator to add class_names to federation.yaml (docs/federation.md)"
    )


def import_images(
    source: str | Path,
    *,
    classes: Sequence[str] | None = None,
    named_by: str = "--classes",
    size: tuple[int, int, int] | None = None,
    fit: Fit = "pad",
    bit_depth: int | None = None,
    sorted_names: bool = True,
) -> Imported:
    """Read a hospital's labelled images.

    Args:
        source: an image folder (``<class>/<image>.png|.jpg|.tif|.dcm``, or ``train/<class>/…``; a class
            is its folder's name) or a ``.csv`` file of ``path,label`` rows.
        classes: the federation's class names in its order (a label's index is its position); None: labels
            are class indices (an image folder's integer folder names), or see ``sorted_names``.
        named_by: where ``classes`` came from, for messages (``--classes``, ``federation.yaml``).
        size: ``(height, width, channels)`` to convert every image to; None: keep them as they are (all
            the same size).
        fit: how ``size`` treats another aspect ratio (``pad``, ``crop``, ``stretch``).
        bit_depth: the bits deeper grey images are scaled by (None: the bits their largest value needs).
        sorted_names: without ``classes``, take an image folder's folder names in sorted order as its
            classes (a standalone conversion); False: refuse folder names that are not indices (checking
            against a federation that names no classes).

    Raises:
        InputError: a missing source, unreadable images, mixed sizes without ``size``, labels that are no
            class, a duplicate class name (each problem lists every file or label concerned).
    """
    path = Path(source)
    if classes is not None and len(set(classes)) != len(classes):
        raise InputError(f"{named_by} names a class twice: {list(classes)}")
    if not path.exists():
        raise InputError(
            f"{path} does not exist (expected an image folder with one sub-folder per class, or a .csv file "
            "of path,label rows)"
        )
    if path.is_dir():
        files, root = image_folder_files(path)
        labelled_by = f"class names ({named_by})"
        if classes is None:
            classes, labelled_by = _folder_classes([n for _, n in files], sorted_names=sorted_names)
        where = [f"folder {root / name}" for _, name in files]
    elif path.suffix.lower() == ".csv":
        files = read_table(path)
        where = [f"{image.name}" for image, _ in files]
        labelled_by = f"class names ({named_by})" if classes is not None else "class indices"
    else:
        raise InputError(
            f"{path} is neither an image folder (one sub-folder per class) nor a .csv file of path,label rows"
        )
    labels, names = _indices([label for _, label in files], classes, where=where, named_by=named_by)
    images, report = read_images([image for image, _ in files], size=size, fit=fit, bit_depth=bit_depth)
    dataset = Dataset(images=images, labels=labels, num_classes=len(names), class_names=names, name=str(path))
    return Imported(dataset=dataset, pixels=report, labelled_by=labelled_by)


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
