"""``benchmarks/joining.py``'s layouts keep the one neighbouring relation: a layout's share of the images and
its parties are both keyed content hashes, so adding or removing one record changes one party by that record
(or nothing, when the record falls outside the layout's share)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def joining() -> Iterator[Any]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import joining

        yield joining
    finally:
        sys.path.remove(str(BENCHMARKS))


def _records(
    parties: list[np.ndarray], images: np.ndarray, labels: np.ndarray
) -> list[set[tuple[bytes, int]]]:
    return [{(images[i].tobytes(), int(labels[i])) for i in p} for p in parties]


@pytest.mark.parametrize("alpha", [None, 0.5])
def test_a_layout_moves_one_party_by_one_record(joining: Any, alpha: float | None) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3000, 4, 4, 1), dtype=np.uint8)
    labels = np.repeat(np.arange(10), 300)
    layout = joining.Layout(parties=10, share=1 / 3, alpha=alpha)
    parties = joining.layout_parties(layout, images, labels, seed=3)
    joined = np.concatenate(parties)
    assert len(np.unique(joined)) == len(joined) and 850 < len(joined) < 1150  # a third, binomial
    base = _records(parties, images, labels)
    kept, outside = int(parties[0][0]), int(np.setdiff1d(np.arange(3000), joined)[0])
    for gone in (kept, outside):
        keep = np.delete(np.arange(3000), gone)
        after = _records(
            joining.layout_parties(layout, images[keep], labels[keep], seed=3), images[keep], labels[keep]
        )
        record = (images[gone].tobytes(), int(labels[gone]))
        if gone == outside:  # not in the layout: no party changes
            assert sorted(map(sorted, after)) == sorted(map(sorted, base))
        else:  # exactly one party loses exactly that record (parties keep their order: none was empty)
            changed = [k for k in range(len(base)) if base[k] != after[k]]
            assert len(changed) == 1 and base[changed[0]] - after[changed[0]] == {record}


def test_the_share_is_keyed_apart_from_the_party_split(joining: Any) -> None:
    """With the party split's own key the kept third would be the hash range of the first parties only."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(3000, 4, 4, 1), dtype=np.uint8)
    labels = np.repeat(np.arange(10), 300)
    parties = joining.layout_parties(
        joining.Layout(parties=10, share=1 / 3, alpha=None), images, labels, seed=0
    )
    assert len(parties) == 10 and all(60 < len(p) < 140 for p in parties)  # ≈ 100 each


def test_a_pipeline_is_not_run_where_it_would_read_the_test_set(joining: Any) -> None:
    """The DIET-PATE pipelines score their student on their config's evaluation set (the test images): under
    ``--evaluate-on validation`` (a tuning run) they are recorded as not run, with why, never scored there."""
    for split, refused in (("validation", True), ("test", False)):
        args = joining.parse(["--smoke", "--evaluate-on", split])
        cell = SimpleNamespace(args=args, layout="3x480-iid", parties=[SimpleNamespace(rows=np.arange(480))])
        for method in joining.PIPELINES:
            why = joining.cannot_run(cell, method)
            assert bool(why) is refused and (not refused or "test images" in why)
        assert joining.cannot_run(cell, "secagg-dpsgd") == ""
