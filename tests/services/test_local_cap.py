"""A teacher party's own worst-case ε cap: durable, conservative, refuses before crossing."""

from __future__ import annotations

from pathlib import Path

import pytest

from capc_common.errors import BudgetExhaustedError, IntegrityError
from capc_common.federation import FederationConfig, batch_costs, mechanism_of
from capc_services.teacher.cap import LocalCap


@pytest.fixture
def config(federation_dict) -> FederationConfig:
    return FederationConfig.from_dict(
        federation_dict(mechanism={"threshold": 3, "sigma1": 2.0, "sigma2": 3.0})
    )


def test_cap_counts_worst_cases_durably_and_refuses_past_the_cap(
    tmp_path: Path, config: FederationConfig
) -> None:
    # Prepare: a cap that fits exactly two batches of 16
    costs = batch_costs(config)
    cap_eps = costs.epsilon(costs.worst_case(16) * 2.5)
    cap = LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=cap_eps)
    # Execute
    cap.charge(batch_id="b0", attempt=1, count=16)
    cap.charge(batch_id="b1", attempt=1, count=16)
    with pytest.raises(BudgetExhaustedError, match="local cap: batch b2"):
        cap.charge(batch_id="b2", attempt=1, count=16)
    # Assert: the record survives a restart and the refused batch left no trace
    again = LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=cap_eps)
    assert (again.batches, again.queries) == (2, 32)
    reference = mechanism_of(config).accountant
    reference.step(queries=32, answered=32)
    want, _ = reference.get_epsilon(delta=config.budget.delta, orders=[config.budget.order])
    assert again.epsilon == pytest.approx(want, rel=1e-12)
    with pytest.raises(BudgetExhaustedError):
        again.charge(batch_id="b2", attempt=2, count=16)


def test_record_of_another_federation_or_corrupt_is_refused(tmp_path: Path, config, federation_dict) -> None:
    LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=100).charge(batch_id="b", attempt=1, count=16)
    other = FederationConfig.from_dict(federation_dict(name="other"))
    with pytest.raises(IntegrityError, match="another federation config"):
        LocalCap(tmp_path / "cap.jsonl", config=other, epsilon_cap=100)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(IntegrityError, match="line 1 is corrupt"):
        LocalCap(tmp_path / "bad.jsonl", config=config, epsilon_cap=100)


def test_a_new_record_is_made_durable_with_its_directory_entry(
    tmp_path: Path, config: FederationConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fsync of the file alone does not make a freshly created file survive a power cut: its directory
    # entry must be synced too, or the party restarts with an empty record (an under-counted cap).
    import os
    import stat

    synced: list[bool] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    cap = LocalCap(tmp_path / "site" / "cap.jsonl", config=config, epsilon_cap=100)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    cap.charge(batch_id="b0", attempt=1, count=16)
    assert synced.count(False) == 1 and synced.count(True) == 1
    synced.clear()
    cap.charge(batch_id="b1", attempt=1, count=16)  # the file exists now: only its contents need syncing
    assert synced == [False]
