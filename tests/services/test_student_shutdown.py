"""SIGTERM while the student trains: it stops within seconds (labels stay in the store; training reruns)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from student_memory import labelled_student, student_command  # a benchmark's helpers


def test_sigterm_while_training_stops_the_student_promptly(tmp_path: Path) -> None:
    layout = labelled_student(tmp_path / "state", queries=8192, evaluation=2000)
    site = yaml.safe_load(layout.site("student").read_text())
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
        state = ""
        while state != "training":
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"never started training (state {state!r})"
            with contextlib.suppress(httpx.HTTPError):
                state = httpx.get(f"{admin}/api/v1/progress", headers=headers, timeout=5).json()["state"]
            time.sleep(0.2)
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
