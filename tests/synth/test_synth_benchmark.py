"""``benchmarks/synth.py`` keeps its interface: one JSON object, one entry per generator and size, a CSV."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from capc_common.synth import GENERATOR_NAMES

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "synth.py"


def test_json_output_and_csv(tmp_path):
    table = tmp_path / "synth.csv"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--format",
            "json",
            "--count",
            "16",
            "--repeats",
            "1",
            "--csv",
            str(table),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    sizes = ("28x28x1", "32x32x3")
    assert list(result) == [f"{g}@{s}" for g in GENERATOR_NAMES for s in sizes]
    for key, entry in result.items():
        assert set(entry) == {"images_per_s", "size"} and key.endswith(f"@{entry['size']}")
        assert entry["images_per_s"] > 0
    with table.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["generator"], r["size"]) for r in rows] == [(g, s) for g in GENERATOR_NAMES for s in sizes]
