"""The entry point itself: help, version and the documented exit codes."""

from __future__ import annotations

import click
import pytest

from capc_cli import main as cli_main
from capc_common.errors import BudgetExhaustedError, CapcError, InputError, IntegrityError


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
