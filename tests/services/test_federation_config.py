"""federation.yaml: validation messages and the config hash every call carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from capc_common.errors import InputError
from capc_common.federation import FederationConfig


def test_hash_is_stable_across_save_and_load(tmp_path: Path, federation_dict) -> None:
    config = FederationConfig.from_dict(federation_dict())
    config.save(tmp_path / "f.yaml")
    again = FederationConfig.load(tmp_path / "f.yaml")
    assert again == config
    assert again.config_hash() == config.config_hash()
    assert len(config.config_hash()) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"mechanism": {"threshold": 4, "sigma1": 2.0, "sigma2": 1.0}},
        {"budget": {"epsilon": 5.0, "delta": 1e-6, "order": 10}},
        {"teachers": [{"name": "hospital-a", "heads": 3}, {"name": "hospital-b", "heads": 3}]},
        {"classes": 9},
    ],
)
def test_any_parameter_change_changes_the_hash(federation_dict, change: dict[str, object]) -> None:
    base = FederationConfig.from_dict(federation_dict())
    assert FederationConfig.from_dict(federation_dict(**change)).config_hash() != base.config_hash()


def test_roles_and_heads(federation_dict) -> None:
    config = FederationConfig.from_dict(federation_dict())
    assert config.total_heads == 5
    assert config.teacher_names == ("hospital-a", "hospital-b")
    assert [config.role_of(n) for n in ("guardian", "student", "hospital-b", "x")] == [
        "guardian",
        "student",
        "teacher",
        None,
    ]
    with pytest.raises(InputError, match="not a teacher party"):
        config.teacher("x")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"quorum": {"min_parties": 3, "vote_deadline_s": 1, "share_deadline_s": 1}},
            "exceeds the 2 teacher",
        ),
        ({"teachers": [{"name": "student", "heads": 1}]}, "repeated"),
        ({"teachers": [{"name": "Bad Name", "heads": 1}]}, "DNS label"),
        ({"budget": {"epsilon": 1, "delta": 1e-5, "order": 1}}, r"budget\.order"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_invalid_configs_name_the_problem(federation_dict, change: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        FederationConfig.from_dict(federation_dict(**change))


def test_batch_size_must_be_a_multiple_of_bn_batch(federation_dict) -> None:
    queries = dict(federation_dict()["queries"])  # type: ignore[arg-type]
    queries["batch_size"] = 40
    with pytest.raises(InputError, match="not a multiple of bn_batch 16"):
        FederationConfig.from_dict(federation_dict(queries=queries))


def test_missing_file_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        FederationConfig.load(tmp_path / "nope.yaml")


def test_revocations_are_normalised_and_leave_the_hash_alone(tmp_path: Path, federation_dict) -> None:
    """Revoking a certificate changes who may connect, not what is computed: the ledger, label store and
    cap records (all pinned to the hash) carry on. A federation without the section hashes as before."""
    base = FederationConfig.from_dict(federation_dict())
    revoked = [{"serial": "0x00:5F:A3", "party": "hospital-a"}, {"serial": "abc"}]
    config = FederationConfig.from_dict(federation_dict(revoked=revoked))
    assert config.revoked_serials == {"5fa3", "abc"}
    assert config.config_hash() == base.config_hash()
    assert "revoked" not in config.canonical_json()
    config.save(tmp_path / "f.yaml")
    assert FederationConfig.load(tmp_path / "f.yaml").revoked == config.revoked
    assert config.party_names == ("guardian", "student", "hospital-a", "hospital-b")


@pytest.mark.parametrize("serial", ["xyz", "1" * 41, ""])
def test_a_revoked_serial_must_be_hex(federation_dict, serial: str) -> None:
    with pytest.raises(InputError, match=r"revoked\.0\.serial.*serial number in hex"):
        FederationConfig.from_dict(federation_dict(revoked=[{"serial": serial}]))


def test_confident_gnmax_hash_is_pinned(federation_dict) -> None:
    """The mechanism union must not move an existing federation's hash: parties pin it, ledgers carry it."""
    config = FederationConfig.from_dict(federation_dict())
    assert config.config_hash() == "5122f2515b8bbebaeda1b4fe9d4c823d202a8e816741a55fde5e8e5dd686e403"
    named = FederationConfig.from_dict(
        federation_dict(mechanism={"name": "confident-gnmax", "threshold": 3, "sigma1": 2.0, "sigma2": 1.0})
    )
    assert named.config_hash() == config.config_hash()
    seeded = FederationConfig.from_dict(
        federation_dict(mechanism={"threshold": 3, "sigma1": 2.0, "sigma2": 1.0, "insecure_noise_seed": "x"})
    )
    assert seeded.config_hash() == "a191049759dd7a4e3f62a853a0545de4d6875f65ec3eafa1c9f24dfa737e7890"


