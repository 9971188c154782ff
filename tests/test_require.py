"""``require`` (tests/conftest.py): CI cannot go green by skipping (issue 27.5). Where what a test needs is
missing, it skips with the reason locally and fails with the reason under ``CI=true``; the container tests
are the real case, checked end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
Require = Callable[[bool, str], None]


def test_a_condition_that_holds_lets_the_test_go_on(
    require: Require, monkeypatch: pytest.MonkeyPatch
) -> None:
    for ci in ("true", ""):
        monkeypatch.setenv("CI", ci)
        assert require(True, "never said") is None


def test_locally_a_missing_requirement_skips_with_its_reason(
    require: Require, monkeypatch: pytest.MonkeyPatch
) -> None:
    for ci in (None, "", "false", "0"):
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        with pytest.raises(pytest.skip.Exception, match="no browser here"):
            require(False, "no browser here")


def test_under_ci_a_missing_requirement_fails_with_its_reason(
    require: Require, monkeypatch: pytest.MonkeyPatch
) -> None:
    for ci in ("true", "TRUE", "True "):
        monkeypatch.setenv("CI", ci)
        with pytest.raises(pytest.fail.Exception, match="CI=true requires it: no Docker engine"):
            require(False, "no Docker engine")


def _container_tests(ci: str | None) -> subprocess.CompletedProcess[str]:
    """The container tests where the engine is refused on purpose (``CAPC_SKIP_DOCKER=1``)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["CAPC_SKIP_DOCKER"] = "1"
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n0", "-p", "no:randomly", "-p", "no:cacheprovider", "-rsE",
         "-q", "tests/deploy"],
        capture_output=True, text=True, timeout=240, env=env, cwd=REPO, check=False,
    )  # fmt: skip


def test_the_container_tests_skip_locally_and_fail_under_ci() -> None:
    local = _container_tests(None)
    assert local.returncode == 0, local.stdout[-3000:]
    assert "6 skipped" in local.stdout and "CAPC_SKIP_DOCKER=1" in local.stdout, local.stdout[-3000:]
    ci = _container_tests("true")
    assert ci.returncode == 1, ci.stdout[-3000:]
    assert "6 error" in ci.stdout, ci.stdout[-3000:]
    assert "CI=true requires it: CAPC_SKIP_DOCKER=1" in ci.stdout, ci.stdout[-3000:]
