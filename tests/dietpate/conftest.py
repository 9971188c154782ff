"""A tiny run configuration on scikit-learn's 8×8 digits that finishes in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml


def tiny_config(out: Path, **overrides: Any) -> dict[str, Any]:
    """A small but complete DIET-PATE run: 10 teachers on digits, 128 dead-leaves queries."""
    config: dict[str, Any] = {
        "name": "digits-tiny",
        "seed": 0,
        "dataset": {"name": "digits"},
        "teachers": {"count": 10, "l2": 0.01, "max_iter": 50},
        "backbone": {"bn_batch": 16},
        "queries": {"generator": "dead_leaves", "batch_size": 32, "max_queries": 128},
        "mechanism": {"threshold": 6, "sigma1": 3, "sigma2": 2, "noise_seed": "tiny-run"},
        "budget": {"epsilon": 40},
        "student": {"eval_bn_batch": 16, "curve_points": 1, "l2_grid": [0.01, 0.1], "max_iter": 50},
        "output": str(out),
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    return config


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny problems run faster on one intra-op thread, especially on a shared, busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def write_config(tmp_path: Path):
    def _write(**overrides: Any) -> Path:
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(tiny_config(tmp_path / "out", **overrides)))
        return path

    return _write
