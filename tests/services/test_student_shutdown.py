"""The selection student's work thread ends visibly. SIGTERM while it trains: it stops within seconds (labels
stay in the store; training reruns). Publishing fails for a reason that is not a CapcError (an OSError: its
output directory cannot be made): progress and readiness say ``failed`` with the reason and the log has the
traceback (it used to catch CapcError alone, so the thread ended and the student said "training" for ever); a
one-shot student (``exit_when_done``) that fails exits with its failure's code (2 here), not 0."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from student_memory import labelled_student, student_command  # a benchmark's helpers

from capc_services.local.layout import Layout
from capc_services.local.processes import token


class Student:
    """The student of a provisioned layout, started as ``capc local up`` starts it (its log in the layout)."""

    def __init__(self, layout: Layout) -> None:
        site = yaml.safe_load(layout.site("student").read_text())
        self.admin = f"http://{site['admin']['bind']}"
        self.headers = {"Authorization": f"Bearer {token(layout, 'student')}"}
        self.log = layout.root / "student.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                student_command(layout),
                cwd=layout.root,
                stdout=out,
                stderr=out,
                env={**os.environ, "CAPC_TORCH_THREADS": "1"},
            )

    def wait_for(self, state: str, *, timeout: float = 180) -> dict[str, Any]:
        """Its progress once it reports ``state`` (fails if it exits, publishes or times out first)."""
        deadline, progress = time.monotonic() + timeout, {}
        while progress.get("state") != state:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"never reached {state!r}: {progress}"
            assert progress.get("state") != "published", progress
            with contextlib.suppress(httpx.HTTPError):
                progress = httpx.get(f"{self.admin}/api/v1/progress", headers=self.headers, timeout=5).json()
            time.sleep(0.2)
        return progress


def test_sigterm_while_training_stops_the_student_promptly(tmp_path: Path) -> None:
    layout = labelled_student(tmp_path / "state", queries=8192, evaluation=2000)
    student = Student(layout)
    proc, log = student.proc, student.log
    try:
        student.wait_for("training")
        time.sleep(1.0)  # well inside the feature extraction of 8,192 queries
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert took < 12, f"the student took {took:.1f} s to stop (capc local down kills it after 15 s)"
    assert "training interrupted by shutdown" in log.read_text()
    assert not (layout.party_dir("student") / "published" / "model_card.json").exists()


def test_an_os_error_while_publishing_fails_the_student_visibly(tmp_path: Path) -> None:
    layout = labelled_student(tmp_path / "state", queries=256)
    blocker = layout.party_dir("student") / "published"
    blocker.write_text("a file where the student's output directory should be")
    student = Student(layout)
    try:
        progress = student.wait_for("failed")
        ready = httpx.get(f"{student.admin}/readyz", headers=student.headers, timeout=5)  # why: token
    finally:
        student.proc.terminate()
        student.proc.wait(timeout=60)
    assert progress["error"].startswith(("FileExistsError", "NotADirectoryError")), progress
    assert str(blocker) in progress["error"]
    assert ready.status_code == 503 and "failed" in ready.text
    text = student.log.read_text()
    assert "student failed" in text and "Traceback" in text, text[-3000:]
    assert student.proc.returncode == 0, text[-3000:]  # SIGTERM still stops it cleanly


def test_a_one_shot_student_that_fails_exits_non_zero(tmp_path: Path) -> None:
    layout = labelled_student(tmp_path / "state", queries=256)
    blocker = layout.party_dir("student") / "published"
    blocker.write_text("a file where the student's output directory should be")
    site_path = layout.site("student")
    site_path.write_text(yaml.safe_dump({**yaml.safe_load(site_path.read_text()), "exit_when_done": True}))
    student = Student(layout)
    try:
        student.proc.wait(timeout=180)  # it stops by itself: a one-shot job
    finally:
        if student.proc.poll() is None:
            student.proc.kill()
    text = student.log.read_text()
    # It used to exit 0 as if it had published; an OSError on the host's files is exit code 2 (bad file).
    assert student.proc.returncode == 2, text[-3000:]
    assert "error: the student failed: " in text and str(blocker) in text, text[-3000:]
