"""``generate``: shapes, dtypes, non-degenerate and varied images, range independence, input validation."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.synth import GENERATOR_NAMES, MAX_SIDE, generate, images_digest
from capc_common.synth.core import MAX_BATCH_BYTES

SHAPES = [(28, 28, 1), (32, 32, 3), (8, 8, 1), (64, 64, 3), (17, 41, 3), (40, 9, 1)]


def _gen(name: str, *, seed: int = 7, start: int = 0, count: int = 8, shape=(32, 32, 3)) -> np.ndarray:
    height, width, channels = shape
    return generate(name, seed=seed, start=start, count=count, height=height, width=width, channels=channels)


@pytest.mark.parametrize("name", GENERATOR_NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shape_and_dtype(name, shape):
    images = _gen(name, count=3, shape=shape)
    assert images.dtype == np.uint8
    assert images.shape == (3, *shape)
    assert images.flags.c_contiguous


@pytest.mark.parametrize("name", GENERATOR_NAMES)
@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)], ids=["28x28x1", "32x32x3"])
def test_images_are_rich_and_distinct(name, shape):
    images = _gen(name, count=32, shape=shape).astype(np.float64)
    flat = images.reshape(len(images), -1)
    # every image has real contrast, and the batch spans much of the intensity range
    assert flat.std(axis=1).min() > 6.0, flat.std(axis=1).round(1)
    assert np.percentile(flat, 99) - np.percentile(flat, 1) > 150
    # no two images are alike: mean absolute difference of every pair above a floor
    pairwise = np.abs(flat[:, None, :] - flat[None, :, :]).mean(axis=2)
    assert pairwise[~np.eye(len(flat), dtype=bool)].min() > 5.0
    # natural-image-like generators are spatially correlated (neighbours agree more than random pixels)
    if name != "gaussian":
        horizontal = np.abs(np.diff(images, axis=2)).mean()
        shuffled = np.abs(flat[:, :-1] - flat[:, np.random.default_rng(0).permutation(flat.shape[1])[:-1]])
        assert horizontal < 0.8 * shuffled.mean()


@pytest.mark.parametrize("name", GENERATOR_NAMES)
def test_colour_images_use_colour(name):
    images = _gen(name, count=16).astype(np.int16)
    assert np.abs(images[..., 0] - images[..., 1]).mean() > 3.0


@pytest.mark.parametrize("name", GENERATOR_NAMES)
def test_image_does_not_depend_on_the_range_it_was_requested_in(name):
    whole = _gen(name, start=0, count=8)
    assert np.array_equal(_gen(name, start=5, count=3), whole[5:])
    assert np.array_equal(_gen(name, start=2, count=1)[0], whole[2])


@pytest.mark.parametrize("name", GENERATOR_NAMES)
def test_repeatable_in_process_and_seed_sensitive(name):
    first = _gen(name, count=4)
    assert images_digest(first) == images_digest(_gen(name, count=4))
    assert not np.array_equal(first, _gen(name, seed=8, count=4))


def test_generators_do_not_share_randomness():
    digests = {images_digest(_gen(name, count=2, shape=(16, 16, 3))) for name in GENERATOR_NAMES}
    assert len(digests) == len(GENERATOR_NAMES)


def test_large_indices_and_seeds():
    top = 2**64 - 1
    images = generate("gaussian", seed=top, start=top, count=1, height=4, width=4, channels=1)
    assert images.shape == (1, 4, 4, 1)


def test_empty_request():
    assert _gen("fractal", count=0).shape == (0, 32, 32, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "perlin"}, "unknown generator 'perlin'; choose one of gaussian"),
        ({"seed": -1}, r"seed must be in \[0, 2\^64\), got -1"),
        ({"seed": 2**64}, "seed must be in"),
        ({"seed": 1.5}, "seed must be an integer, got float 1.5"),
        ({"start": -3}, r"image indices \[-3, 2\)"),
        ({"start": 2**64 - 2, "count": 3}, "must lie in"),
        ({"count": -1}, "count must be >= 0, got -1"),
        ({"count": True}, "count must be an integer, got the boolean True"),
        ({"height": 0}, r"height must be in \[1, 1024\] pixels, got 0"),
        ({"width": MAX_SIDE + 1}, "width must be in"),
        ({"channels": 2}, "channels must be 1 .grayscale. or 3 .RGB., got 2"),
        ({"channels": 4}, "channels must be 1"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    args = {"name": "gaussian", "seed": 0, "start": 0, "count": 5, "height": 8, "width": 8, "channels": 1}
    args.update(kwargs)
    name = args.pop("name")
    with pytest.raises(InputError, match=message):
        generate(name, **args)


def test_oversized_batch_is_refused_before_allocating():
    count = MAX_BATCH_BYTES // (MAX_SIDE * MAX_SIDE * 3) + 1
    with pytest.raises(InputError, match="generate the range in chunks"):
        generate("gaussian", seed=0, start=0, count=count, height=MAX_SIDE, width=MAX_SIDE, channels=3)


def test_digest_is_sha256_of_the_bytes():
    import hashlib

    images = _gen("dead_leaves", count=2)
    assert images_digest(images) == hashlib.sha256(images.tobytes()).hexdigest()
    assert images_digest(np.asfortranarray(images)) == images_digest(images)
    with pytest.raises(InputError, match="uint8 array"):
        images_digest(images.astype(np.float32))
    with pytest.raises(InputError, match="uint8 array"):
        images_digest(images[0])
