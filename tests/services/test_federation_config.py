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
