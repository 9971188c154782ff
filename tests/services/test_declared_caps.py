"""Caps declared in federation.yaml (``teachers[].cap``): the guardian refuses to open a federation whose
declared caps leave fewer parties than its quorum able to answer the whole plan, before any reservation or
charge; a teacher whose own cap is below what it declared refuses to start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from guardian_harness import GUARDIAN_TEST_FEDERATION, Setup, digest

from capc_common.errors import InputError
from capc_common.federation import FederationConfig, cap_cover, exposure_of
from capc_common.wire import messages as pb
from capc_services.teacher.records import open_records
from capc_services.teacher.settings import TeacherSettings

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")  # the harness's


def _declaring(federation_dict, caps: tuple[float, float]) -> FederationConfig:
    data: dict[str, Any] = federation_dict(**GUARDIAN_TEST_FEDERATION)
    data["teachers"] = [{**t, "cap": cap} for t, cap in zip(data["teachers"], caps, strict=True)]
    return FederationConfig.from_dict(data)


def test_the_guardian_refuses_to_open_a_federation_its_declared_caps_cannot_cover(
    pki: Path, tmp_path: Path, federation_dict
) -> None:
    plain = FederationConfig.from_dict(federation_dict(**GUARDIAN_TEST_FEDERATION))
    cover = cap_cover(exposure_of(plain), delta=plain.budget.delta)
    for name in ("short", "covered"):
        (tmp_path / name).mkdir()
    short = Setup(pki, tmp_path / "short", _declaring(federation_dict, (cover.cap - 1, cover.cap)))
    try:
        before = short.ledger.entries()
        with pytest.raises(grpc.RpcError) as raw:
            short.student_stub().OpenBatch(
                pb.OpenBatchRequest(batch_id="b0", count=16, query_digest=digest("b0")), timeout=20
            )
        assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (
            f"[caps-short] hospital-a declares a cap of ε {cover.cap - 1:g}, which covers"
            in raw.value.details()
        )
        assert (
            "1 of its 2 parties can then answer the whole plan, where its quorum needs 2"
            in raw.value.details()
        )
        assert short.ledger.entries() == before and short.ledger.summary()["epsilon_spent"] == 0
    finally:
        short.close()
    covered = Setup(pki, tmp_path / "covered", _declaring(federation_dict, (cover.cap, cover.cap)))
    try:
        covered.student.open_batch("b0", count=16, digest=digest("b0"))  # reserved: it may run
        assert covered.ledger.batch("b0") is not None
    finally:
        covered.close()


def test_a_teacher_whose_cap_is_below_what_it_declared_refuses_to_start(
    pki: Path, tmp_path: Path, federation_dict
) -> None:
    config = _declaring(federation_dict, (30.0, 30.0))
    config.save(tmp_path / "federation.yaml")
    settings = TeacherSettings(
        party="hospital-a", federation=tmp_path / "federation.yaml",
        tls={"ca": pki / "ca.crt", "cert": pki / "hospital-a.crt", "key": pki / "hospital-a.key"},
        admin={"token_file": tmp_path / "token"}, student_address="127.0.0.1:1",
        guardian_address="127.0.0.1:2",
        heads=tmp_path / "heads.safetensors", cap={"epsilon": 20.0, "record": tmp_path / "cap.jsonl"},
    )  # fmt: skip
    with pytest.raises(InputError, match=r"declares hospital-a's cap as ε 30 .* cap\.epsilon is 20; raise"):
        open_records(settings, config, exposure_of(config))
    assert not (tmp_path / "cap.jsonl").exists()
