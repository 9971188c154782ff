"""Shared fixtures: running the real ``capc`` entry point in a subprocess; one torch thread; ``require``, the
one way a test depends on what the machine provides. The suite's order for two workers (``make test`` runs
``pytest -n 2 --dist loadscope``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The longest modules, longest first (a worker's seconds in each, measured in `make test` on 2026-12-03:
#: 223, 131, 106, 73, 62, 62, 61, 59, 39, 34, 34; alone with -n 0 on 2026-12-05, under load: test_restarts.py
#: 160, test_links.py 80, once a guardian's and a teacher's start no longer took minutes), started first so
#: that the two workers finish together instead of one running a long module alone at the end
#: (longest-processing-time-first scheduling).
LONGEST = (
    "tests/benchmarks/test_smoke.py",
    "tests/deploy/test_compose_federation.py",
    "tests/e2e/test_restarts.py",
    "tests/e2e/test_links.py",
    "tests/e2e/test_release_federation.py",
    "tests/e2e/test_membership.py",
    "tests/services/test_dashboard.py",
    "tests/cli/test_demo.py",
    "tests/e2e/test_federation.py",
    "tests/mechanisms/test_benchmark.py",
    "tests/deploy/test_image.py",
    "tests/e2e/test_prom_pate.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first, then the other modules holding slow or container tests, then the rest; within
    a module the written order (module-scoped fixtures and ``--dist loadscope`` keep a module together)."""
    heavy = {
        item.nodeid.split("::")[0]
        for item in items
        if item.get_closest_marker("slow") or item.get_closest_marker("docker")
    }

    def rank(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::")[0]
        if module in LONGEST:
            return (0, LONGEST.index(module))
        return (1 if module in heavy else 2, 0)

    items.sort(key=rank)


Require = Callable[[bool, str], None]


def _require(condition: bool, reason: str) -> None:
    """Go on if ``condition`` holds; else skip the test with ``reason`` — or, under ``CI=true``, fail it.

    CI must not go green by skipping: where the Docker engine cannot start, Chromium or Flower's virtualenv
    is missing, the tests that need them would otherwise skip and ``make test`` pass. Locally a skip still
    says why.
    """
    if condition:
        return
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"CI=true requires it: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def require() -> Require:
    """``require(condition, reason)``: every test that needs something of the machine (a Docker engine, a
    browser, a dependency, root) asks through it, never through a bare skip."""
    return _require


def run_capc(
    *args: str,
    check: bool = False,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m capc_cli ARGS`` as a real process and capture its output."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "capc_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"capc {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def capc() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_capc


@pytest.fixture
def capc_json() -> Callable[..., Any]:
    """Run capc with ``--format json`` appended and parse its stdout as one JSON object."""

    def _run(*args: str, **kwargs: Any) -> Any:
        proc = run_capc(*args, "--format", "json", check=True, **kwargs)
        return json.loads(proc.stdout)

    return _run


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Small torch problems on one intra-op thread: on a shared, busy machine two threads spin against each
    other (measured: prompted-teacher training 3.8 s on one thread, 54 s on two, at load 8)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
