"""Does a site's labelled data fit its federation? The checks every path a hospital's images take runs alike.

``capc teacher preflight`` reports them, ``capc teacher train`` refuses on a failure before it touches the
backbone, and ``capc data import`` runs them before it writes the site's ``.npz``: one implementation, so the
three say the same thing and give the same fix (a federation pins its query size and its backbone, so data
of another size is converted, never the backbone changed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.federation.config import FederationConfig

# Adjacent pixels of photographs, scans and renderings are strongly correlated; shuffled or noise-like data
# (a wrong reshape, a wrong dtype, encrypted files read as pixels) is not.
MIN_NEIGHBOUR_CORRELATION = 0.3
#: Images whose pixels all have one grey level (a standard deviation below this) count as blank.
_BLANK_STD = 1.0


@dataclass(frozen=True)
class DataFinding:
    """The outcome of one data check.

    Attributes:
        check: ``dataset`` (size, classes, counts) or ``dataset.images`` (do they look like images).
        status: ``ok``, ``warn`` (usable, but look) or ``fail`` (not usable by this federation).
        detail: what was found, with the values.
        fix: how to fix it (every ``warn``/``fail`` has one).
        data: the figures behind ``detail``.
    """

    check: str
    status: Literal["ok", "warn", "fail"]
    detail: str
    fix: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


def shape_text(shape: Sequence[int]) -> str:
    """``28x28x1``: an image shape as height x width x channels."""
    return "x".join(str(int(n)) for n in shape)


def label_problem(labels: npt.NDArray[np.integer[Any]], *, classes: int, name: str) -> str:
    """Why ``labels`` do not fit ``classes`` classes ('' when they do): a label the federation has no class
    for would train a head that never votes for it, or fail deep inside training."""
    top = int(labels.max(initial=0))
    return f"{name} has labels up to {top}; the federation has {classes} classes" if top >= classes else ""


def class_name_problem(names: Sequence[str], *, config: FederationConfig, name: str) -> str:
    """Why data whose classes are ``names`` (in index order) does not fit the federation's ``class_names``
    ('' when it does, when the federation names none, or when the data's names are its indices): two
    hospitals whose files name their classes in other orders would otherwise train each index on another
    class, silently."""
    ours = config.class_names
    if ours is None or tuple(names) == tuple(str(i) for i in range(len(names))):
        return ""
    if len(names) <= len(ours) and tuple(names) == ours[: len(names)]:
        return ""
    differ = [
        f"{i}: {a!r} here, {b!r} there" for i, (a, b) in enumerate(zip(names, ours, strict=False)) if a != b
    ]
    if len(names) > len(ours):
        differ.append(f"{len(names) - len(ours)} class(es) more than the federation's {len(ours)}")
    return (
        f"{name} names its classes {list(names)}, but the federation's class_names are {list(ours)} "
        f"({'; '.join(differ[:5])}); import the site's images again with `capc data import SOURCE "
        "--federation federation.yaml --out site.npz`: it maps each name onto the federation's index"
    )


def dataset_findings(
    images: npt.NDArray[np.uint8],
    labels: npt.NDArray[np.integer[Any]],
    *,
    config: FederationConfig,
    name: str,
    heads: int | None = None,
    missing_classes: Literal["warn", "fail"] = "warn",
) -> DataFinding:
    """Whether the examples have the federation's image shape and classes, enough examples for ``heads``
    teacher heads (None: not checked) and every class; the first failure is the finding.

    Args:
        images: uint8 ``(N, H, W, C)``.
        labels: class indices ``(N,)``.
        config: the federation.
        name: how to name the data in messages (its file, its shard).
        heads: the party's teacher heads (each needs its own shard of examples).
        missing_classes: what a class without examples is: ``warn`` (a hospital may see few of the
            federation's classes) or ``fail`` (an import, where it more often means folders named wrong).
    """
    q = config.queries
    expected = (q.height, q.width, q.channels)
    counts = np.bincount(labels, minlength=config.classes).tolist() if len(labels) else [0] * config.classes
    data = {"source": name, "examples": len(labels), "shape": list(images.shape[1:]), "per_class": counts}
    if tuple(images.shape[1:]) != expected:
        return DataFinding(
            "dataset",
            "fail",
            f"{name}: images are {shape_text(images.shape[1:])}, the federation's queries are "
            f"{shape_text(expected)} (height x width x channels)",
            fix=f"convert the site's images to {shape_text(expected)} before training — the federation "
            "pins its query size and its backbone, so the data changes, not the backbone: `capc data import "
            "SOURCE --federation federation.yaml --resize --out site.npz` (docs/data.md)",
            data=data,
        )
    problem = label_problem(labels, classes=config.classes, name=name)
    if problem:
        return DataFinding(
            "dataset",
            "fail",
            problem,
            fix=f"map the site's labels onto the federation's classes 0..{config.classes - 1} (`capc data "
            "import --classes NAME,NAME,…` names them in the federation's order)",
            data=data,
        )
    if heads is not None and len(labels) < heads:
        return DataFinding(
            "dataset",
            "fail",
            f"{name} has {len(labels)} examples for {heads} teacher heads (each needs its own shard)",
            fix="use more of the site's data (a larger data.fraction), or ask the coordinator for fewer "
            "heads",
            data=data,
        )
    missing = [c for c, n in enumerate(counts) if n == 0]
    detail = f"{name}: {len(labels)} examples {shape_text(images.shape[1:])}, per class {counts}"
    if missing:
        named = f" {[config.class_names[c] for c in missing]}" if config.class_names else ""
        return DataFinding(
            "dataset",
            missing_classes,
            f"{detail}; no example of class(es) {missing}{named}",
            fix="check the label mapping; heads trained without a class never vote for it"
            + (
                " (if the site has no examples of those classes, pass --allow-missing-classes)"
                if missing_classes == "fail"
                else ""
            ),
            data=data,
        )
    return DataFinding("dataset", "ok", detail, data=data)


def _neighbour_correlation(images: npt.NDArray[np.uint8]) -> float:
    """Mean correlation of horizontally adjacent pixels (≈ 0.9 for natural images, ≈ 0 for noise)."""
    x = images.astype(np.float64)
    left, right = x[:, :, :-1, :].ravel(), x[:, :, 1:, :].ravel()
    if left.std() == 0 or right.std() == 0:
        return 0.0
    return float(np.corrcoef(left, right)[0, 1])


def image_findings(images: npt.NDArray[np.uint8], *, see: str = "") -> DataFinding:
    """Whether the arrays look like images: not mostly blank, adjacent pixels correlated.

    Args:
        images: uint8 ``(N, H, W, C)``.
        see: where a person can look at them (preflight's PNG grid), added to the detail.
    """
    flat = images.reshape(len(images), -1).astype(np.float64)
    blank = float((flat.std(axis=1) < _BLANK_STD).mean()) if len(images) else 1.0
    correlation = _neighbour_correlation(images[:2000])
    data = {
        "blank_fraction": round(blank, 4),
        "neighbour_correlation": round(correlation, 3),
        "mean": round(float(flat.mean()), 2) if flat.size else 0.0,
    }
    where = f"; see {see}" if see else ""
    if blank > 0.5:
        return DataFinding(
            "dataset.images",
            "fail",
            f"{100 * blank:.0f} % of the images are blank (one grey level){where}",
            fix="check how the site's images are read (paths, dtype: uint8 0-255 or floats in [0, 1])",
            data=data,
        )
    if correlation < MIN_NEIGHBOUR_CORRELATION:
        return DataFinding(
            "dataset.images",
            "warn",
            f"adjacent pixels correlate only {correlation:.2f} (images ≈ 0.9, noise ≈ 0): the images may be "
            f"scrambled{'; look at ' + see if see else ''}",
            fix="check the array layout (N, H, W, C) and that the files are decoded images",
            data=data,
        )
    grid = f"; grid: {see}" if see else ""
    return DataFinding(
        "dataset.images",
        "ok",
        f"look like images (adjacent-pixel correlation {correlation:.2f}, {100 * blank:.1f} % blank){grid}",
        data=data,
    )


def refuse(finding: DataFinding) -> None:
    """Raise a failed finding as the :class:`InputError` a command exits with (its fix included).

    Raises:
        InputError: ``finding`` failed.
    """
    if finding.status == "fail":
        raise InputError(f"{finding.detail}; {finding.fix}")
