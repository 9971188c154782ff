"""Fixtures for the container tests: a Docker engine for the session and the project's image built on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from docker_harness import Engine, build_image, engine_or_skip_reason


@pytest.fixture(scope="session")
def engine(
    tmp_path_factory: pytest.TempPathFactory, require: Callable[[bool, str], None]
) -> Iterator[Engine]:
    """A running Docker engine; where none can be started the test skips with the reason (fails under
    ``CI=true``)."""
    found = engine_or_skip_reason(tmp_path_factory.mktemp("dockerd") / "dockerd.log")
    require(not isinstance(found, str), str(found))
    assert isinstance(found, Engine)
    yield found
    found.stop()


@pytest.fixture(scope="session")
def image(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The image built from this checkout (its tag, base image, build seconds and size)."""
    built = build_image(engine, tmp_path_factory.mktemp("build") / "docker-build.log")
    print(
        f"\nimage diet-capc:latest on {built['base']}: built in {built['build_s']} s, {built['size_mb']} MB"
    )
    return built
