"""A selection student whose publishing fails for a reason that is not a CapcError (here an OSError: its
output directory cannot be made) says so: progress and readiness report ``failed`` with the reason and the
log has the traceback. It used to catch CapcError alone, so the thread ended and the student reported
"training" for ever."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from student_memory import labelled_student, student_command  # a benchmark's helpers


def test_an_os_error_while_publishing_fails_the_student_visibly(tmp_path: Path) -> None:
    layout = labelled_student(tmp_path / "state", queries=256)
    site = yaml.safe_load(layout.site("student").read_text())
    blocker = layout.party_dir("student") / "published"
    blocker.write_text("a file where the student's output directory should be")
    admin = f"http://{site['admin']['bind']}"
    headers = {"Authorization": f"Bearer {layout.token.read_text().strip()}"}
    log = layout.root / "student.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            student_command(layout),
            cwd=layout.root,
            stdout=out,
            stderr=out,
            env={**os.environ, "CAPC_TORCH_THREADS": "1"},
        )
    try:
        deadline = time.monotonic() + 180
        progress: dict = {}
        while progress.get("state") != "failed":
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"never failed: {progress}"
            assert progress.get("state") != "published", progress
            with contextlib.suppress(httpx.HTTPError):
                progress = httpx.get(f"{admin}/api/v1/progress", headers=headers, timeout=5).json()
            time.sleep(0.2)
        ready = httpx.get(f"{admin}/readyz", timeout=5)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert progress["error"].startswith(("FileExistsError", "NotADirectoryError")), progress
    assert str(blocker) in progress["error"]
    assert ready.status_code == 503 and "failed" in ready.text
    text = log.read_text()
    assert "student failed" in text and "Traceback" in text, text[-3000:]
    assert proc.returncode == 0, text[-3000:]  # SIGTERM still stops it cleanly
