"""What the guardian checks before it serves anything: a ledger that fails verification is refused."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from capc_common.errors import IntegrityError
from capc_services.guardian.app import open_ledger, serve
from capc_services.guardian.settings import GuardianSettings


def _settings(pki: Path, tmp_path: Path, token_file: Path, federation: Path) -> GuardianSettings:
    return GuardianSettings(
        party="guardian",
        federation=federation,
        tls={"ca": pki / "ca.crt", "cert": pki / "guardian.crt", "key": pki / "guardian.key"},
        admin={"bind": "127.0.0.1:0", "token_file": token_file},
        grpc={"bind": "127.0.0.1:0"},
        ledger=tmp_path / "ledger.sqlite",
    )


def test_a_ledger_with_edited_totals_is_refused_at_start(
    pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path
) -> None:
    """The campaign's attack: `UPDATE state SET spent_units=0` on the guardian's ledger, then a restart."""
    settings = _settings(pki, tmp_path, token_file, funded_federation)
    with open_ledger(settings) as ledger:
        ledger.reserve(
            "b1", queries=16, parties=["hospital-a"], mechanism="confident-gnmax", params={},
            worst_case_rdp=1.0, actor="student",
        )  # fmt: skip
        ledger.settle("b1", answered=16, actual_rdp=0.5, actor="guardian")
    raw = sqlite3.connect(settings.ledger, isolation_level=None)
    raw.execute("DROP TRIGGER state_follows_entries")
    raw.execute("UPDATE state SET spent_units = 0")
    raw.close()
    stop = threading.Event()
    stop.set()
    with pytest.raises(
        IntegrityError, match=r"failed verification.*stored totals differ.*capc budget verify"
    ):
        serve(settings, stop=stop)
