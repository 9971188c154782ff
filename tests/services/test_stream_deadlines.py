"""Deadlines and a bounded queue on the MPC frame channel: a stalled peer costs a bounded wait and memory."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from guardian_harness import GUARDIAN_TEST_FEDERATION, Setup, digest, votes

from capc_common.errors import UnavailableError
from capc_common.federation import FederationConfig
from capc_common.wire import messages as pb
from capc_services.common.streams import FrameChannel


def _silent() -> Iterator[pb.ComputeMessage]:
    """A peer that keeps its stream open and never sends."""
    while True:
        time.sleep(3600)
        yield pb.ComputeMessage()


def test_a_receive_within_a_batch_gives_up_at_the_deadline() -> None:
    channel = FrameChannel(_silent(), peer="student", deadline=0.3)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="student sent nothing for 0 s in the middle of a batch"):
        channel.recv()
    assert 0.25 < time.monotonic() - started < 5
    channel.close()


def test_a_peer_that_reads_nothing_fills_a_bounded_queue_then_the_send_fails() -> None:
    channel = FrameChannel(_silent(), peer="student", deadline=0.3, queue_frames=4)
    frame = bytes(1 << 20)
    for _ in range(4):
        channel.send(frame)  # up to the queue's capacity: 4 MiB held, no more
    with pytest.raises(UnavailableError, match=r"student read nothing for 0 s \(4 messages waiting\)"):
        channel.send(frame)
    channel.close()
    assert len(list(channel.outgoing())) == 4  # what was queued still goes out, then the stream ends


@pytest.fixture
def setup(pki: Path, tmp_path: Path, federation_dict) -> Iterator[Setup]:
    config = FederationConfig.from_dict(federation_dict(**GUARDIAN_TEST_FEDERATION))
    s = Setup(pki, tmp_path, config, frame_deadline_s=5.0)
    yield s
    s.close()


def test_a_stalled_student_does_not_hold_the_guardians_computation(setup: Setup) -> None:
    rng = np.random.default_rng(4)
    for batch_id in ("stalled", "next"):
        setup.student.open_batch(batch_id, count=16, digest=digest(batch_id))
    setup.share("stalled", {"hospital-a": votes(rng, 2, 16), "hospital-b": votes(rng, 3, 16)})
    # A student that starts a computation, gets the garbler's first frame, and then goes silent (its
    # connection stays up, it just never answers).
    start = pb.ComputeMessage(
        start=pb.ComputeStart(batch_id="stalled", attempt=1, parties=["hospital-a", "hospital-b"])
    )
    stalled = setup.student_stub().Compute(itertools.chain([start], _silent()))
    assert next(stalled).WhichOneof("kind") == "agreed"
    assert next(stalled).WhichOneof("kind") == "frame"  # the garbler's HELLO; nothing comes back
    # The guardian gives up on it after its deadline: the batch is released (nothing was decoded) and the
    # next batch is computed.
    shares = setup.share("next", {"hospital-a": votes(rng, 2, 16), "hospital-b": votes(rng, 3, 16)})
    done: list[np.ndarray] = []
    worker = threading.Thread(
        target=lambda: done.append(setup.student.compute("next", attempt=1, shares=shares)[0])
    )
    worker.start()
    worker.join(timeout=30)
    assert done and done[0].shape == (16,)
    assert setup.ledger.batch("stalled").state == "released"
    assert "computation failed before decoding" in setup.ledger.batch("stalled").detail
    stalled.cancel()


def test_stopping_the_server_ends_an_idle_computation_stream(
    pki: Path, tmp_path: Path, federation_dict
) -> None:
    # A student keeps its Compute stream open between batches; a guardian shutting down must not wait for
    # it for ever (its garbler thread waits, without a deadline, for the next ComputeStart). Here the one
    # batch it asked for is refused (never opened), and then it says nothing more.
    config = FederationConfig.from_dict(federation_dict(**GUARDIAN_TEST_FEDERATION))
    setup = Setup(pki, tmp_path, config)
    before = {t.ident for t in threading.enumerate()}
    refused = pb.ComputeMessage(start=pb.ComputeStart(batch_id="never-opened", attempt=1, parties=[]))
    idle = setup.student_stub().Compute(itertools.chain([refused], _silent()))
    assert next(idle).WhichOneof("kind") == "refused"
    assert _until(
        lambda: [t for t in threading.enumerate() if t.name == "garbler-student" and t.ident not in before]
    )
    garbler = next(t for t in threading.enumerate() if t.name == "garbler-student" and t.ident not in before)
    setup.close()
    garbler.join(timeout=20)
    assert not garbler.is_alive()
    idle.cancel()


def _until(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
