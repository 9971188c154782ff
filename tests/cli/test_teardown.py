"""The ``capc`` process ends without the interpreter's teardown, after every exit handler, with its status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from capc_cli.main import _is_this_process
from capc_cli.teardown import exit_status

# A module global whose finaliser marks the file when the interpreter tears the module down, and an exit
# handler that marks it when exit handlers run. ``{body}`` runs after both exist.
SCRIPT = """
import atexit, os, sys
fd = os.open({marks!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
class Finalised:
    def __init__(self, write, fd):
        self.write, self.fd = write, fd
    def __del__(self):
        self.write(self.fd, b"torn down\\n")
finalised = Finalised(os.write, fd)
{body}
"""


def run(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    marks = tmp_path / "marks"
    code = SCRIPT.format(marks=str(marks), body=textwrap.dedent(body))
    # buffered stdout, as a party's log file is (this project's machines and image set PYTHONUNBUFFERED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    return proc, marks.read_text().splitlines() if marks.exists() else []


def test_the_capc_process_skips_the_teardown_and_keeps_its_status(tmp_path: Path) -> None:
    proc, marks = run(
        tmp_path,
        """
        sys.argv = ["/usr/local/bin/capc", "--version"]
        from capc_cli.main import main
        main()
        """,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("capc, version")
    assert marks == []  # no teardown
    proc, marks = run(
        tmp_path,
        """
        sys.argv = ["/usr/local/bin/capc", "budget", "show", "--ledger", "/nonexistent/ledger.sqlite"]
        from capc_cli.main import main
        main()
        """,
    )
    assert proc.returncode == 2 and "no budget ledger" in proc.stderr and marks == []


def test_handlers_registered_after_arming_run_and_output_is_flushed(tmp_path: Path) -> None:
    proc, marks = run(
        tmp_path,
        """
        from capc_cli import teardown
        teardown.arm()
        atexit.register(lambda: os.write(fd, b"handler\\n"))
        print("buffered line", end="")  # still in sys.stdout's buffer when the process ends
        teardown.exiting_with(3)
        raise SystemExit(3)
        """,
    )
    assert proc.returncode == 3 and proc.stdout == "buffered line"
    assert marks == ["handler"]


@pytest.mark.parametrize(
    "body",
    [
        # the CLI called inside another program (a test, a notebook): that program's exit is its own
        'from capc_cli.main import main\ntry:\n    main(["--version"])\nexcept SystemExit:\n    pass',
        # armed, but the process ends by an uncaught exception: no status recorded, the usual teardown
        'from capc_cli import teardown\nteardown.arm()\nraise RuntimeError("boom")',
    ],
)
def test_the_teardown_runs_when_not_armed_or_no_status(tmp_path: Path, body: str) -> None:
    proc, marks = run(tmp_path, body)
    assert marks == ["torn down"]
    assert proc.returncode == (1 if "boom" in body else 0)


def test_a_handler_registered_before_the_cli_disarms_it(tmp_path: Path) -> None:
    # e.g. a sitecustomize's (coverage, tracing): skipping the teardown would skip it too
    proc, marks = run(
        tmp_path,
        """
        atexit.register(lambda: os.write(fd, b"handler\\n"))
        sys.argv = ["/usr/local/bin/capc", "--version"]
        from capc_cli.main import main
        main()
        """,
    )
    assert proc.returncode == 0 and marks == ["handler", "torn down"]


def test_importing_the_cli_registers_no_exit_handler() -> None:
    code = "import atexit, capc_cli.main; print(atexit._ncallbacks())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr


def test_only_the_capc_process_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    for entry, armed in [
        ("/opt/venv/bin/capc", True),  # the console script (the image's entrypoint, `make demo`)
        ("/src/capc_cli/__main__.py", True),  # python -m capc_cli: every party of a local federation
        ("/src/capc_cli/main.py", False),
        ("/venv/bin/pytest", False),
    ]:
        monkeypatch.setattr(sys, "argv", [entry, "--version"])
        assert _is_this_process(None) is armed, entry
        assert _is_this_process(["--version"]) is False  # the CLI called inside another program


def test_exit_status_follows_python() -> None:
    codes = (None, 0, 2, 130, 256 + 3, -1, 2**70, "message")
    assert [exit_status(c) for c in codes] == [0, 0, 2, 130, 3, 255, 255, 1]
