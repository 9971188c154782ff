"""Package attributes that import their submodule on first use (PEP 562), for packages whose front door would
otherwise import torch for every caller: a guardian that only checks a checkpoint file, a benchmark that only
reads cached features."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``name`` is imported from the submodule ``homes[name]``
    when it is first asked for, then kept in the package's ``namespace`` (its ``globals()``)."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
