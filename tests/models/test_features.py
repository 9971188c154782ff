"""extract_features: the chunking rule every party must share, and input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capc_common.errors import InputError
from capc_common.models import bn_stats, build_backbone, chunk_starts, extract_features, to_tensor


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
