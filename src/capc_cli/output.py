"""Output helpers shared by every subcommand: ``--format text|json`` and progress bars.

JSON output is one object on stdout and nothing else (progress and logs go to stderr), so a program can
always ``json.loads`` the whole of stdout.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text for people, json (one object on stdout) for programs.",
)


def _jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats into plain JSON values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def emit(result: dict[str, Any], fmt: str, text: Callable[[dict[str, Any]], str] | None = None) -> None:
    """Print ``result`` as one JSON object, or as text (``text(result)`` or an aligned key/value listing)."""
    if fmt == "json":
        click.echo(json.dumps(_jsonable(result), indent=None, sort_keys=False))
        return
    if text is not None:
        click.echo(text(result))
        return
    width = max((len(k) for k in result), default=0)
    for key, value in result.items():
        click.echo(f"{key:<{width}}  {_jsonable(value)}")


def epsilon_text(summary: dict[str, Any]) -> str:
    """``ε spent S of L = settled A + reserved B``, from a ledger summary (``capc budget show``, ``capc local
    status``): settled ε never falls, while the reserved part (open worst-case reservations) falls back as
    batches settle below it, so the two are shown apart and the total alone never reads as ε going down."""
    return (
        f"ε spent {summary['epsilon_spent']:.4f} of {summary['epsilon_limit']:g} = settled "
        f"{summary['epsilon_settled']:.4f} + reserved {summary['epsilon_reserved']:.4f}"
    )


def progress(
    iterable: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it"
) -> Iterator[T]:
    """Wrap ``iterable`` in a progress bar on stderr.

    Progress always goes to stderr so ``--format json`` output on stdout stays machine-readable.
    """
    from tqdm import tqdm

    yield from tqdm(
        iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False
    )


def file_option(*names: str, help: str, required: bool = True) -> Callable[[F], F]:
    """A ``click`` option naming one file (``Path``; a directory is refused)."""
    return click.option(
        *names, type=click.Path(dir_okay=False, path_type=Path), required=required, default=None, help=help
    )


def ca_option() -> Callable[[F], F]:
    """``--ca``: the federation CA certificate an ``https://`` admin API presents a certificate of."""
    return file_option(
        "--ca",
        required=False,
        help="The federation's ca.crt, to verify an https:// admin API (http:// is only for this machine).",
    )
