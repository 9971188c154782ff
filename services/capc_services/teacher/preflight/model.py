"""Preflight of what a teacher computes with: the shared backbone, the site's data, and its heads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from capc_common.errors import CapcError, InputError, IntegrityError
from capc_common.federation import FederationConfig, batch_plan, load_shared_backbone
from capc_common.federation.site_data import DataFinding, dataset_findings, image_findings
from capc_services.teacher.preflight.report import Check
from capc_services.teacher.settings import TeacherSettings

if TYPE_CHECKING:
    from capc_common.models import Backbone

GRID_PER_CLASS = 8


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


def _check(finding: DataFinding) -> Check:
    """A data finding as the preflight check of the same name."""
    return Check(finding.check, finding.status, finding.detail, finding.fix, dict(finding.data))


def dataset_checks(settings: TeacherSettings, config: FederationConfig, *, out_dir: Path) -> list[Check]:
    """The site's data loads, has the federation's image shape and classes, enough examples for its heads,
    every class, and looks like images (a PNG grid of examples per class is written to ``out_dir``): the
    checks ``capc teacher train`` and ``capc data import`` run too (:mod:`capc_common.federation.site_data`).
    """
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
    except IntegrityError as exc:
        return [
            Check.fail(
                "dataset",
                str(exc),
                fix="copy the data file again (docs/operations.md: Load a hospital's data), or write the new "
                "file's `sha256sum` into data.sha256 if the site's data really changed",
            )
        ]
    found = dataset_findings(
        images, labels, config=config, name=name, heads=config.teacher(settings.party).heads
    )
    if found.status == "fail":
        return [_check(found)]
    grid = write_grid(images, labels, out_dir / f"{settings.party}-dataset.png", classes=config.classes)
    looks = image_findings(images, see=str(grid))
    return [_check(found), _check(replace(looks, data={**looks.data, "grid": str(grid)}))]


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
    # Shown to the site's operator only; no verdict reads it: which heads abstain depends on which examples
    # hash where, and letting it decide whether the party goes live would let one example decide that.
    abstain = f"; {len(heads.abstaining)} abstain (a shard shorter than bn_batch)" if heads.abstaining else ""
    return Check.ok(
        "heads",
        f"{heads.heads} heads over {heads.dim}-d features answered the first {plan.count} synthetic queries "
        f"(votes per class {per_class}){abstain}",
        heads=heads.heads,
        dim=heads.dim,
        votes_per_class=per_class,
        abstaining=len(heads.abstaining),
    )
