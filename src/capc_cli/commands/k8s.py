"""``capc k8s``: check a Kubernetes kustomization of ``deploy/k8s`` before applying it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, format_option


@click.group("k8s")
def command() -> None:
    """Kubernetes: check a kustomization (deploy/k8s) before `kubectl apply -k`."""


def _check_text(result: dict[str, Any]) -> str:
    if not result["problems"]:
        return f"ok: {result['directory']} is ready for `kubectl apply -k {result['directory']}`"
    lines = [
        f"{result['directory']} is not ready for `kubectl apply -k` ({len(result['problems'])} problems):"
    ]
    for problem in result["problems"]:
        lines += [f"  ✗ {problem['what']}", f"      fix: {problem['fix']}"]
    return "\n".join(lines)


@command.command("check")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@format_option
def check(directory: Path, fmt: str) -> None:
    """List what DIRECTORY's kustomization lacks, each with its fix; exit 2 if anything does.

    Every file its ConfigMap and Secret generators read (certificates, keys, admin token, federation.yaml;
    `kubectl kustomize` stops at the first missing one with a bare path), an `images:` entry naming the
    example's placeholder registry or a moving tag, and a teacher site file without data.sha256.
    """
    from dataclasses import asdict

    from capc_common.errors import InputError
    from capc_services.k8s import check_kustomization

    problems = check_kustomization(directory)
    emit({"directory": str(directory), "problems": [asdict(p) for p in problems]}, fmt, _check_text)
    if problems:
        raise InputError(
            f"{len(problems)} problems in {directory}; fix them, then run `capc k8s check` again"
        )
