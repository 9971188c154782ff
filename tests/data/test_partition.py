"""Partitions: disjoint, covering, stable under the seed; scheme parameters honoured."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc_common.data import partition, site_part, site_parts
from capc_common.data.partition import NEIGHBOURING
from capc_common.errors import InputError

LABELS = np.repeat(np.arange(10), 300)
SCHEMES = [("iid", {}), ("imbalanced", {"imbalance_ratio": 10.0}), ("dirichlet", {"alpha": 0.3})]


def _check_cover(parts, n):
    joined = np.concatenate(parts)
    assert len(joined) == n and len(np.unique(joined)) == n  # disjoint and covering
    assert all(len(p) > 0 and np.all(np.diff(p) > 0) for p in parts)


@pytest.mark.parametrize(("scheme", "kw"), SCHEMES)
def test_disjoint_covering_stable(scheme, kw):
    parts = partition(LABELS, shards=20, scheme=scheme, seed=3, **kw)
    _check_cover(parts, len(LABELS))
    again = partition(LABELS, shards=20, scheme=scheme, seed=3, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition(LABELS, shards=20, scheme=scheme, seed=4, **kw)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=1, max_size=200),
    shards=st.integers(1, 12),
    seed=st.integers(0, 2**31),
)
def test_iid_property(labels, shards, seed):
    y = np.array(labels)
    if shards > len(y):
        with pytest.raises(InputError, match="non-empty shards"):
            partition(y, shards=shards, seed=seed)
        return
    parts = partition(y, shards=shards, seed=seed)
    _check_cover(parts, len(y))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("ratio", [1.0, 4.0, 50.0])
def test_imbalance_ratio_honoured(ratio):
    labels = np.repeat(np.arange(10), 3000)  # enough examples that rounding stays within 5 %
    parts = partition(labels, shards=10, scheme="imbalanced", seed=0, imbalance_ratio=ratio)
    for k, part in enumerate(parts):
        counts = np.bincount(labels[part], minlength=10)
        assert ratio == 1.0 or counts.argmax() == k
        assert counts.max() / counts.min() == pytest.approx(ratio, rel=0.05)


def test_dirichlet_alpha_controls_skew():
    def mean_classes(alpha):
        parts = partition(LABELS, shards=10, scheme="dirichlet", seed=1, alpha=alpha)
        return np.mean([np.sum(np.bincount(LABELS[p], minlength=10) > 0.05 * len(p)) for p in parts])

    assert mean_classes(0.05) < 3.5 < 9.0 < mean_classes(100.0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"shards": 0}, "at least 1"),
        ({"shards": 3001}, "3000 examples into 3001"),
        ({"shards": 2, "scheme": "zipf"}, "unknown partition scheme"),
        ({"shards": 2, "scheme": "imbalanced"}, "needs imbalance_ratio"),
        ({"shards": 2, "scheme": "imbalanced", "imbalance_ratio": 0.5}, "needs imbalance_ratio"),
        ({"shards": 2, "scheme": "dirichlet", "alpha": 0.0}, "alpha > 0"),
        ({"shards": 2, "alpha": 1.0}, "takes neither"),
    ],
)
def test_bad_arguments(kw, message):
    with pytest.raises(InputError, match=message):
        partition(LABELS, seed=0, **kw)


def test_bad_labels():
    with pytest.raises(InputError, match="1-D integer"):
        partition(np.zeros((3, 2), int), shards=2, seed=0)
    with pytest.raises(InputError, match="non-negative"):
        partition(np.array([0, -1, 2]), shards=2, seed=0)


def test_hash_shards_move_one_shard_when_one_example_is_added_or_removed():
    """Issue 10.9: the neighbouring relation is add/remove — each example's shard depends on it alone."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(2000, 6, 6, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, size=2000)
    shards = partition(labels, shards=20, scheme="hash", seed=5, images=images)
    every = np.sort(np.concatenate(shards))
    np.testing.assert_array_equal(every, np.arange(2000))  # disjoint and covering
    assert min(map(len, shards)) > 50  # about 100 each: a multinomial split
    again = partition(labels, shards=20, scheme="hash", seed=5, images=images)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(
            shards, partition(labels, shards=20, scheme="hash", seed=6, images=images), strict=True
        )
    )

    def content(parts, imgs, labs):  # each shard's examples in their order (a teacher sees them in order)
        return [[(imgs[i].tobytes(), int(labs[i])) for i in p] for p in parts]

    base = content(shards, images, labels)
    removed = content(
        partition(labels[1:], shards=20, scheme="hash", seed=5, images=images[1:]), images[1:], labels[1:]
    )
    assert sum(a != b for a, b in zip(base, removed, strict=True)) == 1
    extra = rng.integers(0, 256, size=(1, 6, 6, 1), dtype=np.uint8)
    more_images, more_labels = np.concatenate([images, extra]), np.append(labels, 3)
    added = content(
        partition(more_labels, shards=20, scheme="hash", seed=5, images=more_images), more_images, more_labels
    )
    assert sum(a != b for a, b in zip(base, added, strict=True)) == 1
    # A permutation split (iid) re-deals everything when one example is removed: replace-one only.
    iid = content(partition(labels, shards=20, scheme="iid", seed=5), images, labels)
    iid_removed = content(partition(labels[1:], shards=20, scheme="iid", seed=5), images[1:], labels[1:])
    assert sum(a != b for a, b in zip(iid, iid_removed, strict=True)) > 1
    assert NEIGHBOURING["hash"] == "add/remove one example" and NEIGHBOURING["iid"] == "replace one example"
    # The class-dealing schemes draw every class from one stream: a replacement that changes a label re-deals
    # later classes (they read only the labels, so a same-label replacement stays at its index and shard).
    for scheme, knob in (("imbalanced", {"imbalance_ratio": 4.0}), ("dirichlet", {"alpha": 1.0})):
        dealt = partition(labels, shards=20, scheme=scheme, seed=5, **knob)
        relabelled = labels.copy()
        relabelled[0] = (labels[0] + 1) % 10
        again = partition(relabelled, shards=20, scheme=scheme, seed=5, **knob)
        assert sum(not np.array_equal(a, b) for a, b in zip(dealt, again, strict=True)) > 2
        assert NEIGHBOURING[scheme] == "replace one example by one of the same label"
    with pytest.raises(InputError, match="needs the images"):
        partition(labels, shards=20, scheme="hash", seed=5)


