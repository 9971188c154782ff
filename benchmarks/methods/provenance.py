"""Which code computed a row: a fingerprint of the sources every figure depends on.

A results table is honest only if all its rows come from one version of the code: a row computed before a
fix and a row after it are different experiments. Every row of the joining benchmark carries
:func:`code_hash`; the tables, the export for ``capc federation plan`` and the README figures refuse rows of
more than one (:func:`one_code`), so a change to a mechanism, a trainer or this benchmark means running the
figures again, not mixing them.

The fingerprint is of what the code *does*: each Python module's syntax tree without its docstrings (comments
are not in the tree), so editing documentation does not invalidate a grid, while any change of behaviour does.
It covers the library (``src/capc_common``) except the modules that only read the measurements (the plan's
predictor: it does not compute them), this benchmark and its methods, and the pipeline configs.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What the figures depend on (relative to the repository).
SOURCES = (
    "src/capc_common",
    "benchmarks/joining.py",
    "benchmarks/mechanisms.py",
    "benchmarks/_baselines.py",
    "benchmarks/_flower_app.py",
    "benchmarks/methods",
    "configs",
)
#: Library modules that read the measurements but never compute them.
READERS = ("src/capc_common/federation/recommend.py", "src/capc_common/federation/forecast.py")


def _stripped(source: str) -> str:
    """The module's syntax tree without docstrings, as text."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def _files(root: Path) -> Iterable[Path]:
    for name in SOURCES:
        path = root / name
        if path.is_file():
            yield path
        else:
            yield from sorted(p for p in path.rglob("*") if p.suffix in (".py", ".yaml") and p.is_file())


def code_hash(root: Path = ROOT) -> str:
    """12 hex digits of SHA-256 over every source's path and behaviour (:data:`SOURCES` minus
    :data:`READERS`)."""
    digest = hashlib.sha256()
    for path in _files(root):
        relative = path.relative_to(root).as_posix()
        if relative in READERS or "__pycache__" in relative:
            continue
        text = path.read_text(encoding="utf-8")
        digest.update(relative.encode() + b"\0")
        digest.update((_stripped(text) if path.suffix == ".py" else text).encode() + b"\0")
    return digest.hexdigest()[:12]


def one_code(rows: Iterable[Mapping[str, object]], *, what: str) -> str:
    """The one code hash of ``rows`` (empty string for no rows).

    Raises:
        SystemExit: the rows come from more than one version of the code (or carry none); the message says
            how many of each and what to do.
    """
    counts: dict[str, int] = {}
    for row in rows:
        code = str(row.get("code") or "none recorded")
        counts[code] = counts.get(code, 0) + 1
    if len(counts) > 1:
        listed = ", ".join(f"{n} rows of {c}" for c, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        raise SystemExit(
            f"{what} would mix rows of different code ({listed}; this code is {code_hash()}): run the "
            "figures again at one code (move the old CSV away, or --fresh)"
        )
    return next(iter(counts), "")
