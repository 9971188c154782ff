"""A release federation's teacher party charges its own ε cap before its seed or share leaves, and sends its
seed and its share at once (the guardian waits for the seeds a release names)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from guardian_harness import tls_files
from release_harness import ReleaseGuardianServer, ReleaseStudentServer
from sites_harness import federation_dict

from capc_common.errors import BudgetExhaustedError, CapcError, InputError, UnavailableError
from capc_common.federation import FederationConfig, exposure_of
from capc_common.federation.releases import protocol_for
from capc_common.privacy import SystemNoise
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_to_proto
from capc_services.common.metrics import PartyMetrics
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.contributor import POLL_TIMEOUT_S, ReleaseContributor
from capc_services.tls import certificate_info

DIM = 4


def _contributor(
    pki: Path,
    tmp_path: Path,
    *,
    epsilon_cap: float,
    config: FederationConfig | None = None,
    student_address: str = "127.0.0.1:9",  # nothing listens: a call fails at once
    guardian_address: str = "127.0.0.1:9",
    metrics: PartyMetrics | None = None,
) -> ReleaseContributor:
    config = config or FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl", "rho": 0.05}))
    protocol = protocol_for(config, dim=DIM)
    record = LocalCap.init(tmp_path / "cap.jsonl", config=config)
    cap = LocalCap(
        record, config=config, epsilon_cap=epsilon_cap, exposure=exposure_of(config, protocol=protocol)
    )
    rng = np.random.default_rng(0)
    return ReleaseContributor(
        config=config,
        party="hospital-a",
        tls=tls_files(pki, "hospital-a"),
        student_address=student_address,
        guardian_address=guardian_address,
        protocol=protocol,
        features=rng.normal(size=(20, DIM)).astype(np.float32),
        labels=rng.integers(0, 10, size=20),
        source=SystemNoise(),
        cap=cap,
        metrics=metrics,
    )


def _item(contributor: ReleaseContributor) -> pb.ReleaseItem:
    state = ndarray_to_proto(np.zeros(0).view(np.int64))
    return pb.ReleaseItem(release_id="r0", round=0, state=state, length=contributor.protocol.length)


def test_a_release_beyond_the_local_cap_sends_nothing(pki: Path, tmp_path: Path) -> None:
    contributor = _contributor(pki, tmp_path, epsilon_cap=1.0)
    with pytest.raises(BudgetExhaustedError, match="this party's local cap: batch r0"):
        contributor.contribute(_item(contributor))
    assert contributor.cap.batches == 0 and len((tmp_path / "cap.jsonl").read_text().splitlines()) == 1
    contributor.close()


def test_the_cap_is_charged_before_the_seed_leaves(pki: Path, tmp_path: Path) -> None:
    contributor = _contributor(pki, tmp_path, epsilon_cap=5.0)
    with pytest.raises(UnavailableError):  # the guardian is unreachable: the charge stands (over-count)
        contributor.contribute(_item(contributor))
    assert contributor.cap.batches == 1 and contributor.cap.epsilon > 0
    contributor.close()


def test_a_re_offered_release_is_charged_once_and_resends_the_same_share(pki: Path, tmp_path: Path) -> None:
    contributor = _contributor(pki, tmp_path, epsilon_cap=5.0)
    for _ in range(3):  # the guardian stays unreachable: the student would keep offering r0
        with pytest.raises(UnavailableError):
            contributor.contribute(_item(contributor))
    assert contributor.cap.batches == 1
    contributor.close()


def test_a_malformed_offer_costs_nothing(pki: Path, tmp_path: Path) -> None:
    contributor = _contributor(pki, tmp_path, epsilon_cap=5.0)
    bad = pb.ReleaseItem(release_id="r1", round=0, state=_item(contributor).state, length=3)
    nan = pb.ReleaseItem(
        release_id="r2",
        round=0,
        state=ndarray_to_proto(np.array([np.nan]).view(np.int64)),
        length=contributor.protocol.length,
    )
    for item in (bad, nan):
        with pytest.raises(InputError):
            contributor.contribute(item)
    assert contributor.cap.batches == 0
    contributor.close()


def test_the_share_leaves_beside_the_seed_not_after_its_acknowledgement(pki: Path, tmp_path: Path) -> None:
    """The guardian here takes a seed only once the party's share has reached the student: a party that
    waited for its seed's acknowledgement before sending the share would wait for ever (the round trip
    this saves on every release); this one sends both at once, and both arrive."""
    (tmp_path / "guardian").mkdir()
    guardian = ReleaseGuardianServer(pki, tmp_path / "guardian", dim=DIM)
    student = ReleaseStudentServer(pki, guardian.config, length=guardian.protocol.length)
    share_first: list[bool] = []
    take = guardian.core.submit_contribution

    def once_the_share_is_in(**call: Any) -> int:
        deadline = time.monotonic() + 3
        while not student.rounds.next_for("hospital-a", timeout=0).pending and time.monotonic() < deadline:
            time.sleep(0.01)
        share_first.append(student.rounds.next_for("hospital-a", timeout=0).pending)
        return take(**call)

    guardian.core.submit_contribution = once_the_share_is_in  # type: ignore[method-assign]
    contributor = _contributor(
        pki, tmp_path, epsilon_cap=1000.0, config=guardian.config,
        student_address=f"127.0.0.1:{student.server.port}",
        guardian_address=f"127.0.0.1:{guardian.server.port}",
    )  # fmt: skip
    try:
        contributor.contribute(student.rounds.next_for("hospital-a", timeout=1))
        assert share_first == [True] and contributor.contributed == 1
    finally:
        contributor.close()
        student.close()
        guardian.close()


def test_a_seed_the_guardian_did_not_take_is_sent_again_until_the_share_deadline(
    pki: Path, tmp_path: Path
) -> None:
    """The share went through, the seed did not (the guardian is unreachable): the student will not offer
    the release again, so the party sends the same seed again until the share deadline has passed — then it
    says so (UNAVAILABLE) and the student leaves it out."""
    config = FederationConfig.from_dict(
        federation_dict(
            mechanism={"name": "dppl", "rho": 0.05},
            quorum={"min_parties": 2, "vote_deadline_s": 5, "share_deadline_s": 1.5},
        )
    )
    student = ReleaseStudentServer(pki, config, length=protocol_for(config, dim=DIM).length)
    metrics = PartyMetrics(
        party="hospital-a", role="teacher", config_hash=config.config_hash(),
        certificate=certificate_info(pki / "hospital-a.crt"),
    )  # fmt: skip
    contributor = _contributor(
        pki, tmp_path, epsilon_cap=5.0, config=config, student_address=f"127.0.0.1:{student.server.port}",
        metrics=metrics,
    )  # fmt: skip
    try:
        with pytest.raises(UnavailableError):
            contributor.contribute(student.rounds.next_for("hospital-a", timeout=1))
        assert student.rounds.next_for("hospital-a", timeout=0).pending  # the student holds the share
        seeds = metrics.registry.get_sample_value(
            "capc_round_trips_total", {"peer": "guardian", "call": "SubmitContribution"}
        )
        assert seeds is not None and seeds >= 2
    finally:
        contributor.close()
        student.close()


def test_a_release_re_offered_for_another_round_is_refused_sending_and_charging_nothing(
    pki: Path, tmp_path: Path
) -> None:
    """The student re-offers a release this party contributed to, naming another round. Re-sending the kept
    seed and share would let the guardian release one sample in two rounds for one charge here; a fresh
    sample under the same id is no use to an honest student. The party refuses: nothing reaches the student
    or the guardian, and its cap is charged once; the offer of the release's own round still goes through."""
    (tmp_path / "guardian").mkdir()
    guardian = ReleaseGuardianServer(pki, tmp_path / "guardian", dim=DIM)
    student = ReleaseStudentServer(pki, guardian.config, length=guardian.protocol.length)
    metrics = PartyMetrics(
        party="hospital-a", role="teacher", config_hash=guardian.config.config_hash(),
        certificate=certificate_info(pki / "hospital-a.crt"),
    )  # fmt: skip
    contributor = _contributor(
        pki, tmp_path, epsilon_cap=1000.0, config=guardian.config, metrics=metrics,
        student_address=f"127.0.0.1:{student.server.port}",
        guardian_address=f"127.0.0.1:{guardian.server.port}",
    )  # fmt: skip

    def calls() -> list[float | None]:
        return [
            metrics.registry.get_sample_value("capc_round_trips_total", {"peer": peer, "call": call})
            for peer, call in (("student", "SubmitContributionShare"), ("guardian", "SubmitContribution"))
        ]

    try:
        offered = student.rounds.next_for("hospital-a", timeout=1)
        contributor.contribute(offered)
        sent = calls()
        assert sent == [1.0, 1.0] and contributor.cap.batches == 1
        again = pb.ReleaseItem()
        again.CopyFrom(offered)
        again.round = offered.round + 1
        with pytest.raises(InputError, match="contributed to for round 0, as round 1: a release belongs to"):
            contributor.contribute(again)
        assert calls() == sent and contributor.cap.batches == 1 and contributor.contributed == 1
        with pytest.raises(CapcError, match="already delivered"):  # its own round: the same bytes again
            contributor.contribute(offered)
        assert contributor.cap.batches == 1
    finally:
        contributor.close()
        student.close()
        guardian.close()


