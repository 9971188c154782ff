"""A full or read-only ledger volume is what it is: a StorageError naming the volume and the space needed,
nothing written, the chain intact and readable, and writing resumes in the same ledger object once the
volume can take it. Real tmpfs volumes (root only; ``require``), real ENOSPC and read-only mounts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from capc_common.errors import IntegrityError, StorageError
from capc_common.privacy import BudgetLedger
from capc_services.lab.volumes import Volume, mounts_allowed

Require = Callable[[bool, str], None]
CONFIG = {"federation": "storage-test"}


@pytest.fixture
def volume(tmp_path: Path, require: Require) -> Iterator[Volume]:
    require(mounts_allowed(), "mounting a tmpfs needs root (CAP_SYS_ADMIN) and the mount tool")
    with Volume(tmp_path / "vol", size=4 << 20) as vol:
        yield vol


def _ledger(vol: Volume) -> BudgetLedger:
    return BudgetLedger.create(
        vol.path / "ledger.sqlite", epsilon_limit=10.0, delta=1e-5, order=8.0, config=CONFIG
    )


def _reserve(ledger: BudgetLedger, batch: str) -> None:
    ledger.reserve(
        batch, queries=4, parties=["a", "b"], mechanism="m", params={}, worst_case_rdp=0.01, actor="t"
    )


def test_a_full_volume_refuses_with_the_volume_and_space_and_writes_resume(volume: Volume) -> None:
    ledger = _ledger(volume)
    _reserve(ledger, "b0")
    volume.fill()
    with pytest.raises(StorageError) as refused:
        _reserve(ledger, "b1")
    message = str(refused.value)
    assert str(volume.path) in message and "full" in message and "KiB needed" in message, message
    assert "backup" not in message  # not data loss: nothing to restore
    assert refused.value.exit_code == 7
    # Reads go on, nothing was written, the chain verifies.
    assert ledger.summary()["entries"] == 1 and ledger.batch("b1") is None
    assert ledger.verify().ok
    volume.drain()
    _reserve(ledger, "b1")  # the same object writes again
    assert ledger.summary()["entries"] == 2 and ledger.verify().ok
    ledger.close()


def test_enospc_inside_a_commit_rolls_back_and_is_not_reported_as_damage(volume: Volume) -> None:
    """The space check passes (a few KiB above it) but the commit itself hits ENOSPC: SQLite rolls back by
    itself, and the ledger says "full" — not "cannot rollback … restore it from a backup [DATA_LOSS]"."""
    ledger = _ledger(volume)
    _reserve(ledger, "b0")
    ledger.begin("b0", computation="c0", actor="t")
    ledger._room = lambda commits: None  # type: ignore[method-assign]  # only the commit itself checks now
    volume.fill(leave=0)
    with pytest.raises(StorageError, match="is full"):
        ledger.settle("b0", answered=2, actual_rdp=0.005, actor="t", computation="c0", receipt=b"r" * 4096)
    assert ledger.batch("b0").state == "computing"  # type: ignore[union-attr]  # held at its worst case
    volume.drain()
    ledger.settle("b0", answered=2, actual_rdp=0.005, actor="t", computation="c0", receipt=b"r" * 4096)
    assert ledger.batch("b0").state == "settled" and ledger.verify().ok  # type: ignore[union-attr]
    ledger.close()


def test_begin_is_refused_before_any_decode_when_the_settle_would_not_fit(volume: Volume) -> None:
    ledger = _ledger(volume)
    _reserve(ledger, "b0")
    volume.fill(leave=64 << 10)  # room for one small commit, not for begin + settle
    with pytest.raises(StorageError, match="KiB needed"):
        ledger.begin("b0", computation="c0", actor="t")
    record = ledger.batch("b0")
    assert record is not None and record.state == "reserved" and record.computation is None
    volume.drain()
    ledger.begin("b0", computation="c0", actor="t")
    ledger.close()


def test_a_release_is_charged_only_with_room_for_it_and_its_deposit(volume: Volume) -> None:
    """A release's charge is one transaction, so SQLite alone keeps it whole; checked before it like the
    other commit points, it also leaves room for the deposit of the total it pays for — a receipt and a total
    each as long as the released vector — so a volume that could take the charge but not the deposit refuses
    the release before anything is written, instead of charging a round whose total it cannot keep."""
    ledger = _ledger(volume)
    receipt = b"m" * (200 << 10)

    def charge() -> None:
        ledger.charge(
            "release-0", parties=["a", "b"], mechanism="m", params={"release": {"round": 0, "planned": 2}},
            rdp=0.01, computation="c0", actor="g", receipt=receipt,
        )  # fmt: skip

    volume.fill(leave=320 << 10)  # room for the charge alone, not for the charge and its deposit
    with pytest.raises(StorageError, match="KiB needed") as refused:
        charge()
    assert "backup" not in str(refused.value)
    assert ledger.batch("release-0") is None and ledger.summary()["entries"] == 0
    volume.drain()
    charge()
    assert ledger.deposit("release-0", data=receipt, actor="s") and ledger.verify().ok
    ledger.close()


def test_a_read_only_volume_serves_reads_and_writes_again_once_read_write(volume: Volume) -> None:
    ledger = _ledger(volume)
    _reserve(ledger, "b0")
    ledger.close()  # Linux remounts read-only only with no file open for writing
    volume.read_only(True)
    ledger = BudgetLedger.open(volume.path / "ledger.sqlite")
    assert ledger.summary()["entries"] == 1 and ledger.verify().ok
    with pytest.raises(StorageError, match="read-only") as refused:
        _reserve(ledger, "b1")
    assert "backup" not in str(refused.value)
    volume.read_only(False)
    _reserve(ledger, "b1")
    assert ledger.summary()["entries"] == 2 and ledger.verify().ok
    ledger.close()


def test_a_damaged_file_is_still_damage(volume: Volume) -> None:
    path = volume.path / "ledger.sqlite"
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(IntegrityError, match="backup"):
        BudgetLedger.open(path)