def test_site_part_refuses_a_part_or_fraction_out_of_range():
    images, labels = np.zeros((10, 2, 2), dtype=np.uint8), np.arange(10) % 3
    with pytest.raises(InputError, match=r"site part 3 is outside \[0, 3\)"):
        site_part(images, labels, part=3, parts=3, seed=0)
    with pytest.raises(InputError, match=r"fraction must be in \(0, 1\], got 0"):
        site_part(images, labels, part=0, parts=3, seed=0, fraction=0)
    with pytest.raises(InputError, match=r"seed must be in \[0, 2\^64\), got -1"):
        site_part(images, labels, part=0, parts=3, seed=-1)
    with pytest.raises(InputError, match="labels must be class indices >= 0, got -1"):
        site_part(images, labels - 1, part=0, parts=3, seed=0)


@pytest.mark.parametrize("skew", [{}, {"imbalance_ratio": 10.0}, {"alpha": 0.5}])
def test_site_parts_move_one_part_by_one_example_when_one_is_added_or_removed(skew):
    """Issue 25.4: the benchmark's parties (uniform or class-skewed) under the services' add/remove relation —
    removing or adding one record changes exactly one party's set, by exactly that record."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(3000, 5, 5, 1), dtype=np.uint8)
    labels = np.repeat(np.arange(10), 300)
    parts = site_parts(images, labels, parts=10, seed=7, **skew)
    _check_cover(parts, len(labels))

    def records(split, imgs, labs):  # each party's records as a set of (image, label)
        return [{(imgs[i].tobytes(), int(labs[i])) for i in p} for p in split]

    base = records(parts, images, labels)
    for gone in (0, 1234, 2999):
        keep = np.delete(np.arange(len(labels)), gone)
        removed = records(
            site_parts(images[keep], labels[keep], parts=10, seed=7, **skew),
            images[keep],
            labels[keep],
        )
        record = (images[gone].tobytes(), int(labels[gone]))
        changed = [k for k in range(10) if base[k] != removed[k]]
        assert len(changed) == 1 and base[changed[0]] - removed[changed[0]] == {record}
        assert removed[changed[0]] <= base[changed[0]]
    extra = rng.integers(0, 256, size=(1, 5, 5, 1), dtype=np.uint8)
    more_images, more_labels = np.concatenate([images, extra]), np.append(labels, 4)
    more = site_parts(more_images, more_labels, parts=10, seed=7, **skew)
    added = records(more, more_images, more_labels)
    changed = [k for k in range(10) if base[k] != added[k]]
    assert len(changed) == 1 and added[changed[0]] - base[changed[0]] == {(extra.tobytes(), 4)}


def test_site_parts_uniform_is_site_part_and_skewed_favours_one_class_per_party():
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(6000, 4, 4, 1), dtype=np.uint8)
    labels = np.repeat(np.arange(10), 600)
    uniform = site_parts(images, labels, parts=4, seed=3)
    for k in range(4):
        np.testing.assert_array_equal(uniform[k], site_part(images, labels, part=k, parts=4, seed=3))
    skewed = site_parts(images, labels, parts=10, seed=3, imbalance_ratio=10.0)
    counts = np.stack([np.bincount(labels[p], minlength=10) for p in skewed])
    # Party k favours class k; its rarest class (k − 1) is about 10× rarer (≈ 155 vs ≈ 15.5 records).
    assert all(counts[k].argmax() == k for k in range(10))
    ratios = counts[np.arange(10), np.arange(10)] / np.maximum(
        counts[np.arange(10), (np.arange(10) - 1) % 10], 1
    )
    assert 5 < np.median(ratios) < 20
    other = site_parts(images, labels, parts=10, seed=4, imbalance_ratio=10.0)
    assert not all(np.array_equal(a, b) for a, b in zip(skewed, other, strict=True))
    with pytest.raises(InputError, match=r"imbalance_ratio must be a finite number >= 1, got 0\.5"):
        site_parts(images, labels, parts=3, seed=0, imbalance_ratio=0.5)
    with pytest.raises(InputError, match="parts must be at least 1, got 0"):
        site_parts(images, labels, parts=0, seed=0)
    with pytest.raises(InputError, match=r"seed must be in \[0, 2\^64\), got -1"):
        site_parts(images, labels, parts=2, seed=-1)


def test_site_parts_dirichlet_gives_each_class_its_public_shares():
    """Issue 24.1: the joining benchmark's skewed layouts — class ``c``'s records are spread over the parts in
    the proportions of one public Dirichlet(α) draw (seed and class only), so each party sees few classes."""
    from capc_common.data.partition import _class_shares

    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(20_000, 4, 4, 1), dtype=np.uint8)
    labels = np.repeat(np.arange(10), 2_000)
    parts = site_parts(images, labels, parts=10, seed=5, alpha=0.5)
    _check_cover([p for p in parts if len(p)], len(labels))
    counts = np.stack([np.bincount(labels[p], minlength=10) for p in parts])  # (parts, classes)
    shares = np.stack([_class_shares(c, 10, 0.5, 5) for c in range(10)]).T
    np.testing.assert_allclose(counts / 2_000, shares, atol=0.03)  # binomial noise of 2,000 draws
    # Skewed: the two largest classes of a party hold most of its records (uniform: 20 %).
    top_two = np.sort(counts, axis=1)[:, -2:].sum(axis=1) / np.maximum(counts.sum(axis=1), 1)
    assert np.median(top_two) > 0.5
    again = site_parts(images[::-1], labels[::-1], parts=10, seed=5, alpha=0.5)  # order does not matter
    assert [sorted(len(labels) - 1 - p) for p in again] == [sorted(p) for p in parts]
    other = site_parts(images, labels, parts=10, seed=6, alpha=0.5)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))
    with pytest.raises(InputError, match=r"alpha must be a finite number > 0, got 0"):
        site_parts(images, labels, parts=3, seed=0, alpha=0)
    with pytest.raises(InputError, match="imbalance_ratio or alpha, not both"):
        site_parts(images, labels, parts=3, seed=0, alpha=0.5, imbalance_ratio=10.0)
