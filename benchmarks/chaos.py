"""Chaos campaign: kill -9 the parties of a local federation, restart them, and check that nothing is lost.

Usage: ``.venv/bin/python benchmarks/chaos.py --injections 100 --format json [--seed 0] [--csv FILE]``. With
``--format json`` it prints one object with at least ``injections``, ``resumed``, ``epsilon_double_charged``,
``epsilon_uncharged``, ``labels_lost`` and ``max_resume_s`` (and writes one CSV row per round with
``--csv``).

``--faults network,disk [--smoke]`` runs the network and disk campaign instead (``benchmarks/_faults.py``: the
same federation behind shaped links, partitions, half-open connections, resets, a slowed guardian, skewed
clocks, full and read-only volumes); its object has ``injections``, ``by_kind``, ``lost``, ``mischarged``,
``resumed`` and ``max_resume_s``.

A local federation (3 teacher parties × 2 heads, scatter backbone, batches of 32, a budget large enough
for every round) runs as real processes (``capc local``). Each round picks a party and a way to kill it:

* **random**: ``kill -9`` after a random 0.2–3 s of normal work;
* **aimed**: the party is (killed and) restarted with a fault point armed (``CAPC_FAULTS``, see
  ``capc_services.common.faults``), so it SIGKILLs itself inside a window that matters — the guardian
  between decoding the pass bits and settling (``guardian.decoded``) or between settling and revealing
  (``guardian.settled``), the student between the guardian's settle and its label store
  (``student.labelled``), a teacher between sending its seed and its share (``teacher.shared``).

The party is restarted with the same command (``capc local restart``), nothing else is touched, and after
every round the campaign checks the invariants on the real files: the guardian's ledger verifies, no batch
has more than one settle or release, every batch the student stored labels for is settled on the ledger
with the same answered count (else ``epsilon_uncharged``), no settled batch is recorded as lost by the
student (``labels_lost``; a batch whose computation began but never settled is held at its worst case and
recorded as lost with no label revealed: ``charged_unrevealed``, an over-count, not a loss), ε never
exceeds the limit, and labelling resumes (a new batch labelled) within ``--resume-timeout`` seconds.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import httpx
import numpy as np
from _force import benchmark_force
from _invariants import check_files, store_rows
from _lab import NAMESPACES, namespaces_option

from capc_services.local.federation import down, ensure_provisioned, restart, summary, token, up
from capc_services.local.layout import Layout
from capc_services.local.processes import federation_of, pid_alive, processes_of, read_state
from capc_services.local.provision import LocalOptions

AIMED = {
    "guardian": ("guardian.decoded", "guardian.settled"),
    "student": ("student.labelled",),
    "teacher": ("teacher.shared",),
}


@dataclass
class Round:
    """One round of the campaign and what the checks found after it."""

    round: int
    party: str
    kind: str  # random | aimed:<point>
    injections: int
    window_hit: bool  # aimed: the party died at its fault point (not by the fallback kill)
    resumed: bool
    resume_s: float
    ledger_ok: bool
    double_charged: int
    uncharged: int
    lost: int
    charged_unrevealed: int
    epsilon_spent: float


class Campaign:
    """A running local federation and the means to kill, restart and inspect its parties.

    Args:
        root: the federation's state directory.
        options: how to provision and start it; None attaches to the federation already running there.
        rng: which party dies when (not secret).
        resume_timeout: seconds labelling gets to resume after a restart.
    """

    def __init__(
        self, root: Path, options: LocalOptions | None, *, rng: np.random.Generator, resume_timeout: float
    ) -> None:
        self.root, self.rng, self.resume_timeout = root, rng, resume_timeout
        self.owned = options is not None
        if options is not None:
            self.layout, self.config = ensure_provisioned(root, options)
            self.endpoints = up(root, options, ready_timeout=600)
        else:
            self.layout = Layout(Path(root).resolve())
            self.config = federation_of(self.layout)
            self.endpoints = summary(self.layout)
        self.secret = token(self.layout, self.config.student)  # its progress is what is watched
        self.ledger_path = self.layout.party_dir(self.config.guardian) / "ledger.sqlite"
        self.store_path = self.layout.party_dir(self.config.student) / "labels.sqlite"

    # ------------------------------------------------------------------ processes
    def pid(self, party: str) -> int:
        return next(p.pid for p in processes_of(read_state(self.layout)) if p.party == party)

    def kill(self, party: str) -> None:
        """SIGKILL the party (if it still runs) and reap it."""
        pid = self.pid(party)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.wait_dead(pid, timeout=30)

    @staticmethod
    def wait_dead(pid: int, *, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while pid_alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def restart(self, party: str, *, faults: str | None = None) -> None:
        restart(self.root, party, env={"CAPC_FAULTS": faults} if faults else None)

    # ------------------------------------------------------------------ observation
    def progress(self) -> dict[str, Any] | None:
        """The student's progress, or None while it does not answer (down, or starting)."""
        try:
            response = httpx.get(
                self.endpoints["student"]["progress"],
                headers={"Authorization": f"Bearer {self.secret}"},
                timeout=5,
            )
            return dict(response.json()) if response.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def labelled(self) -> int:
        """Batches the student has labelled (from its own store on disk; works while it is down)."""
        with sqlite3.connect(f"file:{self.store_path}?mode=ro", uri=True, timeout=30) as db:
            return int(db.execute("SELECT COUNT(*) FROM batches WHERE state = 'done'").fetchone()[0])

    def wait_resumed(self, since: int) -> float | None:
        """Seconds until the student labels a batch beyond ``since`` (None: not within the timeout)."""
        start = time.monotonic()
        while time.monotonic() - start < self.resume_timeout:
            if self.labelled() > since:
                return time.monotonic() - start
            progress = self.progress()
            if progress is not None and progress.get("state") in ("labelled", "published", "failed"):
                return None  # the run ended (or failed for good): nothing more will be labelled
            time.sleep(0.1)
        return None

    def store_rows(self) -> list[tuple[str, str, int]]:
        """(batch id, state, answered) of every batch in the student's store."""
        return store_rows(self.store_path)

    def check(self) -> dict[str, Any]:
        """The invariants, on the ledger and label store files as they are now (:func:`check_files`)."""
        return check_files(self.ledger_path, self.store_path)

    # ------------------------------------------------------------------ one round
    def round(self, index: int) -> Round:
        party = str(self.rng.choice([self.config.guardian, self.config.student, *self.config.teacher_names]))
        role = {self.config.guardian: "guardian", self.config.student: "student"}.get(party, "teacher")
        aimed = self.rng.random() < 0.5
        injections, hit = 1, False
        if aimed:
            point = str(self.rng.choice(AIMED[role]))
            kind = f"aimed:{point}"
            self.kill(party)  # a kill at a random moment too: it frees the party to restart armed
            self.restart(party, faults=f"{point}@{self.rng.integers(1, 3)}")
            hit = self.wait_dead(self.pid(party), timeout=self.resume_timeout)  # died in its window
            if not hit:
                self.kill(party)  # it never got there in time: an ordinary kill
            injections += 1
        else:
            kind = "random"
            time.sleep(self.rng.uniform(0.2, 3.0))
            self.kill(party)
        self.restart(party)
        resume = self.wait_resumed(self.labelled())
        found = self.check()
        return Round(
            round=index,
            party=party,
            kind=kind,
            injections=injections,
            window_hit=hit,
            resumed=resume is not None,
            resume_s=resume if resume is not None else float("nan"),
            ledger_ok=found["ledger_ok"],
            double_charged=found["double_charged"],
            uncharged=found["uncharged"],
            lost=found["lost"],
            charged_unrevealed=found["charged_unrevealed"],
            epsilon_spent=found["epsilon_spent"],
        )

    def close(self) -> None:
        """Stop the federation if this campaign started it."""
        if self.owned:
            down(self.root)