def test_a_party_asked_to_stop_does_not_wait_out_the_students_held_poll(pki: Path, tmp_path: Path) -> None:
    """The student holds a party's NextRelease while it has nothing for it (up to 30 s); a party asked to stop
    (SIGTERM) meanwhile stops within its poll's deadline (5 s), not the student's hold (``capc local down``
    kills what outlives 15 s)."""
    config = FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl", "rho": 0.05}))
    length = protocol_for(config, dim=DIM).length
    student = ReleaseStudentServer(pki, config, length=length)
    student.rounds.deliver(release_id="open", party="hospital-a", share=np.zeros(length, dtype=np.int64))
    contributor = _contributor(
        pki, tmp_path, epsilon_cap=5.0, config=config, student_address=f"127.0.0.1:{student.server.port}"
    )
    stop = threading.Event()
    runner = threading.Thread(target=contributor.run, args=(stop,), daemon=True)
    try:
        runner.start()
        time.sleep(1.0)  # its poll is held: the student has nothing for it
        assert not contributor.connected
        stop.set()
        asked = time.monotonic()
        runner.join(timeout=10.0)  # well within `capc local down`'s 15 s grace
        assert not runner.is_alive() and time.monotonic() - asked <= POLL_TIMEOUT_S
        assert contributor.connected and contributor.last_error == ""  # it ended with an answer, not a fault
    finally:
        stop.set()
        contributor.close()
        student.close()
