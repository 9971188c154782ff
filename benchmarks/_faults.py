"""The network and disk fault campaign of ``benchmarks/chaos.py --faults network,disk``.

A local federation (the kill campaign's: 3 teacher parties × 2 heads, batches of 32) runs behind the link
lab (``capc_services.lab``: every party in its own network namespace, a proxy per link), with the guardian's
ledger and the student's label store each on a small volume of its own. Each injection breaks one thing for
a while, heals it, and then checks, on the real files and the parties' own reports:

* **nothing lost, nothing mis-charged**: the ledger verifies (its chain and every total recomputed), no batch
  is charged twice or not at all, every settled batch's labels reach the student, no batch is held at its
  worst case without labels (``chaos.check_files``);
* **resumed by itself**: after the heal, within ``resume_timeout`` and without anyone restarting a party,
  the student labels a new batch — and a teacher party the fault touched answers again;
* **a full or read-only disk refuses precisely**: meanwhile the student says what it waits for (the volume,
  full or read-only), the guardian serves its budget, no party logs a traceback, and the label store holds
  no half-written batch.

The kinds (``--faults network`` and/or ``disk``):

* ``partition``: one link's packets dropped both ways (``iptables``), 5–60 s;
* ``blackhole``: one link's open connections half-open for good (the proxy swallows them; no FIN, no RST);
* ``reset``: one link's connections reset mid-stream (TCP RST);
* ``slow``: the guardian held to a tenth of one core (a cgroup CPU quota);
* ``clock_skew``: one party restarted with its wall clock 5 minutes ahead or behind (``capc_services.lab.
  clock``: an ``LD_PRELOAD`` shim that shifts only the wall clock, certificate checks included; restarted
  again with the right time to heal);
* ``disk_full``: the guardian's ledger volume filled up (a real ENOSPC);
* ``read_only``: the guardian stopped, its ledger volume remounted read-only, the guardian started on it
  (Linux remounts read-only only with no file open for writing), then the volume made read-write again
  under the running guardian;
* ``store_full``: the student's label-store volume filled up.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _invariants import check_files

from capc_common.errors import UnavailableError
from capc_services.lab.clock import skewed
from capc_services.lab.cpu import Throttle
from capc_services.lab.federation import LabFederation
from capc_services.local.federation import restart
from capc_services.local.processes import pid_alive, processes_of, read_state

NETWORK = ("partition", "blackhole", "reset", "slow", "clock_skew")
DISK = ("disk_full", "read_only", "store_full")
VOLUME_BYTES = 16 << 20
Say = Callable[[str], None]


@dataclass
class Injection:
    """One fault, its heal, and what the checks found."""

    kind: str
    target: str
    seconds: float
    resumed: bool = False
    resume_s: float = float("nan")
    lost: int = 0
    mischarged: int = 0
    ledger_ok: bool = True
    refusal: str = ""  # what the student said while a disk was full or read-only
    reads_served: bool = True  # the guardian answered its budget meanwhile
    tracebacks: int = 0
    half_written: int = 0
    notes: list[str] = field(default_factory=list)


class FaultCampaign:
    """A lab federation and the means to break and heal its links, CPU, clocks and volumes.

    Args:
        fed: the running lab federation (with ``ledger`` and ``store`` volumes).
        rng: which link, party and duration (not secret).
        resume_timeout: seconds each injection gets to resume after its heal.
        say: progress lines.
    """

    def __init__(
        self, fed: LabFederation, *, rng: np.random.Generator, resume_timeout: float, say: Say
    ) -> None:
        assert fed.lab is not None
        self.fed, self.lab, self.rng, self.say = fed, fed.lab, rng, say
        self.resume_timeout = resume_timeout
        self.config = fed.config

    # ------------------------------------------------------------------ observation
    def done(self) -> int:
        with sqlite3.connect(f"file:{self.fed.store}?mode=ro", uri=True, timeout=30) as db:
            return int(db.execute("SELECT COUNT(*) FROM batches WHERE state = 'done'").fetchone()[0])

    def answered(self, teacher: str) -> int:
        status = self.fed.get(teacher, "/api/v1/status")
        return int(status["answered_batches"]) if isinstance(status, dict) else -1

    def pid(self, party: str) -> int:
        return next(p.pid for p in processes_of(read_state(self.fed.layout)) if p.party == party)

    def _log_marks(self) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in self.fed.layout.logs.glob("*.log")}

    def _tracebacks(self, marks: dict[str, int]) -> int:
        count = 0
        for path in self.fed.layout.logs.glob("*.log"):
            with path.open("rb") as handle:
                handle.seek(marks.get(path.name, 0))
                count += handle.read().count(b"Traceback")
        return count

    def _half_written(self) -> int:
        """Batches of the label store that are not whole: labels of a batch not done, or a done batch
        without all its labels (and SQLite's own check)."""
        with sqlite3.connect(f"file:{self.fed.store}?mode=ro", uri=True, timeout=30) as db:
            broken = db.execute(
                "SELECT COUNT(*) FROM batches b WHERE (b.state = 'done') != "
                "((SELECT COUNT(*) FROM labels l WHERE l.batch_id = b.batch_id) = b.count) "
                "OR (b.state != 'done' AND EXISTS (SELECT 1 FROM labels l WHERE l.batch_id = b.batch_id))"
            ).fetchone()[0]
            ok = db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return int(broken) + (0 if ok else 1)

    def wait_resumed(self, *, teachers: tuple[str, ...] = ()) -> float | None:
        """Seconds until the student labels a new batch and each of ``teachers`` answers one (None: not
        within the timeout)."""
        start, done = time.monotonic(), self.done()
        base = {t: self.answered(t) for t in teachers}
        while time.monotonic() - start < self.resume_timeout:
            fresh = all(self.answered(t) > max(base[t], 0) for t in teachers)
            if self.done() > done and fresh:
                return time.monotonic() - start
            time.sleep(0.2)
        return None

    def check(self, injection: Injection) -> None:
        found = check_files(self.fed.ledger, self.fed.store)
        injection.ledger_ok = bool(found["ledger_ok"])
        injection.lost = int(found["lost"])
        injection.mischarged = int(found["double_charged"] + found["uncharged"] + found["charged_unrevealed"])

    # ------------------------------------------------------------------ injections
    def inject(self, kind: str, target: str, seconds: float) -> Injection:
        injection = Injection(kind=kind, target=target, seconds=round(seconds, 1))
        marks = self._log_marks()
        teachers: tuple[str, ...] = ()
        self.say(f"{kind} {target} {seconds:.0f} s")
        if kind in ("partition", "blackhole", "reset"):
            dialer = self.lab.links[target].dialer
            teachers = (dialer,) if dialer in self.config.teacher_names else ()
            if kind == "partition":
                self.lab.partition(target, on=True)
                time.sleep(seconds)
                self.lab.partition(target, on=False)
            elif kind == "blackhole":
                injection.notes.append(f"{self.lab.blackhole(target)} connections made half-open")
            else:
                time.sleep(seconds)  # let traffic flow, then cut it mid-stream
                injection.notes.append(f"{self.lab.reset(target)} connections reset")
        elif kind == "slow":
            throttle = Throttle(self.pid(target), share=0.1)
            try:
                time.sleep(seconds)
            finally:
                throttle.close()
        elif kind == "clock_skew":
            teachers = (target,) if target in self.config.teacher_names else ()
            skew = 300 if self.rng.random() < 0.5 else -300
            injection.notes.append(f"wall clock {skew:+d} s")
            self._restart(target, env=skewed(skew))
            resumed = self.wait_resumed(teachers=teachers)
            injection.notes.append(f"labelled under the skew: {resumed is not None}")
            self._restart(target, env=None)
        elif kind in ("disk_full", "store_full"):
            volume = self.fed.volumes["ledger" if kind == "disk_full" else "store"]
            volume.fill()
            self._observe_refusal(injection, seconds)
            volume.drain()
        elif kind == "read_only":
            volume = self.fed.volumes["ledger"]
            self._stop(self.config.guardian)
            volume.read_only(True)
            self._restart(self.config.guardian, env=None, stopped=True)
            self._wait_serving(self.config.guardian)  # it starts on the read-only volume, then serves reads
            self._observe_refusal(injection, seconds)
            volume.read_only(False)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        resumed = self.wait_resumed(teachers=teachers)
        injection.resumed = resumed is not None
        injection.resume_s = round(resumed, 2) if resumed is not None else float("nan")
        injection.tracebacks = self._tracebacks(marks)
        injection.half_written = self._half_written()
        self.check(injection)
        self.say(f"  resumed {injection.resumed} in {injection.resume_s} s; lost {injection.lost}, "
                 f"mischarged {injection.mischarged}, tracebacks {injection.tracebacks}")  # fmt: skip
        return injection

    def _observe_refusal(self, injection: Injection, seconds: float) -> None:
        """While a volume is full or read-only: what the student says, and whether the guardian reads."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            progress = self.fed.get(self.config.student, "/api/v1/progress")
            if isinstance(progress, dict) and progress.get("state") == "waiting for storage":
                injection.refusal = str(progress.get("error", ""))
            budget = self.fed.get(self.config.guardian, "/api/v1/budget")
            injection.reads_served &= isinstance(budget, dict) and "epsilon_spent" in budget
            time.sleep(0.5)

    def _wait_serving(self, party: str) -> None:
        """Wait (at most the resume timeout) until ``party``'s admin API answers ``/readyz``."""
        deadline = time.monotonic() + self.resume_timeout
        while self.fed.get(party, "/readyz") is None and time.monotonic() < deadline:
            time.sleep(0.2)

    def _stop(self, party: str) -> None:
        """SIGTERM ``party`` and wait for it to exit (bounded; SIGKILL after 30 s)."""
        pid = self.pid(party)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            while pid_alive(pid) and time.monotonic() < deadline + 10:
                time.sleep(0.1)

    def _restart(self, party: str, *, env: dict[str, str] | None, stopped: bool = False) -> None:
        if not stopped:
            self._stop(party)
        restart(self.fed.root, party, env=env)


def schedule(config_links: list[str], teachers: list[str], *, faults: set[str], smoke: bool,
             rng: np.random.Generator) -> list[tuple[str, str, float]]:  # fmt: skip
    """The injections ``(kind, target, seconds)``: every link partitioned (5–60 s) and reset, the links that
    matter blackholed, the guardian slowed, three clocks skewed, each volume full or read-only — or, with
    ``smoke``, one short injection of each kind."""
    plan: list[tuple[str, str, float]] = []
    teacher_links = [link for link in config_links if link.startswith(teachers[0])]
    if "network" in faults:
        if smoke:
            plan += [("partition", teacher_links[0], 5.0), ("reset", "student->guardian", 1.0)]
        else:
            plan += [("partition", link, float(rng.uniform(5, 60))) for link in config_links]
            plan += [("reset", link, float(rng.uniform(0.5, 3))) for link in config_links]
            plan += [("blackhole", link, 0.0) for link in ("student->guardian", *teacher_links)]
            plan += [("slow", "guardian", 30.0)]
            plan += [("clock_skew", party, 0.0) for party in ("guardian", "student", teachers[-1])]
    if "disk" in faults:
        plan += [
            ("disk_full", "ledger", 5.0 if smoke else 20.0),
            ("store_full", "store", 5.0 if smoke else 20.0),
        ]
        plan += [("read_only", "ledger", 5.0 if smoke else 20.0)]
    return plan


def run(
    *,
    faults: set[str],
    smoke: bool,
    seed: int,
    resume_timeout: float,
    root: Path,
    options: Any,
    namespaces: bool | None,
    say: Say,
) -> dict[str, Any]:
    """The campaign: start the lab federation, inject every fault of the schedule, check, stop."""
    rng = np.random.default_rng(seed)  # non-secret: which link, which party, how long
    started = time.monotonic()
    fed = LabFederation(
        root, options, namespaces=namespaces, volumes={"ledger": VOLUME_BYTES, "store": VOLUME_BYTES}, say=say
    )
    injections: list[Injection] = []
    unavailable: dict[str, str] = {}
    try:
        assert fed.lab is not None
        campaign = FaultCampaign(fed, rng=rng, resume_timeout=resume_timeout, say=say)
        while campaign.done() < 2:  # the first batches: the base OT, warm caches
            time.sleep(0.5)
        plan = schedule(sorted(fed.lab.links), fed.config.teacher_names, faults=faults, smoke=smoke, rng=rng)
        for kind, target, seconds in plan:
            try:
                injections.append(campaign.inject(kind, target, seconds))
            except UnavailableError as exc:  # this machine cannot make that fault (say which, and why)
                unavailable[kind] = str(exc)
        verify = subprocess.run(
            [sys.executable, "-m", "capc_cli", "budget", "verify", "--ledger", str(fed.ledger)],
            capture_output=True,
            text=True,
            check=False,
        )
        lab = {"mode": fed.lab.mode, "note": fed.lab.note}
        batches = campaign.done()
    finally:
        fed.close()
    by_kind: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"injections": 0, "resumed": 0, "max_resume_s": 0.0}
    )
    for i in injections:
        entry = by_kind[i.kind]
        entry["injections"] += 1
        entry["resumed"] += int(i.resumed)
        if i.resumed:
            entry["max_resume_s"] = max(entry["max_resume_s"], i.resume_s)
    resumes = [i.resume_s for i in injections if i.resumed]
    return {
        "injections": len(injections),
        "by_kind": dict(by_kind),
        "lost": max((i.lost for i in injections), default=0),
        "mischarged": max((i.mischarged for i in injections), default=0),
        "resumed": sum(i.resumed for i in injections),
        "max_resume_s": max(resumes, default=float("nan")),
        "ledger_verified_every_injection": all(i.ledger_ok for i in injections),
        "budget_verify_exit": verify.returncode,
        "tracebacks": sum(i.tracebacks for i in injections),
        "half_written": max((i.half_written for i in injections), default=0),
        "disk_refusals": {i.kind: i.refusal for i in injections if i.kind in DISK},
        "reads_served_while_disk_failed": all(i.reads_served for i in injections if i.kind in DISK),
        "batches_labelled": batches,
        "lab": lab,
        "not_injected": unavailable,
        "seconds": round(time.monotonic() - started, 1),
        "seed": seed,
        "per_injection": [asdict(i) for i in injections],
    }
