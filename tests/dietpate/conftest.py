"""A tiny run configuration on scikit-learn's 8×8 digits that finishes in seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
        "teachers": {"count": 10},
        "backbone": {"bn_batch": 16},
        "queries": {"generator": "dead_leaves", "batch_size": 32, "max_queries": 128},
        "mechanism": {"threshold": 6, "sigma1": 3, "sigma2": 2, "noise_seed": "tiny-run"},
        "budget": {"epsilon": 40},
        "student": {"eval_bn_batch": 16, "curve_points": 1},
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


def write_tiny_config(path: Path, out: Path, **overrides: Any) -> Path:
    """Write :func:`tiny_config` with ``overrides`` to ``path``."""
    path.write_text(yaml.safe_dump(tiny_config(out, **overrides)))
    return path


@pytest.fixture
def write_config(tmp_path: Path):
    def _write(**overrides: Any) -> Path:
        return write_tiny_config(tmp_path / "run.yaml", tmp_path / "out", **overrides)

    return _write


#: Overrides the shared command-line run is started with (checked against its report).
CLI_OVERRIDES = {"epsilon": 30.0, "teachers": 8, "seed": 1}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real ``capc dietpate run`` (a subprocess) shared by a module's tests: its config, report, output
    and cache directories. The config asks for extra curve points; the CLI overrides ε, teachers and seed."""
    root = tmp_path_factory.mktemp("cli-run")
    config = write_tiny_config(
        root / "run.yaml",
        root / "ignored",
        mechanism={"threshold": 5, "sigma1": 5, "sigma2": 4},  # 8 teachers: ε 30 asks all 128 queries
        student={"curve_epsilons": [15.0, 20.0, 50.0]},
    )
    out, cache = root / "out", root / "cache"
    args = [f"--{k}={v}" for k, v in CLI_OVERRIDES.items()]
    command = ["dietpate", "run", "--config", str(config), *args, "--output", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "capc_cli", *command, "--cache-dir", str(cache), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # tiny problems: threads only contend on 2 cores
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    return {"config": config, "report": report, "out": out, "cache": cache, "overrides": CLI_OVERRIDES}
