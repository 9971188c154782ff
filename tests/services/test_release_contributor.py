"""A release federation's teacher party charges its own ε cap before its seed or share leaves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from guardian_harness import tls_files
from sites_harness import federation_dict

from capc_common.errors import BudgetExhaustedError, UnavailableError
from capc_common.federation import FederationConfig, exposure_of
from capc_common.federation.releases import protocol_for
from capc_common.privacy import SystemNoise
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_to_proto
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.contributor import ReleaseContributor

DIM = 4


def _contributor(pki: Path, tmp_path: Path, *, epsilon_cap: float) -> ReleaseContributor:
    config = FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl", "rho": 0.05}))
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
        student_address="127.0.0.1:9",  # nothing listens: a call fails at once
        guardian_address="127.0.0.1:9",
        protocol=protocol,
        features=rng.normal(size=(20, DIM)).astype(np.float32),
        labels=rng.integers(0, 10, size=20),
        source=SystemNoise(),
        cap=cap,
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
    from capc_common.errors import InputError

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
