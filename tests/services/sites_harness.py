"""Site and federation builders shared by the service tests (imported by conftest.py and test modules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capc_common.federation import FederationConfig

#: SHA-256 of the shipped scatter-28x28x1 backbone (test_federation_config checks it against the file).
SCATTER_28_SHA256 = "37321d01fe445b050419454cb9d13cd464c867784d435b018816c14dc4e84d8e"


def federation_dict(**overrides: object) -> dict[str, object]:
    """A small, valid federation.yaml as a mapping."""
    base: dict[str, object] = {
        "name": "test",
        "classes": 10,
        "teachers": [{"name": "hospital-a", "heads": 2}, {"name": "hospital-b", "heads": 3}],
        "mechanism": {"threshold": 3, "sigma1": 2.0, "sigma2": 1.0},
        "budget": {"epsilon": 5.0, "delta": 1e-5, "order": 10},
        "queries": {
            "generator": "dead_leaves",
            "seed": 7,
            "total": 64,
            "batch_size": 32,
            "bn_batch": 16,
            "height": 28,
            "width": 28,
            "channels": 1,
        },
        "backbone": {"name": "scatter-28x28x1", "sha256": SCATTER_28_SHA256},
        "quorum": {"min_parties": 2, "vote_deadline_s": 5, "share_deadline_s": 5},
    }
    base.update(overrides)
    return base


def funded_config(**mechanism: object) -> FederationConfig:
    """A federation whose budget pays for its batches (party start-up tests); ``mechanism`` adds fields."""
    return FederationConfig.from_dict(
        federation_dict(
            mechanism={"threshold": 3, "sigma1": 2.0, "sigma2": 1.5, **mechanism},
            budget={"epsilon": 300.0, "delta": 1e-5, "order": 10},
        )
    )


def guardian_settings(pki: Path, tmp_path: Path, token_file: Path, federation: Path, **site: Any) -> Any:
    """A guardian's site settings on loopback ports chosen by the OS (``site`` overrides fields)."""
    from capc_services.guardian.settings import GuardianSettings

    base = {
        "party": "guardian",
        "federation": federation,
        "tls": {"ca": pki / "ca.crt", "cert": pki / "guardian.crt", "key": pki / "guardian.key"},
        "admin": {"bind": "127.0.0.1:0", "token_file": token_file},
        "grpc": {"bind": "127.0.0.1:0"},
        "ledger": tmp_path / "ledger.sqlite",
    }
    return GuardianSettings(**{**base, **site})


def teacher_settings(tmp: Path, federation: Path, data: dict[str, Any], **site: Any) -> Any:
    """hospital-a's site settings for training (paths under ``tmp``; ``site`` overrides fields)."""
    from capc_services.teacher.settings import TeacherSettings

    base = {
        "party": "hospital-a",
        "federation": federation,
        "tls": {"ca": tmp / "ca.pem", "cert": tmp / "a.pem", "key": tmp / "a.key"},
        "admin": {"token_file": tmp / "token"},
        "student_address": "127.0.0.1:1",
        "guardian_address": "127.0.0.1:2",
        "heads": tmp / "heads.safetensors",
        "cap": {"epsilon": 10.0, "record": tmp / "cap.jsonl"},
        "data": data,
    }
    return TeacherSettings(**{**base, **site})
