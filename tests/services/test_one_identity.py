"""One identity, one process (issue 25.3), with real ``capc teacher serve`` processes against a real student.

A second process of hospital-1 on the same cap record exits at start with code 4 and the first's pid; a
third on its own copy of the record gets past its cap but the student refuses its work stream
(``ALREADY_EXISTS``, naming the first) — it logs that and backs off, while the first keeps its stream.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from live_parties import LiveParties

from capc_services.local.processes import probe
from capc_services.local.provision import free_port
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import train_party_heads

pytestmark = pytest.mark.slow
PARTY = "hospital-1"


def _serve(site: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "capc_cli", "teacher", "serve", "--site", str(site)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _until(check, *, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def _own_record(settings: TeacherSettings, tmp_path: Path, name: str, **admin: str) -> Path:
    """A copy of the site file whose cap record is a copy of the party's (``admin``: its admin section's
    changes)."""
    data = json.loads(settings.model_dump_json())
    data["cap"]["record"] = str(shutil.copy(settings.cap.record, tmp_path / f"{name}-cap.jsonl"))
    data["admin"].update(admin)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_second_process_of_a_party_is_refused_by_its_cap_and_by_the_student(
    live_parties: LiveParties, tmp_path: Path
) -> None:
    settings = TeacherSettings.load(live_parties.layout.site(PARTY))
    if not settings.heads.exists():
        train_party_heads(settings)
    # The first and second processes share a record of their own: the worker's live federation is shared
    # with other modules, and the party's own record stays unspent for them (preflight reads it).
    site = _own_record(settings, tmp_path, "first")
    record = TeacherSettings.load(site).cap.record
    admin = f"http://127.0.0.1:{live_parties.endpoints.admin[PARTY]}"
    first = _serve(site, tmp_path / "first.log")
    third = None
    try:
        _until(lambda: probe(f"{admin}/readyz")[0] == 200, timeout=120, what="the first teacher became ready")

        # Same identity, its own copy of the record (two containers on two volumes): it gets past its own
        # cap, but the student refuses its stream.
        third = _serve(
            _own_record(settings, tmp_path, "third", bind=f"127.0.0.1:{free_port()}"), tmp_path / "third.log"
        )

        # Meanwhile, same site and same record: refused at start, exit code 4, naming the first process.
        second = subprocess.run(
            [sys.executable, "-m", "capc_cli", "teacher", "serve", "--site", str(site)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 4, second.stderr
        assert f"holds its cap record {record}: pid {first.pid} on host" in second.stderr
        assert "Traceback" not in second.stderr
        refused = "refused by the student: another process of this party is connected"

        def third_refused() -> bool:
            text = (tmp_path / "third.log").read_text()
            return refused in text and f"pid {first.pid} on host" in text and "ALREADY_EXISTS" in text

        _until(third_refused, timeout=120, what="the student refused the third process")
        time.sleep(2)  # long enough for any flapping (0.5 s reconnections) to show
        log = (tmp_path / "third.log").read_text()
        # It backs off (30 s): it neither exits nor flaps.
        assert third.poll() is None and log.count(refused) == 1
        assert "work stream ended" not in (tmp_path / "first.log").read_text()
        assert probe(f"{admin}/readyz")[0] == 200  # the first kept its stream
    finally:
        for proc in (p for p in (first, third) if p is not None):
            proc.terminate()
            proc.wait(timeout=30)
