"""The shared feature cache: the same features as extracting them, and each chunk computed once however many
processes featurise the same batch at the same time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from capc_common.models import extract_features, load_backbone
from capc_common.models.cache import FeatureCache
from capc_common.synth import generate

# 5 chunks of 16 and a last one overlapping the fifth (the chunking rule): 90 images.
IMAGES = dict(name="dead_leaves", seed=4, start=0, count=90, height=28, width=28, channels=1)
WORKER = """
import json, sys
from capc_common.models import load_backbone
from capc_common.models.cache import FeatureCache
from capc_common.synth import generate
images = generate(**json.loads(sys.argv[2]))
cache = FeatureCache(sys.argv[1])
total = float(cache.extract(load_backbone("scatter-28x28x1"), images, bn_batch=16).astype("float64").sum())
print(json.dumps({"computed": cache.computed, "read": cache.read, "sum": total}))
"""


def _images() -> np.ndarray:
    args = dict(IMAGES)
    return generate(args.pop("name"), **args)


def test_cached_features_equal_extracted_ones_computed_or_read(tmp_path: Path) -> None:
    backbone, images = load_backbone("scatter-28x28x1"), _images()
    direct = extract_features(backbone, images, bn_batch=16, mode="current")
    first = FeatureCache(tmp_path)
    np.testing.assert_array_equal(first.extract(backbone, images, bn_batch=16), direct)
    assert (first.computed, first.read) == (6, 0)
    again = FeatureCache(tmp_path)
    np.testing.assert_array_equal(again.extract(backbone, images, bn_batch=16), direct)
    assert (again.computed, again.read) == (0, 6)
    # A value that does not fit the chunk (another shape) is computed again, not used.
    for path in tmp_path.glob("*.npy"):
        np.save(path, np.zeros((3, 3), np.float32))
    third = FeatureCache(tmp_path)
    np.testing.assert_array_equal(third.extract(backbone, images, bn_batch=16), direct)
    assert third.computed == 6


def test_processes_featurising_the_same_batch_together_compute_each_chunk_once(tmp_path: Path) -> None:
    spec = json.dumps(IMAGES)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), spec], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [json.loads(w.communicate(timeout=120)[0]) for w in workers]
    assert sum(r["computed"] for r in results) == 6, results
    assert all(r["computed"] + r["read"] == 6 for r in results)
    direct = extract_features(load_backbone("scatter-28x28x1"), _images(), bn_batch=16, mode="current")
    assert {r["sum"] for r in results} == {float(direct.astype("float64").sum())}


ARRAY_WORKER = """
import sys, time
import numpy as np
from capc_common.models.cache import FeatureCache
cache = FeatureCache(sys.argv[1])
def compute():
    time.sleep(1.0)  # long enough for the other process to arrive while this one holds the lock
    return np.arange(6.0).reshape(2, 3)
value = cache.array("a public basis of backbone X", compute)
print(cache.computed, cache.read, float(value.sum()), flush=True)
"""


def test_a_named_public_array_is_computed_once_by_the_processes_that_need_it(tmp_path: Path) -> None:
    """secagg-dpsgd's public basis: every party of a machine needs it; the first computes it under the
    array's lock, the others wait and read it (not one computation per party)."""
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", ARRAY_WORKER, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = sorted(w.communicate(timeout=120)[0].split() for w in workers)
    assert outputs == [["0", "1", "15.0"], ["0", "1", "15.0"], ["1", "0", "15.0"]]
    cache = FeatureCache(tmp_path)
    np.testing.assert_array_equal(
        cache.array("a public basis of backbone X", lambda: np.zeros(1)), np.arange(6.0).reshape(2, 3)
    )
    assert (cache.computed, cache.read) == (0, 1)
    assert cache.array("another name", lambda: np.ones(2)).sum() == 2 and cache.computed == 1


