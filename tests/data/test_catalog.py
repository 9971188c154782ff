"""Named datasets: the real Fashion-MNIST, sklearn digits, directory overrides and validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capc_common.data import Dataset, load_dataset
from capc_common.data.catalog import FASHION_MNIST_DIR
from capc_common.errors import InputError


def test_fashion_mnist_real_files(monkeypatch, require):
    require(
        Path(FASHION_MNIST_DIR).is_dir(),
        f"Fashion-MNIST is not installed in {FASHION_MNIST_DIR} (Debian package)",
    )
    monkeypatch.delenv("CAPC_FASHION_MNIST", raising=False)
    test = load_dataset("fashion-mnist", split="test")
    assert test.images.shape == (10000, 28, 28, 1) and test.num_classes == 10
    assert np.bincount(test.labels).tolist() == [1000] * 10
    assert test.class_names[0] == "T-shirt/top" and not test.images.flags.writeable


def test_fashion_mnist_env_override(tmp_path, idx, monkeypatch):
    monkeypatch.setenv("CAPC_FASHION_MNIST", str(idx.write_idx_dir(tmp_path / "fm")))
    assert len(load_dataset("fashion-mnist")) == 30
    root = idx.write_idx_dir(tmp_path / "r", n_test=5)
    assert len(load_dataset("fashion-mnist", split="test", root=root)) == 5


def test_missing_directory_explains_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPC_FASHION_MNIST", str(tmp_path / "absent"))
    with pytest.raises(InputError, match="CAPC_FASHION_MNIST"):
        load_dataset("fashion-mnist")


def test_idx_dir_missing_file(tmp_path, idx):
    directory = idx.write_idx_dir(tmp_path / "d", gz=False)
    (directory / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(InputError, match="lacks t10k-labels-idx1-ubyte"):
        load_dataset(f"idx:{directory}", split="test")


def test_digits_split_is_fixed_and_disjoint():
    train, test = load_dataset("digits"), load_dataset("digits", split="test")
    assert len(train) + len(test) == 1797 and train.shape == (8, 8, 1)
    assert train.images.max() == 255
    again = load_dataset("digits", split="test")
    np.testing.assert_array_equal(test.images, again.images)
    rows = {r.tobytes() for r in train.images.reshape(len(train), -1)}
    assert sum(r.tobytes() in rows for r in test.images.reshape(len(test), -1)) < 10  # near-duplicates only


def test_digits_are_scikit_learns_read_without_importing_it():
    """The file is parsed directly (no 1.2 s import of scikit-learn per process): the same images and labels
    as ``sklearn.datasets.load_digits``, scaled from 0..16 to 0..255."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    train, test = load_dataset("digits"), load_dataset("digits", split="test")
    images = np.concatenate([train.images, test.images])[..., 0]
    labels = np.concatenate([train.labels, test.labels])
    expected = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    # the split permutes the rows: compare as multisets of (image, label)
    ours = sorted(i.tobytes() + bytes([label]) for i, label in zip(images, labels, strict=True))
    theirs = sorted(i.tobytes() + bytes([label]) for i, label in zip(expected, bunch.target, strict=True))
    assert ours == theirs and labels.dtype == np.int64


@pytest.mark.parametrize(
    ("name", "split"), [("cifar-100", "train"), ("digits", "validation"), ("npz:", "train")]
)
def test_unknown_names(name, split):
    with pytest.raises(InputError, match="unknown"):
        load_dataset(name, split=split)


def test_a_path_ending_in_npz_needs_no_prefix(tmp_path):
    # The documented site file says `dataset: /data/hospital-a.npz`; it used to be refused as unknown.
    path = tmp_path / "hospital-a.npz"
    np.savez(path, images=np.zeros((3, 4, 4, 1), np.uint8), labels=np.array([0, 1, 1]))
    plain, prefixed = load_dataset(str(path)), load_dataset(f"npz:{path}")
    np.testing.assert_array_equal(plain.labels, prefixed.labels)
    assert plain.name == prefixed.name
    with pytest.raises(InputError, match=r"npz dataset .*missing\.npz does not exist"):
        load_dataset(str(tmp_path / "missing.npz"))


@pytest.mark.parametrize("name", ["/data/site", "/data/site.tar"])
def test_a_path_without_a_known_format_says_which_prefixes_exist(name):
    with pytest.raises(
        InputError, match=rf"unknown dataset '{name}'.*npz:{name}, folder:{name} or idx:{name}"
    ):
        load_dataset(name)


def test_dataset_validation():
    with pytest.raises(InputError, match="uint8"):
        Dataset(np.zeros((2, 4, 4, 1)), np.zeros(2, np.int64), 2, ("a", "b"), "x")
    with pytest.raises(InputError, match=r"label 5 is outside \[0, 2\)"):
        Dataset(np.zeros((2, 4, 4, 1), np.uint8), np.array([0, 5]), 2, ("a", "b"), "x")
    ds = Dataset(np.zeros((3, 4, 4, 1), np.uint8), np.array([0, 1, 1]), 2, ("a", "b"), "x")
    assert len(ds.subset([2, 0])) == 2
