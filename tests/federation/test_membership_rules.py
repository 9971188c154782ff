"""Membership changes of federation.yaml: add or retire a teacher party and nothing else; the CLI that writes
the new file and says what each party does next."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capc_common.errors import InputError
from capc_common.federation import (
    FederationConfig,
    add_party,
    batch_costs,
    membership_change,
    retire_party,
)
from capc_services.tls import init_ca, issue_certificate, refusal

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "federation-confident-gnmax.yaml"


@pytest.fixture
def config() -> FederationConfig:
    return FederationConfig.load(COMPOSE)


def _with(config: FederationConfig, **changes: Any) -> FederationConfig:
    data = config.model_dump(mode="json")
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for key in path:
            node = node[key]
        node[last] = value
    return FederationConfig.from_dict(data)


def test_adding_a_party_keeps_every_privacy_parameter(config: FederationConfig) -> None:
    new = add_party(config, name="hospital-d", heads=25)
    assert new.teacher_names == (*config.teacher_names, "hospital-d")
    assert new.config_hash() != config.config_hash()
    assert new.budget == config.budget and new.mechanism == config.mechanism and new.queries == config.queries
    (change,) = new.history
    assert (change.previous, change.added, change.retired) == (config.config_hash(), ("hospital-d",), ())
    assert new.previous_hashes == {config.config_hash(): change}
    # The history is not a parameter: the same parties without it hash alike.
    assert FederationConfig.from_dict({**new.model_dump(mode="json"), "history": []}).config_hash() == (
        new.config_hash()
    )
    assert membership_change(config, new) == change
    # One example still moves one vote: a query costs what it did.
    assert (batch_costs(new).query_rdp, batch_costs(new).answer_rdp) == (
        batch_costs(config).query_rdp,
        batch_costs(config).answer_rdp,
    )


def test_retiring_a_party_revokes_its_certificate(config: FederationConfig) -> None:
    new = retire_party(config, name="hospital-b", serial="5F:3A", reason="left the consortium")
    assert new.teacher_names == ("hospital-a", "hospital-c")
    assert [(r.serial, r.party, r.reason) for r in new.revoked] == [
        ("5f3a", "hospital-b", "left the consortium")
    ]
    assert new.history[-1].retired == ("hospital-b",)
    with pytest.raises(
        InputError, match=r"only 1 teacher parties remain after retiring hospital-a; give --min"
    ):
        retire_party(new, name="hospital-a", serial="1")
    assert retire_party(new, name="hospital-a", serial="1", min_parties=1).teacher_names == ("hospital-c",)
    with pytest.raises(InputError, match="not a teacher party"):
        retire_party(config, name="hospital-x", serial="1")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"budget__epsilon": 20.0}, "budget.epsilon: 10.0 -> 20.0"),
        ({"budget__order": 12.0}, "budget.order: 10.0 -> 12.0"),
        ({"mechanism__sigma2": 10.0}, "mechanism.sigma2: 18.75 -> 10.0"),
        ({"queries__total": 4096}, "queries.total: 2048 -> 4096"),
        ({"classes": 11}, "classes: 10 -> 11"),
    ],
)
def test_a_privacy_parameter_cannot_change_with_the_membership(
    config: FederationConfig, change: dict[str, Any], named: str
) -> None:
    new = _with(add_party(config, name="hospital-d", heads=25), **change)
    with pytest.raises(InputError, match="may only add or retire teacher parties") as info:
        membership_change(config, new)
    assert named in str(info.value) and "needs a new federation and a new ledger" in str(info.value)


def test_what_is_not_a_membership_change_is_refused(config: FederationConfig) -> None:
    with pytest.raises(InputError, match="already a party"):
        add_party(config, name="hospital-a", heads=25)
    with pytest.raises(InputError, match="adds and retires no teacher party"):
        membership_change(config, _with(config, quorum__min_parties=3))
    teachers = [{"name": "hospital-a", "heads": 30}, {"name": "hospital-b", "heads": 25}]
    with pytest.raises(InputError, match="heads changed for hospital-a 25 -> 30"):
        membership_change(config, _with(config, teachers=[*teachers, {"name": "hospital-d", "heads": 1}]))
    written_by_hand = {
        **add_party(config, name="hospital-d", heads=25).model_dump(mode="json"),
        "history": [],
    }
    with pytest.raises(InputError, match="records no change, but the federation runs"):
        membership_change(config, FederationConfig.from_dict(written_by_hand))
    release = _with(config, mechanism={"name": "dppl", "rho": 0.05})
    with pytest.raises(InputError, match=r"release mechanism 'dppl'.*start a new federation"):
        add_party(release, name="hospital-d", heads=25)


def test_a_change_that_alters_the_cost_of_a_query_is_refused(config: FederationConfig) -> None:
    """A single head: the top count takes one value, screening reveals nothing and costs 0; a second party
    would make it cost something, and the batches already asked were counted at 0."""
    one = _with(config, teachers=[{"name": "hospital-a", "heads": 1}], quorum__min_parties=1)
    assert batch_costs(one).query_rdp == 0
    with pytest.raises(InputError, match=r"alters what one query costs.*screening RDP 0 -> "):
        add_party(one, name="hospital-b", heads=1)


def _capc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from capc_cli.main import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out + err


def test_the_cli_writes_the_new_file_and_the_next_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m" / "federation-4.yaml"  # a folder that does not exist yet (was: a traceback, exit 1)
    code, text = _capc(
        capsys, "federation", "add-party", "--federation", str(COMPOSE), "--party", "hospital-d", "--heads",
        "25", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text
    new = FederationConfig.load(out)
    assert new.teacher_names[-1] == "hospital-d" and new.history[-1].added == ("hospital-d",)
    assert "added hospital-d" in text and f"-> {new.config_hash()[:16]}" in text
    for step in ("capc cert sign hospital-d.csr", "capc teacher init-cap", "capc guardian membership",
                 "restart", "capc teacher serve"):  # fmt: skip
        assert step in text, step
    # Retire hospital-b, reading the serial from its certificate.
    init_ca(tmp_path / "ca", name="t")
    cert = issue_certificate(tmp_path / "ca", "hospital-b", out_dir=tmp_path / "certs")
    code, text = _capc(
        capsys, "federation", "retire-party", "--federation", str(out), "--party", "hospital-b",
        "--certificate", str(cert.cert), "--out", str(tmp_path / "federation-3.yaml"), "--format", "json",
    )  # fmt: skip
    assert code == 0, text
    result = json.loads(text)
    assert result["retired"] == ["hospital-b"] and result["previous_config_hash"] == new.config_hash()
    retired = FederationConfig.load(tmp_path / "federation-3.yaml")
    assert retired.revoked[-1].serial == cert.serial and len(retired.history) == 2
    assert any(f"serial {cert.serial}" in step for step in result["next"])
    # The guardian's and the student's check (tests/services/test_revocation.py) refuses that certificate now,
    # also if the name is given to a party again later.
    readded = add_party(retired, name="hospital-b", heads=25)
    for config in (retired, readded):
        refused = refusal(config, common_name="hospital-b", serial=cert.serial, dns_names=cert.dns_names)
        assert refused is not None and "is revoked in federation.yaml (hospital-b retired)" in refused


def test_the_cli_refuses_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.yaml"
    code, text = _capc(
        capsys, "federation", "add-party", "--federation", str(COMPOSE), "--party", "Hospital_D", "--heads",
        "25", "--out", str(out),
    )  # fmt: skip
    assert code == 2 and "must be a DNS label" in text and not out.exists()
    code, text = _capc(
        capsys, "federation", "retire-party", "--federation", str(COMPOSE), "--party", "hospital-b",
        "--out", str(out),
    )  # fmt: skip
    assert code == 2 and "--certificate or its --serial" in text and "Traceback" not in text