def test_a_stored_array_that_is_damaged_or_fails_its_check_is_computed_again(tmp_path: Path) -> None:
    """A truncated or edited file (or another code version's basis) is never used: computed and replaced."""
    from capc_common.mechanisms.basis import is_basis

    cache = FeatureCache(tmp_path)
    basis = np.linalg.qr(np.random.default_rng(0).normal(size=(8, 3)))[0].astype(np.float32)
    compute = lambda: basis  # noqa: E731
    check = lambda a: is_basis(a, 3)  # noqa: E731
    np.testing.assert_array_equal(cache.array("basis", compute, valid=check), basis)
    (path,) = tmp_path.glob("array-*.npy")
    path.write_bytes(path.read_bytes()[:-7])  # truncated
    np.testing.assert_array_equal(cache.array("basis", compute, valid=check), basis)
    np.save(path, basis * 2)  # not orthonormal: edited
    np.testing.assert_array_equal(cache.array("basis", compute, valid=check), basis)
    assert (cache.computed, cache.read) == (3, 0)
    assert np.array_equal(cache.array("basis", compute, valid=check), basis) and cache.read == 1
    assert not is_basis(basis.astype(np.float64), 3) and not is_basis(basis, 2)
    assert not is_basis(basis[:, [0, 0, 1]], 3)  # unit columns, but not orthogonal
    assert is_basis(basis, 5) and is_basis(basis[:, :2], 3)  # fewer directions than asked for: a basis


def test_synthetic_queries_are_generated_once_and_read_back_as_generated(tmp_path: Path) -> None:
    """A spec's images come a block of bn_batch at a time from the cache, equal to generating them; a damaged
    block is generated again; another recipe (seed, first index, generator) is another block."""
    from capc_common.synth import SyntheticSpec

    spec = SyntheticSpec("stylegan", seed=3, first_index=40, count=80, height=28, width=28, channels=1,
                         bn_batch=16)  # fmt: skip
    first = FeatureCache(tmp_path)
    np.testing.assert_array_equal(first.images(spec), spec.images())
    assert (first.computed, first.read) == (5, 0)
    again = FeatureCache(tmp_path)
    np.testing.assert_array_equal(again.images(spec), spec.images())
    assert (again.computed, again.read) == (0, 5)
    blocks = sorted(tmp_path.glob("images-*.npy"))
    assert len(blocks) == 5
    blocks[0].write_bytes(b"not an array")
    np.save(blocks[1], np.zeros((16, 28, 28, 1), np.float32))  # another dtype: not these images
    third = FeatureCache(tmp_path)
    np.testing.assert_array_equal(third.images(spec), spec.images())
    assert (third.computed, third.read) == (2, 3)
    for other, new in (
        (SyntheticSpec("stylegan", 4, 40, 80, 28, 28, 1, 16), 5),  # another seed
        (SyntheticSpec("dead_leaves", 3, 40, 80, 28, 28, 1, 16), 5),  # another generator
        (SyntheticSpec("stylegan", 3, 56, 80, 28, 28, 1, 16), 1),  # the same stream: 4 blocks coincide
    ):
        cache = FeatureCache(tmp_path)
        np.testing.assert_array_equal(cache.images(other), other.images())
        assert (cache.computed, cache.read) == (new, 5 - new)


def test_features_of_other_feature_code_are_not_read(tmp_path: Path, monkeypatch) -> None:
    """The key names the feature code: after a change that moves features' bits, every stored chunk misses."""
    import capc_common.models.cache as cache_module
    from capc_common.models.files import sources_digest

    backbone, images = load_backbone("scatter-28x28x1"), _images()
    FeatureCache(tmp_path).extract(backbone, images, bn_batch=16)
    monkeypatch.setattr(cache_module, "features_version", lambda: "another version of the feature code")
    other = FeatureCache(tmp_path)
    other.extract(backbone, images, bn_batch=16)
    assert (other.computed, other.read) == (6, 0)
    # the version is the package's sources: another file's bytes, another digest
    package = tmp_path / "package"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    before = sources_digest(package, "torch 1")
    assert sources_digest(package, "torch 2") != before
    (package / "a.py").write_text("x = 2\n")
    assert sources_digest(package, "torch 1") != before
