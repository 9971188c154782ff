"""The admin token never crosses a network in cleartext: the CLI and the guardian's relay refuse ``http://``
to any host but this machine before they connect (the addresses below are unroutable: a connection attempt
would hang, not fail)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from capc_cli.main import main
from capc_common.errors import InputError
from capc_services.common.admin_client import admin_client
from capc_services.guardian.settings import GuardianSettings

REPO = Path(__file__).resolve().parents[2]
FEDERATION = REPO / "deploy" / "compose" / "federation-confident-gnmax.yaml"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "guardian.token"
    path.write_text("g" * 43)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    ("host", "command"),
    [
        ("192.0.2.10", ("budget", "watch", "--url", "http://192.0.2.10:8080", "--count", "1")),
        (
            "guardian.example",
            ("guardian", "membership", "--url", "http://guardian.example:8080/", "--federation"),
        ),
    ],
    ids=["budget-watch", "guardian-membership"],
)
def test_the_cli_refuses_to_send_the_token_over_http_to_another_machine(
    capsys: pytest.CaptureFixture[str], token_file: Path, host: str, command: tuple[str, ...]
) -> None:
    args = [*command, str(FEDERATION)] if command[-1] == "--federation" else list(command)
    start = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        main([*args, "--token-file", str(token_file)])  # the `capc` entry point, in this process
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, stderr
    assert f"refusing to send an admin token to {host} over plain HTTP" in stderr
    assert "use https://" in stderr and "Traceback" not in stderr
    assert time.monotonic() - start < 10  # refused before any connection attempt


def test_the_dashboard_relay_refuses_a_student_over_http_on_another_machine(tmp_path: Path) -> None:
    site = {
        "party": "guardian",
        "federation": str(FEDERATION),
        "tls": {"ca": "ca.crt", "cert": "g.crt", "key": "g.key"},
        "admin": {"bind": "127.0.0.1:8080", "token_file": "guardian.token"},
        "ledger": "ledger.sqlite",
    }
    path = tmp_path / "guardian.yaml"
    for url, refused in (
        ("http://student:8080", True),
        ("http://10.0.0.7:8080", True),
        ("https://student:8080", False),
        ("http://127.0.0.1:8082", False),
        ("http://[::1]:8082", False),
    ):
        path.write_text(
            yaml.safe_dump({**site, "student_admin": {"url": url, "token_file": "student.token"}})
        )
        if refused:
            with pytest.raises(InputError, match=r"refusing to send an admin token .* over plain HTTP"):
                GuardianSettings.load(path)
        else:
            assert GuardianSettings.load(path).student_admin.url == url  # type: ignore[union-attr]


def test_an_admin_client_takes_http_only_to_this_machine() -> None:
    with pytest.raises(InputError, match="over plain HTTP"):
        admin_client("http://192.0.2.10:8080", token="t" * 40)
    for url in ("http://localhost:1", "http://127.0.0.2:1", "https://192.0.2.10:1"):
        admin_client(url, token="t" * 40).close()
