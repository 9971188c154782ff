"""Party start-up on real processes (``benchmarks/startup.py``'s counting run, at toy size): the guardian
never imports torch and the student does not before it trains, while the teacher loads its model at start."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from startup import ROLES, one_run, prepare  # the benchmark's own measurement


def test_the_guardian_and_the_student_start_without_torch(tmp_path: Path) -> None:
    layout, parties, admin = prepare(tmp_path / "state", heads=2)
    figures = one_run(layout, parties, admin, count_modules=True, timeout=120)
    assert not figures["guardian_imports_torch"]
    assert not figures["student_imports_torch"]
    # The teacher votes with its backbone from the start: the same count sees torch there.
    assert figures["teacher_imports_torch"]
    assert figures["guardian_modules"] < figures["teacher_modules"]
    for role in ROLES:
        assert figures[f"{role}_ready_s"] > 0 and figures[f"{role}_cpu_s"] > 0
