"""The library's layers are one-way: no import cycle among the modules of ``src/capc_common`` and no import of
the services or the command line.

Every import counts, also one inside a function (a lazy import that dodges a cycle at load time is still one),
except imports under ``if TYPE_CHECKING:`` (never executed) and a module importing a package it belongs to
(Python has loaded that package's ``__init__`` before the module anyway).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
FORBIDDEN = ("capc_services", "capc_cli")


def _modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package)}`` of every module under ``root/package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Dotted names a module imports, anywhere in it but under ``if TYPE_CHECKING:``; ``from X import y``
    names ``X.y`` (a submodule, when it is one) and ``X``."""
    names: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if _is_type_checking(node.test):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            names.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)

    Visitor().visit(tree)
    return names


def import_graph(root: Path, package: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(edges between the package's modules, every imported name per module)``.

    An imported name resolves to the longest module of the package it names (``from a.b import c`` is an
    edge to ``a.b.c`` if that is a module, else to ``a.b``); edges to a package the importing module belongs
    to are dropped.
    """
    modules = _modules(root, package)
    edges: dict[str, set[str]] = {}
    raw: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        imported = _imported(ast.parse(path.read_text(), filename=str(path)), name, is_package)
        raw[name] = imported
        targets = set()
        for target in imported:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            own_package = modules.get(target, (path, False))[1] and name.startswith(f"{target}.")
            if target and target != name and not own_package:
                targets.add(target)
        edges[name] = targets
    return edges, raw


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component with more than one
    module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [_cycle_in(set(c), edges) for c in components]


def _cycle_in(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    first = min(component)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges[node] & component):
                if child == first:
                    return [*paths[node], first]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_the_library_has_no_import_cycle() -> None:
    edges, _ = import_graph(SRC, "capc_common")
    assert len(edges) > 100  # the walk saw the library
    found = cycles(edges)
    assert not found, "import cycles in src/capc_common:\n" + "\n".join(" → ".join(c) for c in found)


def test_the_library_never_imports_the_services_or_the_command_line() -> None:
    _, raw = import_graph(SRC, "capc_common")
    bad = sorted(
        f"{module} imports {name}"
        for module, names in raw.items()
        for name in names
        if name.split(".")[0] in FORBIDDEN
    )
    assert not bad, bad


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("b_text", "cyclic"),
    [
        ("def f():\n    from pkg.a import x\n", True),  # a lazy import is still an import
        ("from . import a\n", True),  # relative
        ("import pkg.a\n", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n", False),
        ("from pkg import sub\n", False),  # pkg.sub is a package b does not import a through
        ("import capc_services.x\n", False),  # outside the package: not an edge (the other test's job)
    ],
)
def test_the_walk_sees_every_kind_of_import(tmp_path: Path, b_text: str, cyclic: bool) -> None:
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import y\n",
            "pkg/b.py": b_text,
            "pkg/sub/__init__.py": "from pkg.sub import c\n",  # a package importing its own module: no edge
            "pkg/sub/c.py": "import pkg.sub\n",  # a module importing its own package: no edge
        },
    )
    edges, _ = import_graph(root, "pkg")
    assert edges["pkg.sub"] == {"pkg.sub.c"} and edges["pkg.sub.c"] == set()
    assert cycles(edges) == ([["pkg.a", "pkg.b", "pkg.a"]] if cyclic else [])
