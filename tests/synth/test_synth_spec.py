"""``SyntheticSpec``: validation with precise messages, JSON round trip, regeneration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.synth import SyntheticSpec, generate, image_shape_for, images_digest

VALID = {
    "generator": "stylegan",
    "seed": 3,
    "first_index": 64,
    "count": 32,
    "height": 28,
    "width": 28,
    "channels": 1,
    "bn_batch": 16,
}


def test_json_round_trip():
    spec = SyntheticSpec(**VALID)
    wire = json.dumps(spec.to_dict())
    assert json.loads(wire) == VALID
    assert SyntheticSpec.from_dict(json.loads(wire)) == spec


def test_images_are_the_stream_slice():
    spec = SyntheticSpec(**{**VALID, "count": 16, "first_index": 5})
    expected = generate("stylegan", seed=3, start=5, count=16, height=28, width=28, channels=1)
    assert np.array_equal(spec.images(), expected)
    assert spec.digest() == images_digest(expected)


def test_numpy_integers_become_plain_ints():
    spec = SyntheticSpec(**{**VALID, "seed": np.uint64(3), "count": np.int32(32)})
    assert type(spec.seed) is int and type(spec.count) is int
    assert spec == SyntheticSpec(**VALID)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"generator": "plasma"}, "unknown generator 'plasma'"),
        ({"generator": 3}, "unknown generator 3"),
        ({"seed": -1}, r"seed must be in \[0, 2\^64\), got -1"),
        ({"seed": 2**64}, "seed must be in"),
        ({"first_index": -16}, r"image indices \[-16, 16\) must lie in \[0, 2\^64\)"),
        ({"first_index": 2**64 - 16}, "must lie in"),
        ({"count": 0}, "count must be a positive multiple of bn_batch 16, got 0"),
        ({"count": 40}, "count must be a positive multiple of bn_batch 16, got 40; e.g. 32"),
        ({"count": -32}, "count must be a positive multiple"),
        ({"bn_batch": 8, "count": 32}, "bn_batch must be at least 16"),
        ({"height": 0}, r"height must be in \[1, 1024\] pixels, got 0"),
        ({"width": -28}, "width must be in"),
        ({"channels": 2}, "channels must be 1 .grayscale. or 3 .RGB., got 2"),
        ({"channels": 0}, "channels must be 1"),
        ({"height": 28.0}, "height must be an integer, got float 28.0"),
        ({"bn_batch": True}, "bn_batch must be an integer, got the boolean True"),
        ({"seed": "3"}, "seed must be an integer, got str '3'"),
    ],
)
def test_invalid_fields_are_named(change, message):
    with pytest.raises(InputError, match=message):
        SyntheticSpec(**{**VALID, **change})


def test_from_dict_names_missing_and_unknown_keys():
    data = {k: v for k, v in VALID.items() if k != "bn_batch"}
    data["colour"] = "red"
    with pytest.raises(InputError, match=r"missing fields \['bn_batch'\] and unknown fields \['colour'\]"):
        SyntheticSpec.from_dict(data)
    with pytest.raises(InputError, match="must be a mapping, got list"):
        SyntheticSpec.from_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(InputError, match="count must be a positive multiple"):
        SyntheticSpec.from_dict({**VALID, "count": 17})


def test_spec_is_frozen_and_hashable():
    spec = SyntheticSpec(**VALID)
    with pytest.raises(AttributeError):
        spec.count = 64  # type: ignore[misc]
    assert len({spec, SyntheticSpec(**VALID)}) == 1


def test_image_shape_for_datasets(tmp_path):
    assert image_shape_for("fashion-mnist") == (28, 28, 1)
    assert image_shape_for("digits") == (8, 8, 1)
    path = tmp_path / "site.npz"
    np.savez(path, images=np.zeros((4, 12, 10, 3), np.uint8), labels=np.array([0, 1, 0, 1]))
    assert image_shape_for(f"npz:{path}") == (12, 10, 3)
    with pytest.raises(InputError):
        image_shape_for(f"npz:{tmp_path / 'absent.npz'}")
