"""A full or read-only volume across the services, on real tmpfs volumes (root: ``require``), real mTLS gRPC:
the guardian reports it as RESOURCE_EXHAUSTED with ``capc-error: storage`` — a StorageError naming the
volume, never data loss and never a spent budget — and keeps serving reads; the release student waits it out
and gets its release; the label store refuses a batch it could not store before the batch goes out. Also the
backoff every such wait uses, and the teacher's link check that no longer costs a round trip per batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import pytest
from guardian_harness import GUARDIAN_TEST_FEDERATION, Setup, tls_files
from guardian_harness import digest as _digest
from release_harness import ReleaseGuardianServer

from capc_common.errors import StorageError
from capc_common.federation import FederationConfig
from capc_common.mechanisms import share_contribution
from capc_common.wire import messages as pb
from capc_services.common.errors import KIND_KEY
from capc_services.common.metrics import PartyMetrics
from capc_services.common.retry import Backoff
from capc_services.lab.volumes import Volume, mounts_allowed
from capc_services.student.releases import ReleaseClient, ReleaseProgress, _waiting_out
from capc_services.student.store import LabelStore
from capc_services.teacher.client import TeacherLinks
from capc_services.tls import certificate_info

Require = Callable[[bool, str], None]


@pytest.fixture
def volume(tmp_path: Path, require: Require) -> Iterator[Volume]:
    require(mounts_allowed(), "mounting a tmpfs needs root (CAP_SYS_ADMIN) and the mount tool")
    with Volume(tmp_path / "vol", size=8 << 20) as vol:
        yield vol


@pytest.fixture
def setup(pki: Path, volume: Volume, federation_dict) -> Iterator[Setup]:
    s = Setup(pki, volume.path, FederationConfig.from_dict(federation_dict(**GUARDIAN_TEST_FEDERATION)))
    yield s
    s.close()


def test_a_full_ledger_volume_is_storage_not_budget_and_the_guardian_serves_reads(
    setup: Setup, volume: Volume
) -> None:
    assert setup.student.open_batch("b0", count=4, digest=_digest("b0")).state == 1  # OPEN
    volume.fill()
    with pytest.raises(StorageError) as refused:
        setup.student.open_batch("b1", count=4, digest=_digest("b1"))
    assert str(volume.path) in str(refused.value) and "full" in str(refused.value)
    assert "backup" not in str(refused.value) and "RESOURCE_EXHAUSTED" in str(refused.value)
    with pytest.raises(grpc.RpcError) as raw:  # the wire: RESOURCE_EXHAUSTED, named storage in the trailer
        setup.student_stub().OpenBatch(
            pb.OpenBatchRequest(batch_id="b1", count=4, query_digest=_digest("b1")), timeout=10
        )
    assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (KIND_KEY, "storage") in tuple(raw.value.trailing_metadata() or ())
    assert setup.student.status("b0").state == 1  # reads go on
    assert setup.guardian.budget()["open_batches"] == 1 and setup.ledger.verify().ok
    volume.drain()
    assert setup.student.open_batch("b1", count=4, digest=_digest("b1")).state == 1


def test_an_abort_the_full_volume_cannot_record_is_refused_not_orphaned(setup: Setup, volume: Volume) -> None:
    """Before, the guardian logged the failed release and answered "open", the student recorded the batch
    aborted, and the reservation stayed on the ledger at its worst case for good; now the student hears the
    volume is full, waits, and aborts again."""
    setup.student.open_batch("b0", count=4, digest=_digest("b0"))
    volume.fill()
    with pytest.raises(StorageError, match="full"):
        setup.student.abort_batch("b0", reason="quorum not met")
    assert setup.ledger.batch("b0").state == "reserved"  # type: ignore[union-attr]
    volume.drain()
    assert setup.student.abort_batch("b0", reason="quorum not met") == "released"


def test_the_release_student_waits_out_a_full_ledger_volume(pki: Path, volume: Volume) -> None:
    """The case of a secure-aggregation run whose guardian's ledger volume filled up: the student used to stop
    ("ledger … could not be read …; restore it from a backup [DATA_LOSS]"); it now waits, says why, and gets
    the release once the volume has room — charged once."""
    guardian = ReleaseGuardianServer(pki, volume.path)
    client = ReleaseClient(
        config=guardian.config,
        tls=tls_files(pki, "student"),
        address=f"127.0.0.1:{guardian.server.port}",
        length=guardian.protocol.length,
    )
    try:
        rng = np.random.default_rng(0)
        for party in ("hospital-a", "hospital-b"):
            seed, _ = share_contribution(rng.integers(-100, 100, size=guardian.protocol.length))
            request = pb.SubmitContributionRequest(
                release_id="r0", party=party, seed=seed, length=guardian.protocol.length
            )
            guardian.stub(party).SubmitContribution(request, timeout=10)
        volume.fill()
        progress, stop, got = ReleaseProgress(state="releasing"), threading.Event(), []
        attempt = partial(client.release, "r0", 0, ["hospital-a", "hospital-b"])
        waiter = threading.Thread(
            target=lambda: got.append(_waiting_out(attempt, what="release 1", progress=progress, stop=stop))
        )
        waiter.start()
        deadline = time.monotonic() + 30
        while not progress.error and time.monotonic() < deadline:
            time.sleep(0.05)
        assert progress.state == "waiting for storage" and str(volume.path) in progress.error, progress
        assert progress.error.startswith("release 1: ")
        assert (
            guardian.entries() == 0 and guardian.core.budget()["entries"] == 0
        )  # nothing charged, reads go on
        volume.drain()
        waiter.join(timeout=60)
        assert got and got[0].masked.shape == (guardian.protocol.length,) and not got[0].replayed
        assert progress.state == "releasing" and progress.error == ""
        assert guardian.entries() == 3 and guardian.ledger.verify().ok  # reserve, compute, settle: once
        assert client.release("r0", 0, ["hospital-a", "hospital-b"]).replayed  # and never again
        assert guardian.entries() == 3
    finally:
        stop.set()
        client.close()
        guardian.close()


def test_a_full_label_store_refuses_a_batch_before_it_goes_out(volume: Volume) -> None:
    store = LabelStore(volume.path / "labels.sqlite", config_hash="h" * 64)
    assert store.begin("b0", first_index=0, count=32) == 1
    volume.fill()
    with pytest.raises(StorageError) as refused:
        store.begin("b1", first_index=32, count=32)
    assert str(volume.path) in str(refused.value) and "KiB needed" in str(refused.value)
    with pytest.raises(StorageError, match="full"):  # a write the check did not stop: classified, not raw
        store.complete("b0", labels=np.arange(32) % 3, parties=("a", "b"))
    assert store.get("b1") is None and store.get("b0").state == "open"  # type: ignore[union-attr]
    volume.drain()
    store.complete("b0", labels=np.arange(32) % 3, parties=("a", "b"))
    assert store.begin("b1", first_index=32, count=32) == 1
    store.close()


def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() -> None:
    backoff = Backoff(0.5, 4.0)
    bounds = [0.5, 1.0, 2.0, 4.0, 4.0]
    waits = [backoff.next() for _ in bounds]
    assert all(b / 2 <= w <= b for w, b in zip(waits, bounds, strict=True)), waits
    backoff.reset()
    assert backoff.next() <= 0.5
    with pytest.raises(ValueError, match="first"):
        Backoff(2.0, 1.0)


def test_a_teacher_checks_the_guardian_link_only_until_a_seed_goes_through(setup: Setup, pki: Path) -> None:
    """While seeds go through, a batch costs the teacher one round trip to the guardian (its seed), not two
    (a health check first): counted by its own round-trip counter."""
    metrics = PartyMetrics(
        party="hospital-a",
        role="teacher",
        config_hash=setup.config.config_hash(),
        certificate=certificate_info(pki / "hospital-a.crt"),
    )
    links = TeacherLinks(
        config=setup.config,
        party="hospital-a",
        tls=tls_files(pki, "hospital-a"),
        student_address="127.0.0.1:9",
        guardian_address=setup.address,
        worker=None,  # type: ignore[arg-type]  # no work stream here: only the guardian link
        metrics=metrics,
    )
    try:

        def calls(name: str) -> float:
            return metrics.round_trips.labels(peer="guardian", call=name)._value.get()

        for k in range(3):
            batch = f"t{k}"
            setup.student.open_batch(batch, count=4, digest=_digest(batch))
            assert links.await_guardian() == ""
            links.submit_seed(batch, 1, b"\1" * 16, (4, setup.config.classes))
        assert calls("SubmitShares") == 3
        assert calls("Check") == 1  # before the first seed only
    finally:
        links.close()
