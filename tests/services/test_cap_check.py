"""Preflight's ``local_cap`` check and a teacher's start against the plan, for a cap record that already holds
charges or charges at an order other than a new record's: the shipped Kubernetes federation (21 admissible
batches of 64; a new record charges at order 2.1, where a cap of ε 28.21 covers them all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capc_common.errors import InputError
from capc_common.federation import Exposure, FederationConfig, cap_cover, cap_order, exposure_of
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.preflight.budget import cap_check
from capc_services.teacher.records import open_records
from capc_services.teacher.settings import TeacherSettings

REPO = Path(__file__).resolve().parents[2]
K8S = FederationConfig.load(REPO / "deploy" / "k8s" / "base" / "federation.yaml")


@pytest.fixture(scope="module")
def exposure() -> Exposure:
    return exposure_of(K8S)


def _settings(pki: Path, tmp: Path, config: FederationConfig, *, cap: float) -> TeacherSettings:
    config.save(tmp / "federation.yaml")
    return TeacherSettings(
        party="hospital-a", federation=tmp / "federation.yaml",
        tls={"ca": pki / "ca.crt", "cert": pki / "hospital-a.crt", "key": pki / "hospital-a.key"},
        admin={"token_file": tmp / "token"}, student_address="127.0.0.1:1", guardian_address="127.0.0.1:2",
        heads=tmp / "heads.safetensors", cap={"epsilon": cap, "record": tmp / "cap.jsonl"},
    )  # fmt: skip


def _answer(settings: TeacherSettings, config: FederationConfig, batches: list[int]) -> None:
    """Charge the record for the stream's batches ``batches`` (by index; a repeat: collected again)."""
    with LocalCap(settings.cap.record, config=config, epsilon_cap=settings.cap.epsilon) as cap:
        for attempt, index in enumerate(batches, start=1):
            cap.charge(batch_id=f"q{index * 64:09d}+64", attempt=attempt, count=64)


def test_a_record_part_way_through_the_plan_is_checked_against_what_is_left(
    pki: Path, tmp_path: Path, exposure: Exposure
) -> None:
    """A hospital whose cap covers the plan has answered 10 of its 21 batches: the 11 left still fit (the
    check once added the whole plan again on top of what was spent, and failed: 'after 11 of those 21').
    One batch charged twice (collected again after a quorum abort) takes one more than the cap holds."""
    cover = cap_cover(exposure, delta=K8S.budget.delta)
    settings = _settings(pki, tmp_path, K8S, cap=cover.cap)
    LocalCap.init(settings.cap.record, config=K8S, order=cover.order)
    _answer(settings, K8S, list(range(10)))
    check = cap_check(settings, K8S, exposure)
    assert check.status == "ok", check.detail
    assert check.data["batches_answered"] == 10 and check.data["batches_within_cap"] == 11
    assert "of the 11 it has not answered costs at most ε 28.21" in check.detail
    _answer(settings, K8S, [9])
    again = cap_check(settings, K8S, exposure)
    assert again.status == "fail" and "stops this party after 10 of those 11 batches it has not answered" in (
        again.detail
    )


def _declaring(cap: float) -> FederationConfig:
    data: dict[str, Any] = K8S.model_dump(mode="json")
    data["teachers"] = [{**t, "cap": cap} for t in data["teachers"]]
    return FederationConfig.from_dict(data)


def test_a_record_whose_order_covers_less_than_the_declared_cap_refuses_to_start(
    pki: Path, tmp_path: Path, exposure: Exposure
) -> None:
    """federation.yaml declares ε 30 for the hospital, which covers all 21 batches at a new record's order
    2.1: the guardian counts on it. A record created before records named their order charges at the
    federation's order 10, where the same ε 30 covers 6: the teacher refuses to start (the guardian's check
    holds only for what the parties enforce) and preflight fails whatever --force says."""
    config = _declaring(30.0)
    delta = config.budget.delta
    assert exposure.admitted(epsilon=30.0, delta=delta, order=cap_order(exposure, delta=delta)) == 21
    settings = _settings(pki, tmp_path, config, cap=30.0)
    LocalCap.init(settings.cap.record, config=config, order=config.budget.order)
    with pytest.raises(InputError) as refused:
        open_records(settings, config, exposure)
    message = str(refused.value)
    assert "cap record charges at order 10" in message and "covers 6 of the 21 batches" in message
    assert "raise cap.epsilon to 91.7" in message
    check = cap_check(settings, config, exposure, force="we mean to stop early")
    assert check.status == "fail" and "cap record charges at order 10" in check.fix
    # A record at a new record's order keeps the declaration: the teacher starts
    (tmp_path / "cap.jsonl").unlink()
    LocalCap.init(settings.cap.record, config=config, order=cap_order(exposure, delta=delta))
    open_records(settings, config, exposure).close()
