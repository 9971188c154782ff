"""A party's per-example record features through its own cache: the same floats as extracting them, read
back only for the same map and the same records."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from capc_common.dietpate.cache import FeatureCache
from capc_common.errors import InputError
from capc_common.learn import BackboneFeaturizer
from capc_common.mechanisms.central import extract_per_example, records_entry, write_per_example
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


def _an_npz(path: Path, features: np.ndarray) -> None:
    with path.open("wb") as handle:
        np.savez(handle, features=features)


DAMAGES = [_truncated, _one_row_short, _float64, _not_an_array, _an_npz]


@pytest.mark.parametrize("damage", DAMAGES)
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


@pytest.fixture(scope="module")
def hybrid() -> BackboneFeaturizer:
    """The shipped learned backbone (convolutions: what a batch's size could change, if anything would)."""
    return BackboneFeaturizer(load_backbone("hybrid-28x28x1"))


@pytest.mark.parametrize("count", [286, 356])
def test_records_written_a_block_at_a_time_are_the_features_of_one_call(
    tmp_path: Path, hybrid: BackboneFeaturizer, count: int
) -> None:
    """A party's featurising process writes its records' features a block at a time (it never holds them
    all): the same bits as one call, whether the last block is short of a pass (286 = 2 × 128 + 30: it joins
    the block before) or a block of its own ending in an overlapping pass (356)."""
    featurizer = hybrid
    records = generate("dead_leaves", seed=3, start=0, count=count, height=28, width=28, channels=1)
    cache = FeatureCache(tmp_path)
    entry = records_entry(featurizer, records)
    path = cache.store_with(entry, lambda handle: write_per_example(featurizer, records, handle, block=128))
    assert path is not None and cache.stored(entry, shape=(count, featurizer.feature_dim), dtype=np.float32)
    written = np.load(path)
    direct = extract_per_example(featurizer, records)
    assert written.dtype == np.float32 and written.tobytes() == direct.tobytes()  # bit for bit
    # what extract_per_example reads back from the same cache entry
    np.testing.assert_array_equal(extract_per_example(featurizer, records, cache=cache), direct)
    with pytest.raises(InputError, match="whole passes"):
        write_per_example(featurizer, records, io.BytesIO(), block=100)


class _PassDependent:
    """A featurizer whose every row depends on the pass that computed it (the mean of the pass's images, as
    BatchNorm's batch statistics would): a block writer that featurised any record in another pass than one
    call does writes other values. (The real backbone's running statistics make a row the same whatever its
    pass, so it cannot tell.)"""

    sha256 = "pass-dependent"
    name = "pass-dependent"
    feature_dim = 3

    def extract(self, images: np.ndarray, *, bn_batch: int, mode: str) -> np.ndarray:
        from capc_common.models.features import chunk_starts

        if len(images) < bn_batch:
            raise InputError(f"{len(images)} images are fewer than one BatchNorm batch of {bn_batch}")
        own = images.reshape(len(images), -1).mean(axis=1)
        out = np.empty((len(images), self.feature_dim), dtype=np.float32)
        done = 0
        for start in chunk_starts(len(images), bn_batch=bn_batch):
            batch = own[start : start + bn_batch]
            rows = np.stack(
                [batch, np.full_like(batch, batch.mean()), np.full_like(batch, batch.std())], axis=1
            )
            out[done : start + bn_batch] = rows[done - start :]
            done = start + bn_batch
        return out


@pytest.mark.parametrize("count", [256, 158, 356])
def test_records_written_a_block_at_a_time_are_featurised_in_the_passes_of_one_call(
    tmp_path: Path, count: int
) -> None:
    """Every record is featurised in the same pass as by one call, whatever the records: a whole number of
    blocks (256 = 2 × 128), a tail short of a pass joining the block before (158 = 128 + 30), a last block
    ending in an overlapping pass (356 = 2 × 128 + 100)."""
    featurizer = _PassDependent()
    records = generate("dead_leaves", seed=5, start=0, count=count, height=28, width=28, channels=1)
    cache = FeatureCache(tmp_path)
    path = cache.store_with(
        records_entry(featurizer, records),
        lambda handle: write_per_example(featurizer, records, handle, block=128),
    )
    assert path is not None
    assert np.load(path).tobytes() == extract_per_example(featurizer, records).tobytes()


def test_fewer_records_than_a_pass_are_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    """Fewer records than one pass: refused as one call refuses them, and the cache holds nothing after."""
    featurizer = _PassDependent()
    records = generate("dead_leaves", seed=5, start=0, count=40, height=28, width=28, channels=1)
    cache = FeatureCache(tmp_path)
    with pytest.raises(InputError, match="fewer than one BatchNorm batch"):
        cache.store_with(
            records_entry(featurizer, records),
            lambda handle: write_per_example(featurizer, records, handle, block=128),
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_stored_file_is_checked_from_its_header(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path, np.ndarray], None]
) -> None:
    """:meth:`FeatureCache.stored` names a stored file only if it holds the whole array described (read from
    its header, its values not loaded), with the same warning as a damaged file read whole."""
    features = np.arange(70 * 8, dtype=np.float32).reshape(70, 8)
    cache, entry = FeatureCache(tmp_path), {"kind": "records", "content": "x"}
    cache.store(entry, features)
    (path,) = tmp_path.glob("records-*.npy")
    assert cache.stored(entry, shape=(70, 8), dtype=np.float32) == path
    assert FeatureCache(None).stored(entry, shape=(70, 8), dtype=np.float32) is None
    damage(path, features)
    with caplog.at_level(logging.WARNING, logger="capc_common.dietpate.cache"):
        assert cache.stored(entry, shape=(70, 8), dtype=np.float32) is None
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(path) in warning and "computing it again" in warning, warning


def test_temporary_files_a_killed_writer_left_are_removed_when_the_cache_stores(tmp_path: Path) -> None:
    """A writer killed outright (SIGKILL, out of memory) leaves its temporary file: the next store into the
    directory removes those untouched for ten minutes that no writer holds, and leaves a live writer's
    (recent, or locked) one and other programs' files alone."""
    stale, live = tmp_path / ".records-a.npy.x1.tmp", tmp_path / ".records-b.npy.x2.tmp"
    slow, other = tmp_path / ".records-c.npy.x3.tmp", tmp_path / ".someone-else.tmp"
    for tmp in (stale, live, slow, other):
        tmp.write_bytes(b"half a file")
    old = time.time() - 11 * 60
    for tmp in (stale, slow, other):
        os.utime(tmp, (old, old))
    # A writer slower than ten minutes still holds its file locked: it is not removed under it.
    with slow.open("ab") as writer:
        fcntl.flock(writer.fileno(), fcntl.LOCK_EX)
        FeatureCache(tmp_path).store({"kind": "records", "content": "y"}, np.zeros((2, 3), np.float32))
    assert not stale.exists() and live.exists() and slow.exists() and other.exists()
    assert len(list(tmp_path.glob("records-*.npy"))) == 1
