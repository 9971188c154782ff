"""Party start-up on real processes (``benchmarks/startup.py``'s counting run): the guardian never imports
torch and the student does not before it trains."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from startup import one_run, prepare  # the benchmark's own measurement


def test_the_guardian_and_the_student_start_without_torch(tmp_path: Path) -> None:
    layout, parties, admin = prepare(tmp_path / "state", heads=2, train=False)
    figures = one_run(layout, parties, admin, count_modules=True, timeout=120, roles=("guardian", "student"))
    for role in ("guardian", "student"):
        assert not figures[f"{role}_imports_torch"]
        # The count sees what the party does import: its admin API and its numerics.
        assert figures[f"{role}_modules"] > 500
        assert figures[f"{role}_ready_s"] > 0 and figures[f"{role}_cpu_s"] > 0
