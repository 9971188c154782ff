"""The examples in the analysis modules' docstrings run and give what they claim."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "capc_common.privacy.analysis.composition",
    "capc_common.privacy.analysis.conversion",
    "capc_common.privacy.analysis.curves",
    "capc_common.privacy.analysis.discrete_gaussian",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
