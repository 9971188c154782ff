"""A party's per-example record features through its own cache: the same floats as extracting them, read
back only for the same map and the same records."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from capc_common.dietpate.cache import FeatureCache
from capc_common.learn import BackboneFeaturizer
from capc_common.mechanisms.central import extract_per_example
from capc_common.models import load_backbone
from capc_common.synth import generate


class _Counting(BackboneFeaturizer):
    """The backbone's featurizer, counting the images it featurises."""

    featurised = 0

    def extract(self, images: np.ndarray, *, bn_batch: int, mode: str) -> np.ndarray:
        self.featurised += len(images)
        return super().extract(images, bn_batch=bn_batch, mode=mode)


def test_record_features_are_read_back_for_the_same_records_only(tmp_path: Path) -> None:
    featurizer = _Counting(load_backbone("scatter-28x28x1"))
    records = generate("dead_leaves", seed=2, start=0, count=70, height=28, width=28, channels=1)
    direct = extract_per_example(featurizer, records)
    cache = FeatureCache(tmp_path)
    np.testing.assert_array_equal(extract_per_example(featurizer, records, cache=cache), direct)
    np.testing.assert_array_equal(extract_per_example(featurizer, records.copy(), cache=cache), direct)
    assert featurizer.featurised == 2 * 70  # extracted twice (uncached, then into the cache), read once
    assert len(list(tmp_path.glob("records-*.npy"))) == 1
    # One record changed (a record added, removed or edited): other records, other key, featurised again.
    edited = records.copy()
    edited[5, 0, 0, 0] ^= 1
    extract_per_example(featurizer, edited, cache=cache)
    assert featurizer.featurised == 3 * 70 and len(list(tmp_path.glob("records-*.npy"))) == 2


def _truncated(path: Path, features: np.ndarray) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _one_row_short(path: Path, features: np.ndarray) -> None:
    np.save(path, features[:-1])


def _float64(path: Path, features: np.ndarray) -> None:
    np.save(path, features.astype(np.float64))


def _not_an_array(path: Path, features: np.ndarray) -> None:
    path.write_bytes(b"edited by hand")


@pytest.mark.parametrize("damage", [_truncated, _one_row_short, _float64, _not_an_array])
def test_a_damaged_records_cache_file_is_featurised_again_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path, np.ndarray], None]
) -> None:
    """A cache file that does not load, or holds another shape or dtype than the records' features, is
    never used (nor fails the party): the records are featurised again, the file is replaced, and a warning
    names it."""
    featurizer = _Counting(load_backbone("scatter-28x28x1"))
    records = generate("dead_leaves", seed=2, start=0, count=70, height=28, width=28, channels=1)
    cache = FeatureCache(tmp_path)
    direct = extract_per_example(featurizer, records, cache=cache)
    (path,) = tmp_path.glob("records-*.npy")
    damage(path, direct)
    with caplog.at_level(logging.WARNING, logger="capc_common.dietpate.cache"):
        again = extract_per_example(featurizer, records, cache=cache)
    np.testing.assert_array_equal(again, direct)
    assert featurizer.featurised == 2 * 70
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(path) in warning and "computing it again" in warning, warning
    np.testing.assert_array_equal(np.load(path), direct)  # replaced: read back from now on
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left
    np.testing.assert_array_equal(extract_per_example(featurizer, records, cache=cache), direct)
    assert featurizer.featurised == 2 * 70
