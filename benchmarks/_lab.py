"""What the benchmarks that run a federation behind the link lab share: how to ask for its namespaces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

#: ``--namespaces`` → ``LinkLab(namespaces=…)``: where permitted, required (else fail), or loopback.
NAMESPACES: dict[str, bool | None] = {"auto": None, "require": True, "off": False}


def namespaces_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--namespaces auto|require|off`` option."""
    return click.option(
        "--namespaces",
        type=click.Choice(sorted(NAMESPACES)),
        default="auto",
        show_default=True,
        help="Parties in network namespaces where permitted (auto), or else fail (require), or on loopback.",
    )(function)
