"""IDX loading: good files (plain and gzipped) and every corruption a download can produce."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from capc_common.data import load_idx, read_idx
from capc_common.errors import InputError


@pytest.mark.parametrize("gz", [False, True])
def test_round_trip(tmp_path, idx, gz):
    images = np.random.default_rng(1).integers(0, 256, (7, 5, 6)).astype(np.uint8)
    labels = np.array([0, 1, 2, 3, 4, 0, 1], dtype=np.uint8)
    img_path = idx.write_idx(tmp_path / "img", images, gz=gz)
    ds = load_idx(img_path, idx.write_idx(tmp_path / "lab", labels, gz=gz), num_classes=5)
    assert ds.images.shape == (7, 5, 6, 1)
    np.testing.assert_array_equal(ds.images[..., 0], images)
    np.testing.assert_array_equal(ds.labels, labels.astype(np.int64))
    assert ds.labels.dtype == np.int64 and ds.num_classes == 5


def test_missing_file_names_path(tmp_path):
    with pytest.raises(InputError, match="does not exist") as err:
        read_idx(tmp_path / "nope-idx3-ubyte", ndim=3)
    assert "nope-idx3-ubyte" in str(err.value)


def test_bad_magic(tmp_path):
    path = tmp_path / "page.html"
    path.write_bytes(b"<html>404 not found</html>")
    with pytest.raises(InputError, match="bad magic") as err:
        read_idx(path, ndim=3)
    assert str(path) in str(err.value)


def test_truncated_payload(tmp_path, idx):
    path = tmp_path / "img-idx3-ubyte"
    path.write_bytes(idx.idx_bytes(np.zeros((10, 4, 4), np.uint8))[:-5])
    with pytest.raises(InputError, match=r"truncated.*160 bytes.*155 bytes"):
        read_idx(path, ndim=3)


def test_trailing_bytes(tmp_path, idx):
    path = tmp_path / "img-idx3-ubyte"
    path.write_bytes(idx.idx_bytes(np.zeros((2, 4, 4), np.uint8)) + b"xx")
    with pytest.raises(InputError, match="2 bytes after"):
        read_idx(path, ndim=3)


def test_truncated_gzip(tmp_path, idx):
    path = tmp_path / "img-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(idx.idx_bytes(np.zeros((50, 28, 28), np.uint8)))[:-40])
    with pytest.raises(InputError, match="truncated or corrupt") as err:
        read_idx(path, ndim=3)
    assert str(path) in str(err.value)


def test_swapped_files_are_named(tmp_path, idx):
    labels = idx.write_idx(tmp_path / "lab", np.zeros(3, np.uint8))
    with pytest.raises(InputError, match=r"1 dimensions, expected 3.*swapped"):
        read_idx(labels, ndim=3)


def test_count_mismatch(tmp_path, idx):
    img = idx.write_idx(tmp_path / "img", np.zeros((4, 3, 3), np.uint8))
    lab = idx.write_idx(tmp_path / "lab", np.zeros(5, np.uint8))
    with pytest.raises(InputError, match=r"4 images but .* 5 labels"):
        load_idx(img, lab)


def test_label_out_of_range(tmp_path, idx):
    img = idx.write_idx(tmp_path / "img", np.zeros((3, 3, 3), np.uint8))
    lab = idx.write_idx(tmp_path / "lab", np.array([0, 1, 12], np.uint8))
    with pytest.raises(InputError, match="label 12 but the dataset has 10 classes") as err:
        load_idx(img, lab, num_classes=10)
    assert str(lab) in str(err.value)
