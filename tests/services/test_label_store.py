"""The student's durable label store: atomic batches, resume after restart, one config per store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capc_common.errors import InputError, IntegrityError
from capc_services.student.store import LabelStore


def test_batches_survive_a_restart_and_are_never_asked_twice(tmp_path: Path) -> None:
    # Prepare
    store = LabelStore(tmp_path / "s.sqlite", config_hash="a" * 64)
    assert store.begin("b0", first_index=0, count=4) == 1
    store.complete("b0", labels=np.array([3, -1, 0, 9]), parties=("p1", "p2"))
    assert store.begin("b1", first_index=4, count=4) == 1
    store.close()
    # Execute
    again = LabelStore(tmp_path / "s.sqlite", config_hash="a" * 64)
    # Assert
    assert [b.batch_id for b in again.batches(state="open")] == ["b1"]
    assert again.begin("b1", first_index=4, count=4) == 2
    with pytest.raises(InputError, match="already done"):
        again.begin("b0", first_index=0, count=4)
    indices, labels = again.labels()
    np.testing.assert_array_equal(indices, [0, 2, 3])
    np.testing.assert_array_equal(labels, [3, 0, 9])
    assert again.counts() == {
        "batches_open": 1,
        "batches_done": 1,
        "batches_aborted": 0,
        "batches_lost": 0,
        "queries": 4,
        "answered": 3,
    }
    assert again.get("b0").parties == ("p1", "p2")


def test_failed_complete_leaves_the_batch_open(tmp_path: Path) -> None:
    store = LabelStore(tmp_path / "s.sqlite", config_hash="a" * 64)
    store.begin("b0", first_index=0, count=2)
    store.begin("b1", first_index=1, count=2)  # overlapping index range: its labels collide with b0's
    store.complete("b0", labels=np.array([1, 1]), parties=("p",))
    with pytest.raises(Exception, match="UNIQUE"):
        store.complete("b1", labels=np.array([2, 2]), parties=("p",))
    assert store.get("b1").state == "open"
    assert store.all_labels()[1].tolist() == [1, 1]
    with pytest.raises(InputError, match="3 labels"):
        store.complete("b1", labels=np.array([1, 2, 3]), parties=("p",))


def test_aborted_and_lost_batches_are_closed(tmp_path: Path) -> None:
    store = LabelStore(tmp_path / "s.sqlite", config_hash="a" * 64)
    store.begin("b0", first_index=0, count=8)
    store.finish("b0", state="aborted", detail="quorum not met")
    store.begin("b1", first_index=8, count=8)
    store.finish("b1", state="lost", detail="charged, labels lost", answered=5)
    assert [(b.state, b.detail) for b in store.batches()] == [
        ("aborted", "quorum not met"),
        ("lost", "charged, labels lost"),
    ]
    assert store.counts()["queries"] == 8
    with pytest.raises(InputError, match="not open"):
        store.finish("b0", state="lost", detail="")


def test_store_of_another_federation_is_refused(tmp_path: Path) -> None:
    LabelStore(tmp_path / "s.sqlite", config_hash="a" * 64).close()
    with pytest.raises(IntegrityError, match="fresh store"):
        LabelStore(tmp_path / "s.sqlite", config_hash="b" * 64)


def test_a_store_carries_on_across_a_membership_change(tmp_path: Path) -> None:
    """Under a config whose history names the store's config, the store continues with its batches and
    labels (nothing is asked twice); the old config may no longer open it, an unrelated one never could."""
    store = LabelStore(tmp_path / "s.sqlite", config_hash="a" * 64)
    store.begin("q000000000+16", first_index=0, count=16)
    store.complete("q000000000+16", labels=np.arange(16) % 10, parties=("h1", "h2"))
    store.close()
    with pytest.raises(IntegrityError, match="fresh store"):
        LabelStore(tmp_path / "s.sqlite", config_hash="b" * 64, continues=["c" * 64])
    store = LabelStore(tmp_path / "s.sqlite", config_hash="b" * 64, continues=["a" * 64])
    assert store.next_index() == 16 and store.counts()["batches_done"] == 1
    with pytest.raises(InputError, match="already done"):
        store.begin("q000000000+16", first_index=0, count=16)
    store.close()
    LabelStore(tmp_path / "s.sqlite", config_hash="b" * 64).close()  # it is the new config's store now
    with pytest.raises(IntegrityError, match="written under federation config bbbb"):
        LabelStore(tmp_path / "s.sqlite", config_hash="a" * 64)
