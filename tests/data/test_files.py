"""A site's own data: .npz archives and image folders, with the mistakes operators make."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from capc_common.data import load_dataset, load_image_folder, load_npz
from capc_common.errors import InputError


def test_npz_plain_and_split_keys(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "site.npz"
    np.savez(
        path,
        images=rng.integers(0, 256, (6, 8, 8), dtype=np.uint8),
        labels=np.array([0, 1, 2, 0, 1, 2]),
        test_images=rng.random((3, 8, 8, 3)),
        test_labels=np.array([2, 1, 0]),
        class_names=np.array(["a", "b", "c"]),
    )
    train = load_npz(path)
    assert train.shape == (8, 8, 1) and len(train) == 6 and train.class_names == ("a", "b", "c")
    test = load_dataset(f"npz:{path}", split="test")
    assert test.shape == (8, 8, 3) and test.images.dtype == np.uint8


def test_npz_missing_split_lists_keys(tmp_path):
    path = tmp_path / "site.npz"
    np.savez(path, images=np.zeros((2, 4, 4), np.uint8), labels=np.zeros(2, np.int64))
    with pytest.raises(InputError, match=r"no 'test' split.*\['images', 'labels'\]"):
        load_npz(path, split="test")


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"images": np.zeros((2, 4, 4), np.uint8)}, "lacks key"),
        ({"images": np.full((2, 4, 4), 3.0), "labels": np.zeros(2, np.int64)}, "must lie in"),
        ({"images": np.zeros((2, 4, 4), np.int32), "labels": np.zeros(2, np.int64)}, "dtype int32"),
        ({"images": np.zeros((2, 4, 4), np.uint8), "labels": np.zeros(3, np.int64)}, "2 images .* 3 labels"),
        ({"images": np.zeros((2, 4, 4), np.uint8), "labels": np.array([0.5, 1.0])}, "must be integers"),
        ({"images": np.zeros((2, 4, 4, 2), np.uint8), "labels": np.zeros(2, np.int64)}, "C 1 or 3"),
    ],
)
def test_npz_bad_contents(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(InputError, match=message) as err:
        load_npz(path)
    assert str(path) in str(err.value)


def test_npz_not_a_zip(tmp_path):
    path = tmp_path / "broken.npz"
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(InputError, match="cannot be read"):
        load_npz(path)


def _png(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_folder_grey_and_colour(tmp_path):
    _png(tmp_path / "cat" / "1.png", np.full((6, 5), 10, np.uint8))
    _png(tmp_path / "dog" / "1.png", np.full((6, 5), 20, np.uint8))
    _png(tmp_path / "dog" / "2.PNG", np.full((6, 5), 30, np.uint8))
    ds = load_dataset(f"folder:{tmp_path}")
    assert ds.class_names == ("cat", "dog") and ds.shape == (6, 5, 1)
    np.testing.assert_array_equal(ds.labels, [0, 1, 1])
    _png(tmp_path / "dog" / "3.png", np.zeros((6, 5, 3), np.uint8))
    assert load_image_folder(tmp_path).shape == (6, 5, 3)


def test_folder_split_subdirectories(tmp_path):
    for split in ("train", "test"):
        _png(tmp_path / split / "a" / "x.png", np.zeros((4, 4), np.uint8))
    assert len(load_image_folder(tmp_path, split="test")) == 1


def test_folder_unreadable_png(tmp_path):
    _png(tmp_path / "a" / "ok.png", np.zeros((4, 4), np.uint8))
    bad = tmp_path / "a" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(InputError, match="cannot be decoded") as err:
        load_image_folder(tmp_path)
    assert str(bad) in str(err.value)


def test_folder_ragged_sizes(tmp_path):
    _png(tmp_path / "a" / "1.png", np.zeros((4, 4), np.uint8))
    _png(tmp_path / "b" / "2.png", np.zeros((5, 4), np.uint8))
    with pytest.raises(InputError, match="same size"):
        load_image_folder(tmp_path)


def test_folder_empty_class_and_missing_root(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(InputError, match="holds no images"):
        load_image_folder(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        load_image_folder(tmp_path / "nowhere")
    with pytest.raises(InputError, match="no class sub-folders"):
        load_image_folder(tmp_path / "a")
