"""extract_features: the chunking rule every party must share, and input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capc_common.errors import InputError
from capc_common.models import FixedFront, bn_stats, build_backbone, chunk_starts, extract_features, to_tensor


@pytest.fixture(scope="module")
def backbone():
    return build_backbone("cnn", input_shape="12x12x1", config={"width": 8}, seed=2).eval()


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).integers(0, 256, (10, 12, 12, 1), dtype=np.uint8)


def _manual(backbone, images, start, stop):
    with torch.no_grad(), bn_stats(backbone, "current"):
        return backbone.features(to_tensor(images[start:stop])).numpy()


def test_chunk_starts():
    assert chunk_starts(10, bn_batch=4) == [0, 4, 6]
    assert chunk_starts(8, bn_batch=4) == [0, 4]
    assert chunk_starts(5, bn_batch=5) == [0]


def test_last_chunk_is_final_bn_batch_images(backbone, images):
    feats = extract_features(backbone, images, bn_batch=4, mode="current")
    assert feats.shape == (10, backbone.feature_dim) and feats.dtype == np.float32
    np.testing.assert_allclose(feats[0:4], _manual(backbone, images, 0, 4), atol=1e-5)
    np.testing.assert_allclose(feats[4:8], _manual(backbone, images, 4, 8), atol=1e-5)
    np.testing.assert_allclose(feats[8:10], _manual(backbone, images, 6, 10)[2:], atol=1e-5)
    # rows 6-7 come from their own chunk (4:8), not from the overlapping last one
    assert not np.allclose(feats[6:8], _manual(backbone, images, 6, 10)[:2], atol=1e-3)


def test_running_mode_ignores_chunking(backbone, images):
    a = extract_features(backbone, images, bn_batch=4, mode="running")
    b = extract_features(backbone, images, bn_batch=7, mode="running")
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bn_batch": 11}, "fewer than one BatchNorm batch of 11"),
        ({"bn_batch": 1}, "at least 2"),
        ({"bn_batch": 4, "mode": "batch"}, "unknown BatchNorm"),
    ],
)
def test_bad_arguments(backbone, images, kwargs, message):
    with pytest.raises(InputError, match=message):
        extract_features(backbone, images, **kwargs)


def test_bad_images(backbone):
    with pytest.raises(InputError, match=r"images are 28x28x1 .* takes 12x12x1"):
        extract_features(backbone, np.zeros((4, 28, 28, 1), np.uint8), bn_batch=2)
    with pytest.raises(InputError, match="uint8"):
        extract_features(backbone, np.zeros((4, 12, 12, 1), np.float32), bn_batch=2)
    with pytest.raises(InputError, match=r"expects images \(N, 1, 12, 12\)"):
        backbone.features(torch.zeros(2, 3, 12, 12))


@pytest.fixture(scope="module")
def hybrid():
    """A scattering + CNN backbone: a fixed front end (the scattering), then statistics."""
    return build_backbone("scatter_cnn", input_shape="16x16x1", config={"cnn_width": 8}, seed=1).eval()


@pytest.fixture(scope="module")
def pictures():
    return np.random.default_rng(5).integers(0, 256, (150, 16, 16, 1), dtype=np.uint8)


@pytest.mark.parametrize(
    ("mode", "bn_batch"), [("current", 64), ("current", 50), ("current", 2), ("running", 64)]
)
def test_a_fixed_front_gives_the_same_features(hybrid, pictures, mode, bn_batch):
    """Features from the table are the same bits as computed, for any chunking, subset and order."""
    front = FixedFront.of(hybrid, pictures)
    assert front is not None
    order = np.random.default_rng(6).permutation(len(pictures))[:90]
    for subset in (pictures, pictures[order]):
        expected = extract_features(hybrid, subset, bn_batch=bn_batch, mode=mode)
        np.testing.assert_array_equal(
            extract_features(hybrid, subset, bn_batch=bn_batch, mode=mode, front=front), expected
        )


def test_a_fixed_front_gives_the_same_features_for_fashion_mnists_size():
    """At 28x28 (Fashion-MNIST, the demo's data) a map's place in its pass once changed its order-0
    coefficients' last bit on some CPUs (MKL on AMD EPYC); 16x16 did not show it."""
    hybrid28 = build_backbone("scatter_cnn", input_shape="28x28x1", config={"cnn_width": 8}, seed=1).eval()
    images = np.random.default_rng(7).integers(0, 256, (70, 28, 28, 1), dtype=np.uint8)
    front = FixedFront.of(hybrid28, images)
    assert front is not None
    for subset, bn_batch in ((images, 2), (images[::-1], 50), (images[5:40], 7)):
        np.testing.assert_array_equal(
            extract_features(hybrid28, subset, bn_batch=bn_batch, front=front),
            extract_features(hybrid28, subset, bn_batch=bn_batch),
        )


def test_a_fixed_front_is_used_and_only_for_its_own_images(hybrid, pictures):
    front = FixedFront.of(hybrid, pictures[:100])
    assert front is not None
    assert front.index(pictures[[3, 1, 3]]) is not None
    assert front.index(pictures[98:102]) is None  # two of them are not in the table: computed
    np.testing.assert_array_equal(
        extract_features(hybrid, pictures[90:120], bn_batch=10, front=front),
        extract_features(hybrid, pictures[90:120], bn_batch=10),
    )
    # The table is what the features are made of: another table, other features (it is not ignored).
    zeros = FixedFront(hybrid, pictures[:20], torch.zeros((20, 81, 4, 4)))
    assert not np.array_equal(
        extract_features(hybrid, pictures[:20], bn_batch=10, front=zeros),
        extract_features(hybrid, pictures[:20], bn_batch=10),
    )


def test_no_fixed_front_without_one_or_beyond_the_memory_bound(backbone, images, hybrid, pictures):
    assert not backbone.has_fixed and FixedFront.of(backbone, images) is None  # a CNN: nothing fixed
    per_image = 81 * 4 * 4 * 4  # float32 scattering of a 16x16 image (J=2, L=8)
    assert FixedFront.of(hybrid, pictures, max_bytes=per_image * len(pictures)) is not None
    assert FixedFront.of(hybrid, pictures, max_bytes=per_image * len(pictures) - 1) is None
