"""``capc teacher train``'s path: one hospital example can change one teacher only (issue 10.1, 10.9), and a
held-out one none at all.

This runs the federation's own training entry point (:func:`train_party_heads`) on an ``npz:`` site file
with the real shipped backbone, edits one private example, retrains, and compares every teacher's shard
features, parameters and votes on synthetic queries — for a replaced, a removed and an added example. The
site holds out the default share of its examples (``holdout.fraction``): the examples edited here lie in the
training part, except in the test of the holdout, where an edited, removed or added held-out example must
change no vote and no release contribution.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sites_harness import teacher_settings
from threadpoolctl import threadpool_info, threadpool_limits

from capc_common.data import HOLDOUT_FRACTION, holdout_part, load_dataset, partition
from capc_common.federation import FederationConfig
from capc_common.federation.releases import protocol_for
from capc_common.learn import BackboneFeaturizer, TeacherEnsemble, shard_features
from capc_common.learn.heads import fixed_votes
from capc_common.models import load_backbone
from capc_common.synth import generate
from capc_services.teacher.train import party_examples, record_features, train_party_heads

HEADS = 4
BN = 16
BACKBONE = "hybrid-28x28x1"


@pytest.fixture(scope="module")
def backbone():
    return load_backbone(BACKBONE)


def held_out(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Whether each example lies in the site's holdout (the site file's default fraction, data.seed 0)."""
    held = np.zeros(len(labels), bool)
    held[holdout_part(images, labels, fraction=HOLDOUT_FRACTION, seed=0)[1]] = True
    return held


