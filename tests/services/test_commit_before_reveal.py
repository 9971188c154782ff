"""Faults between the first decoded pass bit and the settle: the batch stays charged, never released.

Each test injects one fault at one step of a real computation (the guardian's core on a real SQLite ledger, a
real evaluator): a later chunk failing after the first chunk's pass bits were decoded, an abort racing the
settle from a second guardian on the same ledger file, the ledger's disk refusing the settle, and an abort
that arrives before anything was decoded (the only case that may release).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from guardian_harness import GUARDIAN_TEST_FEDERATION, Setup, digest, votes

from capc_common.aggregation import draw_student_noise
from capc_common.errors import IntegrityError, ProtocolError
from capc_common.federation import FederationConfig, batch_costs, mpc_config
from capc_common.mpc import Channel, EvaluatorSession, GarblerSession, channel_pair, sum_shares
from capc_common.mpc.party import Tag
from capc_common.privacy import BudgetLedger, SystemNoise
from capc_services.common.metrics import PartyMetrics
from capc_services.guardian.core import Agreement, Guardian
from capc_services.tls import certificate_info

COUNT = 32
CHUNK = 8  # four chunks per batch, so a fault can come after some pass bits were decoded


class InjectingLedger(BudgetLedger):
    """The real ledger, with a fault-injection point just before a settle's transaction."""

    before_settle: Callable[[], None] | None = None

    def settle(self, batch_id: str, **kwargs: Any) -> Any:
        if self.before_settle is not None:
            self.before_settle()
        return super().settle(batch_id, **kwargs)


class CountingChannel(Channel):
    """The garbler's end of an in-memory pair: counts the pass-label frames it reads, may cut the link."""

    def __init__(self, inner: Channel, *, cut_after_pass_frames: int | None = None) -> None:
        super().__init__()
        self._inner, self._cut = inner, cut_after_pass_frames
        self.pass_frames = 0

    def _send(self, data: bytes) -> None:
        self._inner.send(data)

    def _recv(self) -> bytes:
        if self._cut is not None and self.pass_frames >= self._cut:
            self._inner.close()  # the student vanished mid-batch
        frame = bytes(self._inner.recv())
        self.pass_frames += frame[0] == Tag.PASS_LABELS
        return frame

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def setup(pki: Path, tmp_path: Path, federation_dict) -> Iterator[Setup]:
    config = FederationConfig.from_dict(federation_dict(**GUARDIAN_TEST_FEDERATION))
    s = Setup(pki, tmp_path, config, ledger_class=InjectingLedger)
    yield s
    s.close()


def _agreed_batch(setup: Setup, batch_id: str) -> tuple[Agreement, np.ndarray]:
    rng = np.random.default_rng(len(batch_id))
    setup.student.open_batch(batch_id, count=COUNT, digest=digest(batch_id))
    shares = setup.share(batch_id, {"hospital-a": votes(rng, 2, COUNT), "hospital-b": votes(rng, 3, COUNT)})
    agreement = setup.guardian.agree(
        batch_id=batch_id, attempt=1, parties=("hospital-a", "hospital-b"), actor="student"
    )
    total = sum_shares([shares[p] for p in agreement.parties], width=mpc_config(setup.config).width)
    return agreement, total


def _run(
    setup: Setup, batch_id: str, agreement: Agreement, total: np.ndarray, *, cut: int | None = None
) -> tuple[BaseException | int, BaseException | np.ndarray, CountingChannel]:
    """One computation with the garbler in a thread: (guardian outcome, student outcome, garbler channel)."""
    mpc = dataclasses.replace(mpc_config(setup.config), chunk_queries=CHUNK)
    garbler_end, evaluator_end = channel_pair(timeout=20)
    counting = CountingChannel(garbler_end, cut_after_pass_frames=cut)
    outcome: dict[str, Any] = {}

    def garble() -> None:
        try:
            outcome["guardian"] = setup.guardian.compute(
                batch_id=batch_id,
                attempt=1,
                agreement=agreement,
                session=GarblerSession(counting, mpc),
                actor="student",
            )
        except Exception as exc:  # recorded for the assertions
            outcome["guardian"] = exc

    thread = threading.Thread(target=garble)
    thread.start()
    try:
        noise = draw_student_noise(SystemNoise(), batch=COUNT, sigma1=setup.config.mechanism.sigma1)
        student: BaseException | np.ndarray = EvaluatorSession(evaluator_end, mpc).run_batch(
            batch_id, share_sum=total, z1_student=noise
        )
    except Exception as exc:  # recorded for the assertions
        student = exc
    thread.join(timeout=60)
    return outcome["guardian"], student, counting