def campaign_options() -> LocalOptions:
    """A small, quick federation whose queries and budget outlast any campaign (a batch's worst case is
    ≈ 0.04 of a budget of ≈ 999 RDP: some 25,000 batches)."""
    return LocalOptions(
        parties=3,
        teachers_per_party=2,
        dataset="fashion-mnist",
        epsilon=1000.0,
        order=10.0,  # the figures above are at order 10 (the planned order would be 1.1)
        queries=32 * 50_000,
        batch_size=32,
        bn_batch=16,
        threshold=3.0,
        sigma1=80.0,
        sigma2=80.0,
        min_parties=2,
        train_limit=200,
        evaluation_images=None,
        backbone="scatter-28x28x1",
        generator="dead_leaves",
        vote_deadline_s=15.0,
        share_deadline_s=10.0,
        force=benchmark_force("recovery from crashes"),
    )


def run(
    *, injections: int, seed: int, resume_timeout: float, state_dir: Path | None, attach: bool = False
) -> dict[str, Any]:
    """Run rounds until at least ``injections`` kills were injected; return the campaign's figures.

    Args:
        injections: kills to inject (at least).
        seed: which party dies when.
        resume_timeout: seconds labelling gets to resume after each restart.
        state_dir: the federation's state directory (default: a fresh temporary one).
        attach: use the federation already running in ``state_dir`` (and leave it running) instead of
            starting one.
    """
    rng = np.random.default_rng(seed)  # non-secret: only which party dies when
    root = state_dir or Path(tempfile.mkdtemp(prefix="capc-chaos-")) / "state"
    started = time.monotonic()
    campaign = Campaign(root, None if attach else campaign_options(), rng=rng, resume_timeout=resume_timeout)
    rounds: list[Round] = []
    try:
        while sum(r.injections for r in rounds) < injections:
            rounds.append(campaign.round(len(rounds)))
        # Settled batches the student had not stored at the end are recovered once it gets to them (or were
        # in flight): each must be stored within the resume timeout, or it counts as lost.
        final = campaign.check()
        pending = set(final["settled_open_at_student"])
        deadline = time.monotonic() + resume_timeout
        while pending and time.monotonic() < deadline:
            time.sleep(0.5)
            pending &= {b for b, state, _ in campaign.store_rows() if state == "open"}
        verify = subprocess.run(
            [sys.executable, "-m", "capc_cli", "budget", "verify", "--ledger", str(campaign.ledger_path)],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        campaign.close()
    resumes = [r.resume_s for r in rounds if r.resumed]
    kinds = Counter(r.kind for r in rounds)
    return {
        "injections": sum(r.injections for r in rounds),
        "rounds": len(rounds),
        "resumed": sum(r.resumed for r in rounds),
        "epsilon_double_charged": max((r.double_charged for r in rounds), default=0),
        "epsilon_uncharged": max((r.uncharged for r in rounds), default=0),
        "labels_lost": max(final["lost"], max((r.lost for r in rounds), default=0)) + len(pending),
        "aimed_windows_hit": sum(r.window_hit for r in rounds),
        "charged_unrevealed": final["charged_unrevealed"],
        "max_resume_s": max(resumes, default=float("nan")),
        "median_resume_s": sorted(resumes)[len(resumes) // 2] if resumes else float("nan"),
        "ledger_verified_every_round": all(r.ledger_ok for r in rounds),
        "budget_verify_exit": verify.returncode,
        "epsilon_spent": final["epsilon_spent"],
        "epsilon_limit": final["epsilon_limit"],
        "epsilon_within_limit": all(r.epsilon_spent <= final["epsilon_limit"] for r in rounds),
        "batches_labelled": campaign.labelled(),
        "kinds": dict(sorted(kinds.items())),
        "seconds": round(time.monotonic() - started, 1),
        "seed": seed,
        "per_round": [asdict(r) for r in rounds],
    }


@click.command()
@click.option("--injections", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Which party dies when (not secret).")
@click.option("--resume-timeout", type=float, default=120.0, show_default=True, help="Seconds to resume.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--attach", is_flag=True, help="Use the federation already running in --state-dir.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--faults",
    default=None,
    help="network,disk (either or both): the network and disk campaign instead of kill -9.",
)
@click.option("--smoke", is_flag=True, help="With --faults: one short injection of each kind.")
@namespaces_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def main(
    injections: int,
    seed: int,
    resume_timeout: float,
    state_dir: Path | None,
    attach: bool,
    csv_path: Path | None,
    faults: str | None,
    smoke: bool,
    namespaces: str,
    fmt: str,
) -> None:
    """Kill -9 the parties of a local federation (or break its links and disks) and check that nothing paid
    for is lost."""
    if faults is not None:
        from _faults import run as run_faults

        kinds = {k.strip() for k in faults.split(",") if k.strip()}
        if not kinds or kinds - {"network", "disk"}:
            raise click.UsageError(f"--faults takes network, disk or both, got {faults!r}")
        root = state_dir or Path(tempfile.mkdtemp(prefix="capc-faults-")) / "state"
        result = run_faults(
            faults=kinds,
            smoke=smoke,
            seed=seed,
            resume_timeout=resume_timeout,
            root=root,
            options=campaign_options(),
            namespaces=NAMESPACES[namespaces],
            say=lambda line: click.echo(line, err=True),
        )
        _emit(result, fmt)
        return
    if attach and state_dir is None:
        raise click.UsageError("--attach needs the --state-dir of a running federation")
    result = run(
        injections=injections, seed=seed, resume_timeout=resume_timeout, state_dir=state_dir, attach=attach
    )
    if csv_path is not None:
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(result["per_round"][0]))
            writer.writeheader()
            writer.writerows(result["per_round"])
    _emit(result, fmt)


def _emit(result: dict[str, Any], fmt: str) -> None:
    """One JSON object, or one line per figure (the per-round or per-injection detail in JSON only)."""
    if fmt == "json":
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        if key not in ("per_round", "per_injection"):
            click.echo(f"{key:<28} {value}")


if __name__ == "__main__":
    main()
