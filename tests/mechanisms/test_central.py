"""A party's per-example record features through its own cache: the same floats as extracting them, read
back only for the same map and the same records."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