def _kinds(setup: Setup, batch_id: str) -> list[str]:
    return [e.kind for e in setup.ledger.entries(batch_id=batch_id)]


def _assert_held_at_worst_case(setup: Setup, batch_id: str) -> None:
    """Charged at the worst case, not releasable by the student, not computable again."""
    assert _kinds(setup, batch_id) == ["reserve", "compute"]
    assert setup.ledger.summary()["reserved_rdp"] == pytest.approx(
        batch_costs(setup.config).worst_case(COUNT)
    )
    assert setup.student.abort_batch(batch_id, reason="the student gives up") == "charged"
    assert setup.student.open_batch(batch_id, count=COUNT, digest=digest(batch_id)).state == 5  # CHARGED
    assert _kinds(setup, batch_id) == ["reserve", "compute"] and setup.ledger.verify().ok


def test_a_link_breaking_between_chunks_decodes_nothing_and_releases(setup: Setup) -> None:
    """The first chunk's pass labels arrived, then the link broke before the student's stash and last frame:
    the guardian decodes only once every pass label is in, so nothing was decoded and the batch is released
    (it cost nothing) instead of held at its worst case."""
    agreement, total = _agreed_batch(setup, "later-chunk")
    guardian, student, channel = _run(setup, "later-chunk", agreement, total, cut=1)
    assert channel.pass_frames == 1  # the first chunk's pass labels arrived, then the link broke
    assert isinstance(guardian, ProtocolError) and isinstance(student, ProtocolError)
    assert _kinds(setup, "later-chunk") == ["reserve", "release"]
    assert setup.ledger.summary()["spent_rdp"] == 0 and setup.ledger.verify().ok


def test_an_abort_racing_the_settle_from_a_second_guardian_is_refused(setup: Setup, tmp_path: Path) -> None:
    # A second guardian process on the same ledger file gets the student's AbortBatch while the first one
    # has decoded every pass bit and is about to settle.
    metrics = PartyMetrics(
        party="guardian",
        role="guardian",
        config_hash=setup.config.config_hash(),
        certificate=certificate_info(setup.pki / "guardian.crt"),
    )
    other = Guardian(
        config=setup.config, ledger=BudgetLedger.open(setup.ledger.path), noise=SystemNoise(), metrics=metrics
    )
    raced: list[str] = []
    setup.ledger.before_settle = lambda: raced.append(other.abort_batch("race", reason="x", actor="s").state)
    agreement, total = _agreed_batch(setup, "race")
    guardian, student, channel = _run(setup, "race", agreement, total)
    assert raced == ["charged"]  # the abort found the batch charged and released nothing
    assert channel.pass_frames == COUNT // CHUNK
    assert guardian == int((student >= 0).sum())  # settled and revealed, once
    assert _kinds(setup, "race") == ["reserve", "compute", "settle"]
    assert other.abort_batch("race", reason="late", actor="s").state == "settled"
    other.ledger.close()


def test_a_settle_the_disk_refuses_keeps_the_batch_charged_and_reveals_nothing(setup: Setup) -> None:
    holder = sqlite3.connect(setup.ledger.path, isolation_level=None, check_same_thread=False)

    def lock() -> None:
        # Another writer holds the ledger: the settle's transaction fails with "database is locked".
        setup.ledger._db.execute("PRAGMA busy_timeout = 100")  # do not wait the default minute
        holder.execute("BEGIN IMMEDIATE")

    setup.ledger.before_settle = lock
    agreement, total = _agreed_batch(setup, "locked")
    guardian, student, channel = _run(setup, "locked", agreement, total)
    holder.execute("ROLLBACK")
    holder.close()
    setup.ledger._db.execute("PRAGMA busy_timeout = 60000")
    assert channel.pass_frames == COUNT // CHUNK
    assert isinstance(guardian, IntegrityError) and "stays charged at its worst case" in str(guardian)
    assert "answered" not in str(guardian)  # a DP output nobody was charged for at its actual cost
    assert isinstance(student, ProtocolError)  # no label reached it
    _assert_held_at_worst_case(setup, "locked")


def test_an_abort_before_anything_was_decoded_releases_and_decodes_nothing(setup: Setup) -> None:
    agreement, total = _agreed_batch(setup, "early")
    setup.ledger.release("early", reason="an abort that raced the computation", actor="student")
    guardian, student, channel = _run(setup, "early", agreement, total)
    assert channel.pass_frames == COUNT // CHUNK  # they arrived; the ledger refused before one was decoded
    assert isinstance(guardian, IntegrityError) and "nothing was decoded" in str(guardian)
    assert isinstance(student, ProtocolError)
    assert _kinds(setup, "early") == ["reserve", "release"]
    assert setup.ledger.summary()["spent_rdp"] == 0
