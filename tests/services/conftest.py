"""Fixtures for the services: a federation config, a CA with party certificates, site files."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_parties import LiveParties
from live_parties import start as start_live_parties
from sites_harness import federation_dict, funded_config

from capc_common.federation import FederationConfig
from capc_services.tls import init_ca, issue_certificate

PARTIES = ("guardian", "student", "hospital-a", "hospital-b")


@pytest.fixture(name="federation_dict")
def _federation_dict() -> object:
    """The :func:`federation_dict` factory, for tests that vary a field."""
    return federation_dict


@pytest.fixture
def federation(tmp_path: Path) -> tuple[FederationConfig, Path]:
    config = FederationConfig.from_dict(federation_dict())
    path = tmp_path / "federation.yaml"
    config.save(path)
    return config, path


@pytest.fixture
def funded_federation(tmp_path: Path) -> Path:
    """The saved federation.yaml of :func:`funded_config`."""
    path = tmp_path / "federation.yaml"
    funded_config().save(path)
    return path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and certificates for every test party, plus 'intruder' from a foreign CA."""
    root = tmp_path_factory.mktemp("pki")
    init_ca(root, name="test")
    for party in (*PARTIES, "outsider"):
        issue_certificate(root, party, out_dir=root)
    foreign = root / "foreign"
    init_ca(foreign, name="foreign")
    issue_certificate(foreign, "student", out_dir=foreign)
    return root


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin.token"
    path.write_text(secrets.token_urlsafe(32))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def live_parties(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveParties]:
    """A real guardian and student process (see ``live_parties.py``), shared by the modules that need them."""
    running = start_live_parties(tmp_path_factory.mktemp("live") / "federation")
    yield running
    running.close()