DPSGD = {
    "name": "secagg-dpsgd",
    "rounds": 5,
    "noise_multiplier": 2.0,
    "clip": 1.0,
    "sampling_rate": 0.1,
    "expected_batch": 100.0,
    "learning_rate": 4.0,
}


@pytest.mark.parametrize("mechanism", [{"name": "dppl", "rho": 0.5}, DPSGD])
def test_release_members_round_trip_and_hash_their_parameters(
    tmp_path: Path, federation_dict, mechanism: dict[str, object]
) -> None:
    config = FederationConfig.from_dict(federation_dict(mechanism=mechanism))
    assert config.mechanism.name == mechanism["name"]
    config.save(tmp_path / "f.yaml")
    assert FederationConfig.load(tmp_path / "f.yaml").config_hash() == config.config_hash()
    assert '"insecure_noise_seed"' not in config.canonical_json()  # unset: left out, as for confident-gnmax
    bits = FederationConfig.from_dict(federation_dict(mechanism={**mechanism, "fixed_point_bits": 12}))
    assert bits.config_hash() != config.config_hash()


@pytest.mark.parametrize(
    ("mechanism", "match"),
    [
        ({"name": "dppl"}, r"mechanism\.dppl\.rho: Field required"),
        ({"name": "dppl", "rho": 0}, r"mechanism\.dppl\.rho: Input should be greater than 0"),
        ({"name": "dppl", "rho": 1, "metric": "manhattan"}, r"mechanism\.dppl\.metric"),
        ({"name": "dppl", "rho": 1, "sigma1": 2}, r"mechanism\.dppl\.sigma1: Extra inputs"),
        ({**DPSGD, "sampling_rate": 1.5}, r"mechanism\.secagg-dpsgd\.sampling_rate"),
        ({**DPSGD, "rounds": 0}, r"mechanism\.secagg-dpsgd\.rounds"),
        (
            {"name": "laplace", "rho": 1},
            r"'laplace' .* does not match any of the expected tags: 'confident-gnmax'",
        ),
    ],
)
def test_bad_release_members_name_the_field(
    federation_dict, mechanism: dict[str, object], match: str
) -> None:
    with pytest.raises(InputError, match=match):
        FederationConfig.from_dict(federation_dict(mechanism=mechanism))


def test_release_federations_have_no_batches_and_must_fit_the_budget(federation_dict) -> None:
    from capc_common.federation import mechanism_of
    from capc_common.federation.releases import protocol_for

    config = FederationConfig.from_dict(federation_dict(mechanism=DPSGD))
    with pytest.raises(InputError, match="release mechanism 'secagg-dpsgd', which has no query batches"):
        mechanism_of(config)
    assert protocol_for(config, dim=8).rounds == 5
    greedy = FederationConfig.from_dict(federation_dict(mechanism={**DPSGD, "rounds": 100_000}))
    with pytest.raises(InputError, match=r"100000 release\(s\) of RDP .* more than the budget"):
        protocol_for(greedy, dim=8)
