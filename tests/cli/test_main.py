"""The entry point itself: help, version and the documented exit codes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from capc_cli import main as cli_main
from capc_common.errors import BudgetExhaustedError, CapcError, InputError, IntegrityError

REPO = Path(__file__).resolve().parents[2]


def test_help_lists_exit_codes(capc):
    proc = capc("--help")
    assert proc.returncode == 0
    assert "Exit codes" in proc.stdout
    assert "privacy budget exhausted" in proc.stdout


def test_version(capc):
    proc = capc("--version")
    assert proc.returncode == 0
    assert "capc" in proc.stdout


def test_unknown_subcommand_is_bad_input(capc):
    proc = capc("no-such-command")
    assert proc.returncode == 2
    assert "no-such-command" in proc.stderr


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InputError("bad shape"), 2),
        (BudgetExhaustedError("spent"), 3),
        (IntegrityError("chain"), 5),
        (CapcError("other"), 1),
    ],
)
def test_library_errors_map_to_exit_codes(monkeypatch, capsys, error, code):
    @click.command("explode")
    def explode() -> None:
        raise error

    monkeypatch.setitem(cli_main.cli.commands, "explode", explode)
    with pytest.raises(SystemExit) as info:
        cli_main.main(["explode"])
    assert info.value.code == code
    assert str(error) in capsys.readouterr().err


def test_every_subcommand_has_help(capc):
    for name in cli_main.cli.commands:
        proc = capc(name, "--help")
        assert proc.returncode == 0, (name, proc.stderr)
        assert "Usage" in proc.stdout


def test_a_file_this_user_cannot_read_is_bad_input_without_a_traceback(tmp_path, require):
    # A container (uid 10001) reading host files copied as root with mode 600: say who we are and the fix.
    compose_site = (REPO / "deploy" / "compose" / "sites" / "hospital-a.yaml").read_text()
    named = yaml.safe_load(compose_site)["federation"]  # ../federation-<mechanism>.yaml
    federation = tmp_path / Path(named).name
    federation.write_bytes((REPO / "deploy" / "compose" / Path(named).name).read_bytes())
    federation.chmod(0)
    site = tmp_path / "sites" / "hospital-a.yaml"
    site.parent.mkdir()
    site.write_text(compose_site.replace("0.0.0.0", "127.0.0.1"))
    # root reads any file unless it lacks the capabilities that override file modes
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    require(
        not drop or shutil.which("setpriv") is not None,
        "as root this needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE",
    )
    proc = subprocess.run(
        [*drop, sys.executable, "-m", "capc_cli", "teacher", "train", "--site", str(site)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    uid = os.geteuid()
    assert proc.returncode == 2, proc.stderr
    assert (
        f"permission denied: {federation} (this process runs as uid {uid}, gid {os.getegid()})" in proc.stderr
    )
    assert f"chown -R {uid}:" in proc.stderr and "Traceback" not in proc.stderr
