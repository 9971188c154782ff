"""Entry point of the ``capc`` command.

Subcommands live one module per area in ``capc_cli.commands``; each module exposes a ``click`` command or
group named ``command``, discovered here, so adding an area never means editing this file. Modules keep
heavy imports (torch, grpc) inside their functions so ``capc --help`` stays fast.

Exit codes (documented in ``capc --help`` and docs/cli.md):
    0 ok · 1 internal error · 2 bad input · 3 privacy budget exhausted · 4 peer or service unavailable ·
    5 integrity check failed · 6 protocol error · 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import click

from capc_cli import commands
from capc_common import __version__
from capc_common.errors import CapcError, InputError

EXIT_CODES = """\b
Exit codes:
  0  ok
  1  internal error (a bug: please report it)
  2  bad input (wrong option, missing/corrupt file, inconsistent shapes)
  3  privacy budget exhausted
  4  a peer or service is unavailable
  5  integrity check failed (ledger chain, checksum)
  6  protocol error from a peer
  130 interrupted
"""


@click.group(epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="capc")
def cli() -> None:
    """DIET-CaPC: private collaborative learning without public data."""


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        cli.add_command(module.command)


_register_commands()


def _permission_message(exc: PermissionError) -> str:
    """Which file could not be opened, as whom, and the fix (no traceback)."""
    uid, gid = os.geteuid(), os.getegid()
    return (
        f"permission denied: {exc.filename or exc} (this process runs as uid {uid}, gid {gid}). Make the "
        f"file and its directories readable (state directories writable) by uid {uid}, e.g. on the host of a "
        f"container: chown -R {uid}:{gid} DIR (keys and tokens stay mode 600)."
    )


def main(argv: list[str] | None = None) -> None:
    """Run the CLI, mapping library errors to their documented exit codes and a one-line message."""
    try:
        # In non-standalone mode click returns the exit code of ``--help``/``--version`` (an int) or the
        # command's return value (None for every capc command).
        rv = cli.main(args=argv, prog_name="capc", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError | click.BadParameter) else exc.exit_code)
    except CapcError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except PermissionError as exc:
        # Typically a container (uid 10001) reading host files mounted with the host's owner and mode.
        click.echo(f"error: {_permission_message(exc)}", err=True)
        sys.exit(InputError.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except SystemExit:
        raise
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
