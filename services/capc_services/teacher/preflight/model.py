"""Preflight of what a teacher computes with: the shared backbone, the site's data, and its heads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from capc_common.errors import CapcError, InputError
from capc_common.federation import FederationConfig, batch_plan, load_shared_backbone
from capc_services.teacher.preflight.report import Check
from capc_services.teacher.settings import TeacherSettings

if TYPE_CHECKING:
    from capc_common.models import Backbone

GRID_PER_CLASS = 8
# Adjacent pixels of photographs, scans and renderings are strongly correlated; shuffled or noise-like data
# (a wrong reshape, a wrong dtype, encrypted files read as pixels) is not.
MIN_NEIGHBOUR_CORRELATION = 0.3


def backbone_check(config: FederationConfig) -> tuple[Check, Backbone | None]:
    """The backbone this installation builds is the one federation.yaml pins (by SHA-256)."""
    b = config.backbone
    try:
        backbone = load_shared_backbone(config)
    except CapcError as exc:
        return (
            Check.fail(
                "backbone",
                str(exc),
                fix=f"install the capc release the coordinator runs (it builds {b.name!r} with SHA-256 "
                f"{b.sha256[:16]}…), or get the pinned weights file from the coordinator",
            ),
            None,
        )
    return Check.ok("backbone", f"{b.name} sha256 {b.sha256[:16]}… matches federation.yaml"), backbone


def _neighbour_correlation(images: npt.NDArray[np.uint8]) -> float:
    """Mean correlation of horizontally adjacent pixels (≈ 0.9 for natural images, ≈ 0 for noise)."""
    x = images.astype(np.float64)
    left, right = x[:, :, :-1, :].ravel(), x[:, :, 1:, :].ravel()
    if left.std() == 0 or right.std() == 0:
        return 0.0
    return float(np.corrcoef(left, right)[0, 1])


def write_grid(
    images: npt.NDArray[np.uint8], labels: npt.NDArray[np.int64], path: Path, *, classes: int
) -> Path:
    """A PNG with up to :data:`GRID_PER_CLASS` images of each class, one row per class (blank if none)."""
    from PIL import Image

    height, width, channels = images.shape[1:]
    pad = 2
    grid = np.full(
        (classes * (height + pad) + pad, GRID_PER_CLASS * (width + pad) + pad, channels), 255, dtype=np.uint8
    )
    for label in range(classes):
        for column, index in enumerate(np.flatnonzero(labels == label)[:GRID_PER_CLASS]):
            top, left = pad + label * (height + pad), pad + column * (width + pad)
            grid[top : top + height, left : left + width] = images[index]
    picture = Image.fromarray(grid[:, :, 0] if channels == 1 else grid)
    scale = max(1, 112 // max(height, width))
    picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path


def dataset_checks(settings: TeacherSettings, config: FederationConfig, *, out_dir: Path) -> list[Check]:
    """The site's data loads, has the federation's image shape and classes, enough examples for its heads,
    every class, and looks like images (a PNG grid of examples per class is written to ``out_dir``)."""
    from capc_services.teacher.train import party_examples

    try:
        images, labels, name = party_examples(settings)
    except InputError as exc:
        return [
            Check.fail(
                "dataset",
                str(exc),
                fix="point data.dataset in the site file at the site's labelled images (npz:/path, "
                "folder:/path or idx:/dir; see docs/data.md)",
            )
        ]
    q, heads = config.queries, config.teacher(settings.party).heads
    expected = (q.height, q.width, q.channels)
    counts = np.bincount(labels, minlength=config.classes).tolist()
    data = {"source": name, "examples": len(labels), "shape": list(images.shape[1:]), "per_class": counts}
    if tuple(images.shape[1:]) != expected:
        return [
            Check.fail(
                "dataset",
                f"{name}: images are {'x'.join(map(str, images.shape[1:]))}, the federation's queries are "
                f"{'x'.join(map(str, expected))} (height x width x channels)",
                fix="convert the site's images to the federation's size and channels before training",
                **data,
            )
        ]
    if len(counts) > config.classes:
        return [
            Check.fail(
                "dataset",
                f"{name} has labels up to {len(counts) - 1}; the federation has {config.classes} classes",
                fix=f"map the site's labels onto the federation's classes 0..{config.classes - 1}",
                **data,
            )
        ]
    if len(labels) < heads:
        return [
            Check.fail(
                "dataset",
                f"{name} has {len(labels)} examples for {heads} teacher heads (each needs its own shard)",
                fix="use more of the site's data (a larger data.fraction), or ask the coordinator for fewer "
                "heads",
                **data,
            )
        ]
    missing = [c for c, n in enumerate(counts) if n == 0]
    shape = "x".join(map(str, images.shape[1:]))
    detail = f"{name}: {len(labels)} examples {shape}, per class {counts}"
    checks = [
        Check.warn(
            "dataset",
            f"{detail}; no example of class(es) {missing}",
            fix="check the label mapping; heads trained without a class never vote for it",
            **data,
        )
        if missing
        else Check.ok("dataset", detail, **data)
    ]
    checks.append(
        _images_check(images, labels, out_dir / f"{settings.party}-dataset.png", classes=config.classes)
    )
    return checks


def _images_check(
    images: npt.NDArray[np.uint8], labels: npt.NDArray[np.int64], grid: Path, *, classes: int
) -> Check:
    flat = images.reshape(len(images), -1).astype(np.float64)
    blank = float((flat.std(axis=1) < 1.0).mean())
    correlation = _neighbour_correlation(images[:2000])
    path = write_grid(images, labels, grid, classes=classes)
    data = {
        "grid": str(path),
        "blank_fraction": round(blank, 4),
        "neighbour_correlation": round(correlation, 3),
        "mean": round(float(flat.mean()), 2),
    }
    if blank > 0.5:
        return Check.fail(
            "dataset.images",
            f"{100 * blank:.0f} % of the images are blank (one grey level); see {path}",
            fix="check how the site's images are read (paths, dtype: uint8 0-255 or floats in [0, 1])",
            **data,
        )
    if correlation < MIN_NEIGHBOUR_CORRELATION:
        return Check.warn(
            "dataset.images",
            f"adjacent pixels correlate only {correlation:.2f} (images ≈ 0.9, noise ≈ 0): the images may be "
            f"scrambled; look at {path}",
            fix="check the array layout (N, H, W, C) and that the files are decoded images",
            **data,
        )
    return Check.ok(
        "dataset.images",
        f"look like images (adjacent-pixel correlation {correlation:.2f}, {100 * blank:.1f} % blank); "
        f"grid: {path}",
        **data,
    )


def heads_check(settings: TeacherSettings, config: FederationConfig, backbone: Backbone) -> Check:
    """The heads file matches federation.yaml and the backbone: it answers one chunk of real queries."""
    from capc_common.models import extract_features
    from capc_services.teacher.app import load_heads

    train = f"`capc teacher train --site {settings.party}.yaml`"
    fix = f"train them on the site's data: {train}"
    if not settings.heads.exists():
        return Check.fail("heads", f"no heads file at {settings.heads}", fix=fix)
    try:
        heads = load_heads(settings)
        plan = batch_plan(config, first_index=0, count=config.queries.bn_batch)
        features = extract_features(backbone, plan.spec.images(), bn_batch=plan.spec.bn_batch, mode="current")
        if features.shape[1] != heads.dim:
            return Check.fail(
                "heads",
                f"{settings.heads} holds heads over {heads.dim}-d features, but the backbone "
                f"{config.backbone.name!r} gives {features.shape[1]}-d features: they were trained on "
                "another backbone",
                fix=f"retrain them on this federation's backbone: {train}",
                heads_dim=heads.dim,
                backbone_dim=int(features.shape[1]),
            )
        votes = heads.predict(features)
    except CapcError as exc:
        return Check.fail("heads", str(exc), fix=fix)
    per_class = np.bincount(votes.ravel(), minlength=config.classes).tolist()
    return Check.ok(
        "heads",
        f"{heads.heads} heads over {heads.dim}-d features answered the first {plan.count} synthetic queries "
        f"(votes per class {per_class})",
        heads=heads.heads,
        dim=heads.dim,
        votes_per_class=per_class,
    )
