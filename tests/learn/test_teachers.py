"""Teachers: features per shard in exact current-statistics chunks, votes, and saved heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capc_common.aggregation import vote_histogram
from capc_common.data import load_dataset, partition
from capc_common.errors import IntegrityError
from capc_common.learn.featurizers import BackboneFeaturizer, PixelFeaturizer
from capc_common.learn.heads import fixed_votes
from capc_common.learn.teachers import TeacherEnsemble, fit_teachers, shard_features, train_teachers
from capc_common.models import bn_stats, load_backbone, to_tensor


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", split="train")


@pytest.fixture(scope="module")
def featurizer():
    return BackboneFeaturizer(load_backbone("scatter-8x8x1"))


def test_each_shard_is_featurised_alone_in_exact_chunks(digits, featurizer):
    shards = [np.arange(0, 40), np.arange(40, 100)]
    feats, owners, index = shard_features(featurizer, digits.images, shards, bn_batch=16)
    np.testing.assert_array_equal(owners, [0] * 40 + [1] * 60)
    np.testing.assert_array_equal(index, np.arange(100))
    # Shard 0 by hand: chunks [0,16), [16,32) and the overlapping last chunk [24,40) (rows 32..39 kept),
    # each normalised with its own (current) statistics.
    backbone = featurizer.backbone
    with torch.inference_mode(), bn_stats(backbone, "current"):
        manual = [
            backbone.features(to_tensor(digits.images[a:b])).numpy() for a, b in ((0, 16), (16, 32), (24, 40))
        ]
    expected = np.concatenate([manual[0], manual[1], manual[2][8:]])
    np.testing.assert_allclose(feats[:40], expected, rtol=1e-5, atol=1e-5)
    # Another shard's images never enter a teacher's statistics.
    other = digits.images.copy()
    other[40:100] = 255 - other[40:100]
    again, _, _ = shard_features(featurizer, other, shards, bn_batch=16)
    np.testing.assert_array_equal(again[:40], feats[:40])
    assert not np.allclose(again[40:], feats[40:])
    # The statistics mode is honoured: running statistics give different features.
    running, _, _ = shard_features(featurizer, digits.images, shards, bn_batch=16, mode="running")
    assert not np.allclose(running[:40], feats[:40])


def test_query_features_depend_on_the_batch_they_are_computed_in(digits, featurizer):
    """Current statistics: the same image gets other features in another chunk; same chunking → same."""
    a = featurizer.extract(digits.images[:32], bn_batch=16, mode="current")
    b = featurizer.extract(digits.images[:32], bn_batch=16, mode="current")
    c = featurizer.extract(digits.images[:32], bn_batch=32, mode="current")
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def _changed_heads(a: TeacherEnsemble, b: TeacherEnsemble) -> list[int]:
    """Teachers any of whose parameters (weights *and* biases) differ in any bit."""
    params = a.heads.params
    return [
        t
        for t in range(a.teachers)
        if not all(torch.equal(v[t], b.heads.params[k][t]) for k, v in params.items())
    ]


def test_a_short_shard_abstains_and_one_example_moves_one_head(digits, featurizer, tmp_path):
    """Issue 25.2: a shard of bn_batch − 1 abstains (a fixed vote), one of bn_batch trains; one example that
    crosses the boundary changes that one head's output and no other, and the party never refuses."""
    images, labels = digits.images, digits.labels
    queries = featurizer.extract(images[400:464], bn_batch=16, mode="current")

    def fit(*shards: np.ndarray) -> TeacherEnsemble:
        return fit_teachers(featurizer, images, labels, list(shards), classes=10, bn_batch=16)

    rest = np.arange(100, 160)
    base = fit(np.arange(0, 15), np.arange(20, 36), rest)  # 15 = bn_batch − 1, 16 = bn_batch
    assert base.abstaining == (0,)
    predictions = base.predict(queries)
    np.testing.assert_array_equal(predictions[0], fixed_votes(0, len(queries), classes=10))
    assert (base.votes(queries).sum(axis=1) == 3).all()  # every head still casts one vote per query
    base.save(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(
        TeacherEnsemble.load(tmp_path / "t.safetensors").predict(queries), predictions
    )
    features, owners, _ = shard_features(
        featurizer, images, [np.arange(0, 15), np.arange(20, 36), rest], bn_batch=16
    )
    assert set(owners.tolist()) == {1, 2} and len(features) == 16 + 60

    # One example added to the short shard: it reaches bn_batch and trains; only head 0 changes.
    grown = fit(np.arange(0, 16), np.arange(20, 36), rest)
    assert grown.abstaining == () and _changed_heads(base, grown) == [0]
    moved = np.flatnonzero((grown.predict(queries) != predictions).any(axis=1)).tolist()
    assert moved == [0]
    # One example removed from the bn_batch shard: head 1 now abstains; only head 1 changes.
    shrunk = fit(np.arange(0, 15), np.arange(20, 35), rest)
    assert shrunk.abstaining == (0, 1) and _changed_heads(base, shrunk) == [1]
    moved = np.flatnonzero((shrunk.predict(queries) != predictions).any(axis=1)).tolist()
    assert moved == [1]
    # Every shard short: nothing is refused, every head casts its fixed vote.
    idle = fit(np.arange(0, 3), np.arange(3, 3))
    assert idle.abstaining == (0, 1)
    assert (idle.votes(queries).sum(axis=1) == 2).all()


def test_pixel_featurizer_standardises_each_chunk():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 4, 4, 1), dtype=np.uint8)
    feats = PixelFeaturizer((4, 4, 1)).extract(images, bn_batch=16, mode="current")
    np.testing.assert_allclose(feats[:16].mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(feats[:16].std(axis=0), 1, atol=1e-3)
    last = images[24:40].reshape(16, -1) / 255.0
    np.testing.assert_allclose(
        feats[32:], ((last - last.mean(0)) / np.sqrt(last.var(0) + 1e-5))[8:], atol=1e-5
    )


def test_votes_save_and_backbone_pinning(digits, featurizer, tmp_path):
    shards = [np.arange(i * 60, (i + 1) * 60) for i in range(5)]
    feats, owners, index = shard_features(featurizer, digits.images, shards, bn_batch=16)
    ensemble = train_teachers(
        feats,
        digits.labels[index],
        owners,
        teachers=5,
        classes=10,
        backbone_sha256=featurizer.sha256,
        bn_batch=16,
    )
    queries = featurizer.extract(digits.images[300:364], bn_batch=16, mode="current")
    votes = ensemble.votes(queries)
    np.testing.assert_array_equal(votes, vote_histogram(ensemble.predict(queries), classes=10))
    assert (votes.sum(axis=1) == 5).all()
    assert (votes.argmax(axis=1) == digits.labels[300:364]).mean() > 0.6  # 5 teachers × 60 images
    ensemble.save(tmp_path / "t.safetensors")
    back = TeacherEnsemble.load(tmp_path / "t.safetensors", backbone_sha256=featurizer.sha256)
    np.testing.assert_array_equal(back.votes(queries), votes)
    assert back.bn_batch == 16 and back.teachers == 5
    with pytest.raises(IntegrityError, match="trained on backbone"):
        TeacherEnsemble.load(tmp_path / "t.safetensors", backbone_sha256="0" * 64)


def test_central_path_one_removed_example_moves_one_teacher(digits, featurizer):
    """Issue 10.1 on the central path (the federation's is in tests/services/test_teacher_train.py)."""
    images, labels = digits.images[:400], digits.labels[:400]
    queries = featurizer.extract(digits.images[400:464], bn_batch=16, mode="current")

    def teachers(keep: np.ndarray) -> TeacherEnsemble:
        shards = partition(labels[keep], shards=5, scheme="hash", seed=3, images=images[keep])
        return fit_teachers(featurizer, images[keep], labels[keep], shards, classes=10, bn_batch=16)

    everyone = np.ones(len(labels), bool)
    base = teachers(everyone)
    victim = 123
    owner = next(
        t
        for t, s in enumerate(partition(labels, shards=5, scheme="hash", seed=3, images=images))
        if victim in s
    )
    without = everyone.copy()
    without[victim] = False
    other = teachers(without)
    assert _changed_heads(base, other) == [owner]
    moved = np.flatnonzero((base.predict(queries) != other.predict(queries)).any(axis=1)).tolist()
    assert set(moved) <= {owner}
