"""Fixtures for end-to-end tests: the central reference run (real processes are in each test)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import yaml
from federation_harness import CENTRAL


@pytest.fixture(scope="session")
def central(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`capc dietpate run` on the central config: its report, released labels and teacher heads."""
    root = tmp_path_factory.mktemp("central")
    config = root / "run.yaml"
    config.write_text(yaml.safe_dump({**CENTRAL, "output": str(root / "out")}))
    proc = subprocess.run(
        [sys.executable, "-m", "capc_cli", "dietpate", "run", "--config", str(config), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    released = np.load(root / "out" / "labels.npz")
    return {
        "report": report,
        "labels": released["label"],
        "batch_ends": released["batch_end"].tolist(),
        "teachers": root / "out" / "teachers.safetensors",
    }