def training_part(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The examples the site trains on (a subset of them stays in the training part: each example's side
    depends on that example alone)."""
    keep = ~held_out(images, labels)
    return images[keep].copy(), labels[keep].copy()


@pytest.fixture(scope="module")
def site_data():
    data = load_dataset("fashion-mnist", split="train")
    images, labels = training_part(data.images[:270], data.labels[:270])
    assert len(labels) >= 240
    return images[:240], labels[:240]


def _train(
    tmp: Path, backbone, images: np.ndarray, labels: np.ndarray, federation_dict
) -> tuple[TeacherEnsemble, dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    np.savez(tmp / "site.npz", images=images, labels=labels)
    fed = federation_dict(
        teachers=[{"name": "hospital-a", "heads": HEADS}, {"name": "hospital-b", "heads": 3}],
        backbone={"name": BACKBONE, "sha256": backbone.sha256},
    )
    fed["queries"] = {**fed["queries"], "bn_batch": BN}  # type: ignore[dict-item]
    FederationConfig.from_dict(fed).save(tmp / "federation.yaml")
    settings = teacher_settings(
        tmp, tmp / "federation.yaml", {"dataset": f"npz:{tmp / 'site.npz'}"}, torch_threads=1
    )
    summary = train_party_heads(settings)
    return TeacherEnsemble.load(settings.heads, backbone_sha256=backbone.sha256), summary


def _differs(a: TeacherEnsemble, b: TeacherEnsemble, queries: np.ndarray) -> tuple[list[int], list[int]]:
    """(teachers whose parameters differ in any bit, teachers whose vote on some query differs)."""
    params = [
        t
        for t in range(a.teachers)
        if not all(torch.equal(a.heads.params[k][t], b.heads.params[k][t]) for k in a.heads.params)
    ]
    votes = np.flatnonzero((a.predict(queries) != b.predict(queries)).any(axis=1)).tolist()
    return params, votes


def test_one_edited_example_moves_one_teacher_on_the_federation_path(
    tmp_path, backbone, site_data, federation_dict
):
    images, labels = site_data
    featurizer = BackboneFeaturizer(backbone)
    queries = featurizer.extract(
        generate("dead_leaves", seed=7, start=0, count=256, height=28, width=28, channels=1),
        bn_batch=BN,
        mode="current",
    )
    base, summary = _train(tmp_path / "base", backbone, images, labels, federation_dict)
    assert base.teachers == HEADS and summary["train_accuracy"] > 0.5
    shards = partition(labels, shards=HEADS, scheme="hash", seed=7, images=images)
    base_feats, owners, _ = shard_features(featurizer, images, shards, bn_batch=BN)

    # Replace one example (its pixels and its label).
    victim = 37
    owner = next(t for t, s in enumerate(shards) if victim in s)
    edited, edited_labels = images.copy(), labels.copy()
    edited[victim] = 255 - edited[victim]
    edited_labels[victim] = (edited_labels[victim] + 3) % 10
    new_shards = partition(edited_labels, shards=HEADS, scheme="hash", seed=7, images=edited)
    moved = next(t for t, s in enumerate(new_shards) if victim in s)  # its content hash may name another
    # Features: only the teachers holding the old or the new example see other numbers.
    new_feats, new_owners, _ = shard_features(featurizer, edited, new_shards, bn_batch=BN)
    for t in set(range(HEADS)) - {owner, moved}:
        np.testing.assert_array_equal(new_shards[t], shards[t])
        np.testing.assert_array_equal(new_feats[new_owners == t], base_feats[owners == t])
    replaced, _ = _train(tmp_path / "replaced", backbone, edited, edited_labels, federation_dict)
    changed_params, changed_votes = _differs(base, replaced, queries)
    # Replacing = removing one example and adding another: at most the two teachers they belong to.
    assert owner in changed_params and set(changed_params) <= {owner, moved}
    assert set(changed_votes) <= set(changed_params)

    # Remove one example: exactly its teacher changes.
    keep = np.ones(len(labels), bool)
    keep[victim] = False
    removed, _ = _train(tmp_path / "removed", backbone, images[keep], labels[keep], federation_dict)
    changed_params, changed_votes = _differs(base, removed, queries)
    assert changed_params == [owner]
    assert set(changed_votes) <= {owner}

    # Add one example (a test image the site trains on) in the middle of the file, so that every later
    # example's position shifts: exactly the teacher its hash names changes.
    extra = load_dataset("fashion-mnist", split="test")
    new = int(np.flatnonzero(~held_out(extra.images[:50], extra.labels[:50]))[0])
    at = 100
    added_images = np.insert(images, at, extra.images[new], axis=0)
    added_labels = np.insert(labels, at, extra.labels[new])
    added, _ = _train(tmp_path / "added", backbone, added_images, added_labels, federation_dict)
    target = next(
        t
        for t, s in enumerate(
            partition(added_labels, shards=HEADS, scheme="hash", seed=7, images=added_images)
        )
        if at in s
    )
    changed_params, changed_votes = _differs(base, added, queries)
    assert changed_params == [target]
    assert set(changed_votes) <= {target}


def test_a_short_hash_shard_abstains_and_one_example_moves_only_its_head(
    tmp_path, backbone, site_data, federation_dict
):
    """Issue 25.2: ``capc teacher train`` does not refuse a party whose hash shard holds bn_batch − 1 images:
    that head abstains (a fixed vote). The example that brings it to bn_batch changes that head alone, and
    removing one from a shard of exactly bn_batch makes that head (alone) abstain."""
    pool = load_dataset("fashion-mnist", split="train")
    images, labels = training_part(pool.images[:660], pool.labels[:660])
    owner = partition(labels, shards=HEADS, scheme="hash", seed=7, images=images)
    sizes = [BN - 1, BN, 24, 24]  # the last two shards vote as usual
    take = np.sort(np.concatenate([owner[t][:n] for t, n in enumerate(sizes)]))
    spare = owner[0][BN - 1]  # one more image whose content hash names head 0

    base, summary = _train(tmp_path / "base", backbone, images[take], labels[take], federation_dict)
    assert (
        base.abstaining == (0,) and summary["abstaining"] == 1 and "1 head(s) abstain" in summary["summary"]
    )
    queries = BackboneFeaturizer(backbone).extract(
        generate("dead_leaves", seed=7, start=0, count=64, height=28, width=28, channels=1),
        bn_batch=BN,
        mode="current",
    )
    np.testing.assert_array_equal(base.predict(queries)[0], fixed_votes(0, 64, classes=10))

    grown_at = np.sort(np.append(take, spare))
    grown, _ = _train(tmp_path / "grown", backbone, images[grown_at], labels[grown_at], federation_dict)
    assert grown.abstaining == ()
    changed_params, changed_votes = _differs(base, grown, queries)
    assert changed_params == [0] and changed_votes == [0]

    drop = owner[1][0]
    shrunk_at = take[take != drop]
    shrunk, _ = _train(tmp_path / "shrunk", backbone, images[shrunk_at], labels[shrunk_at], federation_dict)
    assert shrunk.abstaining == (0, 1)
    changed_params, changed_votes = _differs(base, shrunk, queries)
    assert changed_params == [1] and changed_votes == [1]


def _still_held_out(image: np.ndarray, label: int) -> tuple[np.ndarray, int]:
    """An edit of a held-out example (other pixels, another label) that the site still holds out."""
    for shift in range(1, 256):
        for new_label in range(10):
            if new_label == label:
                continue
            edited = ((image.astype(np.int64) + shift) % 256).astype(np.uint8)
            if held_out(edited[None], np.asarray([new_label]))[0]:
                return edited, new_label
    raise AssertionError("no edit of the example stays held out")


def test_an_edited_held_out_example_changes_no_vote_and_no_contribution(tmp_path, backbone, federation_dict):
    """What the site holds out never reaches the federation: replacing, removing or adding a held-out example
    leaves the training part the parties read (heads, a release party's records, the records cache) bit for
    bit, every head's parameters and votes, and a release mechanism's contribution unchanged."""
    pool = load_dataset("fashion-mnist", split="train")
    images, labels = pool.images[:200].copy(), pool.labels[:200].copy()
    held = np.flatnonzero(held_out(images, labels))
    assert 5 <= len(held) <= 40  # about a tenth
    victim, gone = int(held[0]), int(held[1])
    replaced_images, replaced_labels = images.copy(), labels.copy()
    replaced_images[victim], replaced_labels[victim] = _still_held_out(images[victim], int(labels[victim]))
    extra = load_dataset("fashion-mnist", split="test")
    new = int(np.flatnonzero(held_out(extra.images[:100], extra.labels[:100]))[0])
    variants = {
        "replaced": (replaced_images, replaced_labels),
        "removed": (np.delete(images, gone, axis=0), np.delete(labels, gone)),
        "added": (np.insert(images, 50, extra.images[new], axis=0), np.insert(labels, 50, extra.labels[new])),
    }
    queries = BackboneFeaturizer(backbone).extract(
        generate("dead_leaves", seed=7, start=0, count=64, height=28, width=28, channels=1),
        bn_batch=BN,
        mode="current",
    )
    release = FederationConfig.from_dict(
        federation_dict(
            mechanism={"name": "dppl", "rho": 0.1}, backbone={"name": BACKBONE, "sha256": backbone.sha256}
        )
    )
    protocol = protocol_for(release, dim=backbone.feature_dim)

    def read(site: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The training part a party of the site reads, and its DP-prototypes contribution from it."""
        settings = teacher_settings(site, site / "federation.yaml", {"dataset": f"npz:{site / 'site.npz'}"})
        train_images, train_labels, _ = party_examples(settings)
        features = record_features(settings, backbone, train_images)
        return train_images, train_labels, protocol.contribution(features, train_labels.astype(np.int64))

    base, _ = _train(tmp_path / "base", backbone, images, labels, federation_dict)
    before = read(tmp_path / "base")
    assert len(before[1]) == len(labels) - len(held)
    for name, (edited_images, edited_labels) in variants.items():
        trained, _ = _train(tmp_path / name, backbone, edited_images, edited_labels, federation_dict)
        assert _differs(base, trained, queries) == ([], []), name
        for found, expected in zip(read(tmp_path / name), before, strict=True):
            np.testing.assert_array_equal(found, expected)


def _limits() -> dict[str, int]:
    """Each loaded thread pool's thread count, by library file."""
    return {p["filepath"]: p["num_threads"] for p in threadpool_info()}


def test_training_gives_the_caller_its_thread_limits_back(tmp_path, backbone, site_data, federation_dict):
    """The site's ``torch_threads`` (1 here) caps torch and the BLAS for the training call alone: the process
    that called it (a test worker, a benchmark, the demo) gets its own limits back, not one thread for ever.
    The caller's limits are 3, whatever the environment set (OMP_NUM_THREADS=1 would hide a leak)."""
    images, labels = site_data
    torch_threads = torch.get_num_threads()
    with threadpool_limits(limits=3, user_api="blas"):
        torch.set_num_threads(3)
        try:
            before = _limits()
            assert 3 in before.values() and torch.get_num_threads() == 3
            _train(tmp_path, backbone, images[:64], labels[:64], federation_dict)
            after = _limits()
            assert torch.get_num_threads() == 3
        finally:
            torch.set_num_threads(torch_threads)
    assert {path: after[path] for path in before} == before
