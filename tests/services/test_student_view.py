"""The guardian's relay of the student's admin API: never an error page, always why it is unreachable."""

from __future__ import annotations

from pathlib import Path

from capc_services.guardian.settings import StudentAdminSettings
from capc_services.guardian.student_view import StudentView
from capc_services.local.provision import free_port


def test_not_configured_missing_token_and_nobody_listening(tmp_path: Path, token_file: Path) -> None:
    assert StudentView(None).read() == {
        "reachable": False,
        "error": "the guardian's site file has no student_admin: {url, token_file}",
    }
    url = f"http://127.0.0.1:{free_port()}"
    missing = StudentView(StudentAdminSettings(url=url, token_file=tmp_path / "none.token")).read()
    assert missing["reachable"] is False and "student admin token" in missing["error"]
    away = StudentView(StudentAdminSettings(url=url, token_file=token_file), timeout=1).read()
    assert away["reachable"] is False and away["url"] == url and "ConnectError" in away["error"]
