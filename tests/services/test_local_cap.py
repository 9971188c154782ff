"""A teacher party's own worst-case ε cap: durable, conservative, refuses before crossing."""

from __future__ import annotations

from pathlib import Path

import pytest

from capc_common.errors import BudgetExhaustedError, InputError, IntegrityError
from capc_common.federation import FederationConfig, batch_costs, cap_cover, mechanism_of, plan_batches
from capc_common.privacy import BudgetLedger
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
    LocalCap.init(tmp_path / "cap.jsonl", config=config)
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
    LocalCap.init(tmp_path / "cap.jsonl", config=config)
    LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=100).charge(batch_id="b", attempt=1, count=16)
    other = FederationConfig.from_dict(federation_dict(name="other"))
    with pytest.raises(IntegrityError, match="another federation config"):
        LocalCap(tmp_path / "cap.jsonl", config=other, epsilon_cap=100)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(IntegrityError, match="line 1 is corrupt"):
        LocalCap(tmp_path / "bad.jsonl", config=config, epsilon_cap=100)


def test_a_missing_record_refuses_to_start_and_is_created_only_by_init(
    tmp_path: Path, config: FederationConfig
) -> None:
    """The campaign's finding: a deleted cap.jsonl silently restarted the hospital at ε 0."""
    record = tmp_path / "site" / "cap.jsonl"
    with pytest.raises(IntegrityError, match=r"does not exist.*restore the record.*capc teacher init-cap"):
        LocalCap(record, config=config, epsilon_cap=100)
    assert not record.parent.exists()  # opening creates nothing
    LocalCap.init(record, config=config)
    LocalCap(record, config=config, epsilon_cap=100).charge(batch_id="b0", attempt=1, count=16)
    with pytest.raises(InputError, match="never re-created"):
        LocalCap.init(record, config=config)
    assert LocalCap(record, config=config, epsilon_cap=100).batches == 1
    record.unlink()
    with pytest.raises(IntegrityError, match="does not exist"):
        LocalCap(record, config=config, epsilon_cap=100)


def test_a_new_record_is_made_durable_with_its_directory_entry(
    tmp_path: Path, config: FederationConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fsync of the file alone does not make a freshly created file survive a power cut: its directory
    # entry must be synced too, or the party restarts without its record.
    import os
    import stat

    synced: list[bool] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    LocalCap.init(tmp_path / "site" / "cap.jsonl", config=config)
    assert synced == [False, True]
    synced.clear()
    cap = LocalCap(tmp_path / "site" / "cap.jsonl", config=config, epsilon_cap=100)
    cap.charge(batch_id="b0", attempt=1, count=16)  # the file exists: only its contents need syncing
    assert synced == [False]


def test_the_covering_cap_answers_every_batch_the_federations_limit_can_admit(
    tmp_path: Path, federation_dict
) -> None:
    """`capc local up`'s default cap and preflight's check (cap_cover): the worst case of every batch the
    ledger can admit. The ledger admits most when nothing is answered (each batch settles at its screening
    cost); a cap of the cover's ε takes every one of those at its worst case, and a hair less does not."""
    config = FederationConfig.from_dict(
        federation_dict(
            teachers=[{"name": "hospital-a", "heads": 10}, {"name": "hospital-b", "heads": 10}],
            mechanism={"threshold": 12, "sigma1": 12.0, "sigma2": 10.0},
            budget={"epsilon": 10.0, "delta": 1e-5, "order": 10},
            queries={**federation_dict()["queries"], "total": 2048, "batch_size": 32, "bn_batch": 32},  # type: ignore[dict-item]
        )
    )
    cover, costs, sizes = cap_cover(config), batch_costs(config), plan_batches(config)
    b = config.budget
    admitted = 0
    with BudgetLedger.create(
        tmp_path / "ledger.sqlite", epsilon_limit=b.epsilon, delta=b.delta, order=b.order, config={}
    ) as ledger:
        for i, count in enumerate(sizes):
            try:
                ledger.reserve(f"b{i}", queries=count, parties=["hospital-a"], mechanism="m", params={},
                               worst_case_rdp=costs.worst_case(count), actor="student")  # fmt: skip
            except BudgetExhaustedError:
                break
            ledger.settle(f"b{i}", answered=0, actual_rdp=costs.actual(count, 0), actor="guardian")
            admitted += 1
    assert admitted == cover.admissible_batches < cover.plan_batches == len(sizes) == 64
    assert cover.rdp == pytest.approx(sum(costs.worst_case(c) for c in sizes[:admitted]))
    assert cover.epsilon <= cover.cap < cover.epsilon + 0.01 and cover.cap > 3 * b.epsilon
    for cap_eps, takes in ((cover.cap, admitted), (cover.cap - 0.01, admitted - 1)):
        cap = LocalCap(
            LocalCap.init(tmp_path / f"{cap_eps}.jsonl", config=config), config=config, epsilon_cap=cap_eps
        )
        charged = 0
        for i, count in enumerate(sizes[:admitted]):
            try:
                cap.charge(batch_id=f"b{i}", attempt=1, count=count)
            except BudgetExhaustedError:
                break
            charged += 1
        assert charged == takes, cap_eps


def test_a_record_carries_on_across_a_membership_change(tmp_path: Path, config: FederationConfig) -> None:
    """The ε a party released before a membership change still counts after it (its record is not
    restarted at 0 by the new config hash), and new lines name the new hash."""
    LocalCap.init(tmp_path / "cap.jsonl", config=config)
    LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=100).charge(
        batch_id="b0", attempt=1, count=16
    )
    data = config.model_dump(mode="json")
    data["teachers"].append({"name": "hospital-c", "heads": 2})
    grown = FederationConfig.from_dict(
        {**data, "history": [{"previous": config.config_hash(), "added": ["hospital-c"]}]}
    )
    cap = LocalCap(tmp_path / "cap.jsonl", config=grown, epsilon_cap=100)
    assert (cap.batches, cap.queries) == (1, 16)
    assert cap.rdp == pytest.approx(batch_costs(config).worst_case(16))
    cap.charge(batch_id="b1", attempt=1, count=16)
    assert grown.config_hash() in (tmp_path / "cap.jsonl").read_text().splitlines()[-1]
    unrelated = FederationConfig.from_dict({**grown.model_dump(mode="json"), "history": []})
    with pytest.raises(IntegrityError, match="another federation config"):
        LocalCap(tmp_path / "cap.jsonl", config=unrelated, epsilon_cap=100)
