"""Simulated sites' data selection (``data.shards``, ``data.fraction``) keeps "one example moves one vote".

The model card states the guarantee for datasets that differ by adding or removing one example. Several
simulated sites split one file, and a site may keep only part of its examples; both selections must then
depend on each example alone: adding or removing one example of the file changes one site's set, by exactly
that example (a permutation re-deals every site, a cut at a count evicts or admits another example).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from sites_harness import teacher_settings

from capc_common.data import load_dataset, site_part
from capc_common.federation import FederationConfig
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import site_examples

SITES = 3


@pytest.fixture(scope="module")
def pool() -> tuple[np.ndarray, np.ndarray]:
    data = load_dataset("fashion-mnist", split="train")
    return data.images[:600].copy(), data.labels[:600].copy()


def _settings(tmp: Path, data: dict, federation_dict) -> TeacherSettings:
    FederationConfig.from_dict(federation_dict()).save(tmp / "federation.yaml")
    return teacher_settings(tmp, tmp / "federation.yaml", data)


def _selected(
    tmp: Path, images: np.ndarray, labels: np.ndarray, extra: dict, federation_dict
) -> list[Counter[bytes]]:
    """Each site's selected examples (as a multiset of label and image bytes), read as `capc teacher train`
    reads them from the file: its training part and its holdout together."""
    np.savez(tmp / "pool.npz", images=images, labels=labels)
    sites = []
    for shard in range(SITES):
        data = {"dataset": f"npz:{tmp / 'pool.npz'}", "shard": shard, "shards": SITES, "seed": 3, **extra}
        found = site_examples(_settings(tmp, data, federation_dict))
        x = np.concatenate([found.images, found.holdout_images])
        y = np.concatenate([found.labels, found.holdout_labels])
        sites.append(
            Counter(int(lab).to_bytes(8, "big") + img.tobytes() for img, lab in zip(x, y, strict=True))
        )
    return sites


def _kept(image: np.ndarray, label: int, extra: dict) -> bool:
    """Whether some site keeps this example: the selection is a function of the example alone."""
    one = (image[None], np.array([label]))
    return any(len(site_part(*one, part=s, parts=SITES, seed=3, **extra)) for s in range(SITES))


@pytest.mark.parametrize("extra", [{}, {"fraction": 0.5}], ids=["whole-parts", "half-of-each-part"])
def test_adding_or_removing_one_example_changes_one_site_by_that_example(
    tmp_path, pool, extra, federation_dict
) -> None:
    images, labels = pool
    before = _selected(tmp_path, images, labels, extra, federation_dict)
    assert all(before), "every site selects some examples"
    if not extra:  # whole parts: disjoint and covering
        assert sum(before, Counter()) == Counter(
            int(lab).to_bytes(8, "big") + img.tobytes() for img, lab in zip(images, labels, strict=True)
        )
    else:  # about half of each part
        assert 0.35 * len(labels) < sum(map(sum, map(Counter.values, before))) < 0.65 * len(labels)
    # Edit examples some site keeps (with a fraction, most are dropped: an edit of a dropped one proves
    # nothing), near the front: a cut at a count or a permutation would move other examples.
    removed = next(i for i in range(len(labels)) if _kept(images[i], labels[i], extra))
    added_image = next(
        inverted
        for inverted in ((255 - images[j]).astype(images.dtype) for j in range(len(labels)))
        if _kept(inverted, labels[7], extra)
    )
    edits = {
        "removed": (np.delete(images, removed, axis=0), np.delete(labels, removed)),
        "added": (np.insert(images, 0, added_image, axis=0), np.insert(labels, 0, labels[7])),
    }
    keys = {
        "removed": int(labels[removed]).to_bytes(8, "big") + images[removed].tobytes(),
        "added": int(labels[7]).to_bytes(8, "big") + added_image.tobytes(),
    }
    for edit, (x, y) in edits.items():
        after = _selected(tmp_path, x, y, extra, federation_dict)
        changed = [s for s in range(SITES) if after[s] != before[s]]
        assert len(changed) == 1, (edit, changed)
        for s in changed:
            bigger, smaller = (before[s], after[s]) if edit == "removed" else (after[s], before[s])
            assert bigger - smaller == Counter([keys[edit]]) and not smaller - bigger, edit


def test_a_site_file_with_the_former_limit_is_refused_with_the_replacement(tmp_path, federation_dict) -> None:
    with pytest.raises(ValidationError, match=r"data.limit \(3000\) is no longer supported.*data.fraction"):
        _settings(tmp_path, {"dataset": "fashion-mnist", "limit": 3000}, federation_dict)
