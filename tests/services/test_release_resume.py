"""A release federation's student against the real guardian (mutual-TLS gRPC, a real ledger file) across
lost journals: the guardian counts releases, so a student that starts again — with its journal, without it,
or after dying between the guardian's charge and its deposit — never buys a round twice, and publishes a
model card whose privacy figures are the ledger's.

The teacher parties are threads that poll the student's open round, contribute over their own records at
its public state, send their seed to the guardian over gRPC and their share to the student's rounds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from guardian_harness import tls_files
from release_harness import BUDGET, DIM, SEED, ReleaseGuardianServer
from sites_harness import federation_dict

from capc_common.aggregation import party_noise, sampling_noise
from capc_common.errors import IntegrityError, ProtocolError
from capc_common.federation import FederationConfig
from capc_common.federation.releases import ReleaseProtocol, protocol_for
from capc_common.mechanisms import reveal, share_contribution
from capc_common.mechanisms.release import student_half
from capc_common.wire import ndarray_from_proto
from capc_services.student.releases import (
    ReleaseClient,
    ReleaseJournal,
    ReleaseProgress,
    ReleaseRounds,
    publish_release,
    run_releases,
)

#: Secure-aggregation DP-SGD over the raw coordinates: a statistics release and three gradient rounds.
DPSGD = {
    "name": "secagg-dpsgd",
    "rounds": 3,
    "noise_multiplier": 4.0,
    "sampling_rate": 1.0,
    "projection": None,
    "optimizer": "momentum",
    "learning_rate": 0.5,
}
RECORDS = 40


class Federation:
    """The guardian, a student's link to it, and teacher threads serving whatever rounds a student opens.

    Args:
        seedless: whether a teacher's seed for an attempt never reaches the guardian (its share still reaches
            the student): a broken link, or a guardian restarted between the seeds and the release.
        federation: other federation.yaml fields for the guardian (``teachers``, ``quorum``).
    """

    def __init__(
        self,
        pki: Path,
        root: Path,
        *,
        mechanism: dict[str, Any] | None = None,
        seedless: Callable[[str, str], bool] = lambda party, attempt: False,
        **federation: object,
    ) -> None:
        self.pki, self.root, self.seedless = pki, root, seedless
        self.guardian = ReleaseGuardianServer(pki, root, mechanism=mechanism or DPSGD, **federation)
        self.config = self.guardian.config
        #: What each teacher contributed, by (attempt, party).
        self.sent: dict[tuple[str, str], np.ndarray] = {}
        rng = np.random.default_rng(11)
        self.data = {
            party: (rng.normal(size=(RECORDS, DIM)), rng.integers(0, self.config.classes, RECORDS))
            for party in self.config.teacher_names
        }
        self.client = ReleaseClient(
            config=self.config,
            tls=tls_files(pki, "student"),
            address=f"127.0.0.1:{self.guardian.server.port}",
            length=self.guardian.protocol.length,
        )

    def student(self, journal: str, *, stop: threading.Event | None = None) -> dict[str, Any]:
        """Run every round with the journal in ``root/journal`` (a fresh protocol: the student's state starts
        empty), the teachers serving it; publish. Returns the card and the head."""
        protocol = protocol_for(self.config, dim=DIM)
        rounds = ReleaseRounds(self.config, length=protocol.length)
        progress = ReleaseProgress()
        stop = stop or threading.Event()
        teachers = [
            threading.Thread(target=self._teacher, args=(party, rounds, stop), daemon=True)
            for party in self.config.teacher_names
        ]
        for thread in teachers:
            thread.start()
        try:
            run_releases(
                protocol=protocol,
                rounds=rounds,
                guardian=self.client,
                journal=self.journal(journal),
                noise=party_noise("student", seed=SEED),
                progress=progress,
                stop=stop,
            )
        finally:
            rounds.finish()
            for thread in teachers:
                thread.join(timeout=10)
        out = self.root / f"{journal}-out"
        published = publish_release(
            config=self.config, protocol=protocol, progress=progress, output_dir=out, evaluate=None
        )
        card = json.loads(Path(published["model_card"]).read_text())
        return {"card": card, "head": np.load(out / "head.npy"), "progress": progress}

    def journal(self, name: str) -> ReleaseJournal:
        return ReleaseJournal(
            self.root / name, config_hash=self.config.config_hash(), length=self.guardian.protocol.length
        )

    def _teacher(self, party: str, rounds: ReleaseRounds, stop: threading.Event) -> None:
        protocol: ReleaseProtocol = protocol_for(self.config, dim=DIM)
        features, labels = self.data[party]
        prepared = protocol.prepare(features)
        source = sampling_noise(party, seed=SEED)
        while not stop.is_set():
            item = rounds.next_for(party, timeout=0.2)
            if item.done:
                return
            if item.pending:
                continue
            state = ndarray_from_proto(item.state).view(np.float64)
            vector = protocol.contribute(state, prepared, labels, source)
            self.sent[(item.release_id, party)] = vector
            if self.seedless(party, item.release_id):
                _, share = share_contribution(vector)
            else:
                share = self.guardian.contribute(item.release_id, party, vector, round=item.round)
            rounds.deliver(release_id=item.release_id, party=party, share=share)

    def entries(self) -> int:
        return self.guardian.entries()

    def close(self) -> None:
        self.client.close()
        self.guardian.close()


@pytest.fixture
def federation(pki: Path, tmp_path: Path) -> Iterator[Federation]:
    running = Federation(pki, tmp_path)
    yield running
    running.close()


def _card_is_the_ledger(card: dict[str, Any], federation: Federation) -> None:
    privacy, summary = card["privacy"], federation.guardian.ledger.summary()
    _, rounds, settled = federation.guardian.ledger.release_plan()
    assert privacy["source"] == "the guardian's ledger"
    assert privacy["rdp_spent"] == summary["spent_rdp"]
    assert privacy["epsilon_spent"] == summary["epsilon_spent"]
    assert privacy["ledger_head"] == summary["head"]
    assert privacy["releases"] == settled == len(rounds) == privacy["releases_planned"]
    assert privacy["epsilon"] == federation.guardian.ledger.epsilon_of(
        privacy["releases_planned"] * federation.guardian.protocol.release_rdp(summary["order"])
    )


def test_a_second_student_without_a_journal_resumes_and_buys_nothing(federation: Federation) -> None:
    """The issue's test: the releases run twice with empty journals against one ledger. The second run
    resumes from the guardian's record (every round deposited): nothing is charged, the same head is
    published, and both cards equal the ledger."""
    first = federation.student("first")
    entries = federation.entries()
    assert entries == 3 * federation.guardian.protocol.rounds
    _card_is_the_ledger(first["card"], federation)
    second = federation.student("second")  # an empty journal
    assert federation.entries() == entries
    np.testing.assert_array_equal(second["head"], first["head"])
    _card_is_the_ledger(second["card"], federation)
    assert second["card"]["privacy"] == first["card"]["privacy"]
    assert federation.guardian.ledger.verify().ok


def test_a_student_that_died_after_the_charge_reveals_the_round_again_from_its_half(
    federation: Federation,
) -> None:
    """Killed between the guardian's charge and its journal write: restarted on its journal, the student
    finds the round charged, the half it kept for that attempt and the guardian's receipt, and reveals the
    very total it would have revealed — the round is not paid twice, and nothing is lost."""
    total = _die_after_the_charge(federation, "journal")
    entries = federation.entries()
    resumed = federation.student("journal")
    assert federation.entries() == entries + 3 * (federation.guardian.protocol.rounds - 1)
    attempt, journaled = federation.journal("journal").total(0) or ("", None)
    assert attempt == "release-dead-0"
    np.testing.assert_array_equal(journaled, total)
    assert resumed["progress"].lost == []
    _card_is_the_ledger(resumed["card"], federation)


def test_a_round_whose_half_is_lost_too_is_skipped_and_never_paid_twice(federation: Federation) -> None:
    """Killed between the charge and the deposit *and* its state directory lost: the round's total is gone
    for good. A training run goes on without it (its charge stands, nothing more is paid) and says so."""
    _die_after_the_charge(federation, "lost")
    entries = federation.entries()
    resumed = federation.student("elsewhere")
    assert resumed["progress"].lost == [0] and resumed["card"]["privacy"]["releases_lost"] == [0]
    assert federation.entries() == entries + 3 * (federation.guardian.protocol.rounds - 1)
    _card_is_the_ledger(resumed["card"], federation)


def test_a_one_release_plan_whose_total_is_lost_says_so(pki: Path, tmp_path: Path) -> None:
    one = Federation(pki, tmp_path, mechanism={"name": "dppl", "rho": 0.05})
    try:
        _die_after_the_charge(one, "lost")
        with pytest.raises(IntegrityError, match="only release was charged but its total is lost"):
            one.student("elsewhere")
        assert one.entries() == 3
    finally:
        one.close()


def _die_after_the_charge(federation: Federation, journal: str) -> np.ndarray:
    """What a student leaves when it dies right after the guardian charged round 0: the half it kept for the
    attempt in ``journal``, the charge on the ledger, no total anywhere. Returns the total it would have
    revealed."""
    protocol = protocol_for(federation.config, dim=DIM)
    shares = []
    for party in federation.config.teacher_names:
        features, labels = federation.data[party]
        vector = protocol.contribute(
            protocol.state(), protocol.prepare(features), labels, sampling_noise(party, seed=SEED)
        )
        shares.append(federation.guardian.contribute("release-dead-0", party, vector))
    half = student_half(shares, noise=protocol.mechanism.noise_part(party_noise("student", seed=SEED)))
    parties = list(federation.config.teacher_names)
    federation.journal(journal).keep_half(0, "release-dead-0", parties, half)
    answer = federation.client.release("release-dead-0", 0, parties)
    assert federation.entries() == 3 and not answer.replayed
    return reveal([half], answer.masked)


def test_seeds_lost_before_the_release_start_the_round_again(pki: Path, tmp_path: Path) -> None:
    """A guardian restarted between the teachers' seeds and the student's release has lost the seeds (it
    keeps them in memory only): it waits the share deadline, names every party, and the student starts the
    round again under a fresh attempt — it used to stop for good (FAILED_PRECONDITION). Charged once."""
    federation = Federation(
        pki, tmp_path, seedless=lambda party, attempt: attempt.endswith("-0") and attempt.count("-") == 2
    )
    try:
        result = federation.student("journal")
        assert federation.entries() == 3 * federation.guardian.protocol.rounds
        attempt, _ = federation.journal("journal").total(0) or ("", None)
        assert attempt.endswith("-0-1")  # the second attempt at round 0
        _card_is_the_ledger(result["card"], federation)
    finally:
        federation.close()


def test_a_party_whose_seed_never_reaches_the_guardian_is_left_out(pki: Path, tmp_path: Path) -> None:
    """Three teacher parties, a quorum of two, and hospital-c's seeds never reach the guardian while its
    shares reach the student: each round is asked again without it — a new half without its share — and
    released over the other two, their exact noisy total."""
    teachers = [{"name": f"hospital-{p}", "heads": 1} for p in "abc"]
    federation = Federation(
        pki, tmp_path, teachers=teachers, seedless=lambda party, attempt: party == "hospital-c"
    )
    try:
        federation.student("journal")
        charged = federation.guardian.ledger.entries(kinds=["reserve"])
        assert len(charged) == federation.guardian.protocol.rounds
        assert {entry.parties for entry in charged} == {("hospital-a", "hospital-b")}
        attempt, total = federation.journal("journal").total(0) or ("", None)
        mechanism = federation.guardian.protocol.mechanism
        noise = mechanism.noise_part(party_noise("guardian", seed=SEED))
        noise = noise + mechanism.noise_part(party_noise("student", seed=SEED))
        sent = federation.sent[(attempt, "hospital-a")] + federation.sent[(attempt, "hospital-b")]
        np.testing.assert_array_equal(total, sent + noise)
    finally:
        federation.close()


def test_a_student_started_before_the_guardian_waits_for_it(pki: Path, tmp_path: Path) -> None:
    """Parties start together: a student whose first question (the round's record) finds no guardian
    listening waits and says so, instead of failing for good; stopped meanwhile, it stops."""
    config = FederationConfig.from_dict(federation_dict(mechanism=DPSGD, budget=BUDGET))
    protocol = protocol_for(config, dim=DIM)
    nowhere = ReleaseClient(
        config=config, tls=tls_files(pki, "student"), address="127.0.0.1:1", length=protocol.length
    )
    progress, stop = ReleaseProgress(), threading.Event()
    failed: list[BaseException] = []

    def student() -> None:
        try:
            run_releases(
                protocol=protocol, rounds=ReleaseRounds(config, length=protocol.length), guardian=nowhere,
                journal=ReleaseJournal(tmp_path, config_hash=config.config_hash(), length=protocol.length),
                noise=party_noise("student", seed=SEED), progress=progress, stop=stop,
            )  # fmt: skip
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=student, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not progress.state.startswith("waiting for the guardian"):
            assert thread.is_alive() and time.monotonic() < deadline, (progress.state, failed)
            time.sleep(0.05)
        time.sleep(1.0)
        assert thread.is_alive()  # still waiting: not failed
    finally:
        stop.set()
        thread.join(timeout=10)
        nowhere.close()
    assert len(failed) == 1 and "stopping" in str(failed[0])


def test_an_attempt_id_from_the_guardian_never_names_a_file_outside_the_journal() -> None:
    """The journal's files are named by the attempt a round was charged under, which the guardian reports:
    only the student's own form of id is accepted from it."""
    assert ReleaseClient._attempt("release-0a1b2c3d4e5f-7") == "release-0a1b2c3d4e5f-7"
    for bad in ("../../etc/passwd", "a/b", "x.total", "", "r" * 129):
        with pytest.raises(ProtocolError, match="the student's own ids"):
            ReleaseClient._attempt(bad)
