"""Fixtures of the 2PC tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mpc_harness import SessionPair, open_pair

from capc_common.mpc import MpcConfig


@pytest.fixture
def pair_factory() -> Iterator[Callable[..., SessionPair]]:
    pairs: list[SessionPair] = []

    def _make(config: MpcConfig, **kwargs: Any) -> SessionPair:
        pair = open_pair(config, **kwargs)
        pairs.append(pair)
        return pair

    yield _make
    for pair in pairs:
        pair.garbler.close()
        pair.evaluator.close()
