"""Start-up of each party: seconds from process start to ``/readyz`` OK, and the modules it imported.

Usage: ``.venv/bin/python benchmarks/startup.py --format json [--runs 5] [--heads 189]``. With
``--format json`` it prints one object with ``guardian_ready_s``, ``student_ready_s`` and ``teacher_ready_s``
(medians over ``--runs``), ``guardian_modules``, ``student_modules`` and ``teacher_modules`` (modules the
process had imported when it became ready), ``guardian_imports_torch`` and ``guardian_imports_scipy_special``
(and the same for the others: the accountant loads scipy.special on first use, not at start-up),
``runs``, ``heads`` and the per-run figures (``*_runs``).

A local federation (2 teacher parties, the default backbone for 28x28x1 images, ``--heads`` heads for
hospital-1, a quorum of both parties so nothing is labelled while it is measured) is provisioned and
hospital-1's heads are trained once (a federation already in ``--state-dir`` is reused as it is). Each run
then starts the real processes one after the other, as ``capc local up`` does: the guardian, then the
student (ready once it reaches the guardian), then hospital-1 (ready once its link to the student is up and
the guardian answers), each timed from ``Popen`` to the first ``/readyz`` that answers 200 (polled every
10 ms), with the CPU seconds it had used by then (``*_cpu_s``: what the load of a shared machine does not
stretch), and stops them again. A warm-up run before them (the first run after a new virtualenv reads every
module from disk) counts the modules: its processes run with ``-X importtime`` (``PYTHONPROFILEIMPORTTIME``),
whose log lines name every module imported up to then.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import httpx
from _force import benchmark_force

from capc_common.errors import UnavailableError
from capc_services.local.federation import ensure_provisioned
from capc_services.local.layout import Layout
from capc_services.local.processes import (
    PartyProcess,
    pid_alive,
    read_state,
    start_party,
    stop_processes,
    tail,
)
from capc_services.local.provision import Endpoints, LocalOptions

ROLES = ("guardian", "student", "teacher")
POLL_S = 0.01


def options(heads: int) -> LocalOptions:
    """Two hospitals, the default backbone, ``heads`` heads each, both needed for a batch (min_parties)."""
    return LocalOptions(
        parties=2,
        teachers_per_party=heads,
        dataset="fashion-mnist",
        epsilon=1000.0,
        queries=4096,
        batch_size=64,
        bn_batch=32,
        threshold=3.0,
        sigma1=80.0,
        sigma2=80.0,
        min_parties=2,
        train_limit=64 * heads,  # shards of about 64 examples: each holds a bn_batch of 32
        evaluation_images=None,
        generator="dead_leaves",
        force=benchmark_force("start-up"),
    )


def wait_ready(layout: Layout, proc: PartyProcess, *, started: float, timeout: float) -> float:
    """Seconds from ``started`` until ``proc``'s ``/readyz`` answers 200.

    Raises:
        UnavailableError: the process exited, or was not ready within ``timeout`` seconds.
    """
    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                if client.get(f"{proc.admin_url}/readyz").status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if not pid_alive(proc.pid):
                raise UnavailableError(
                    f"{proc.party} exited during start-up:\n{tail(layout.log(proc.party))}"
                )
            if time.perf_counter() - started > timeout:
                raise UnavailableError(f"{proc.party} not ready after {timeout:.0f} s")
            time.sleep(POLL_S)


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far, from ``/proc/PID/stat``: on a shared,
    busy machine the wall time to ready stretches with the load, its CPU time hardly at all."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def imported_modules(log: Path, *, offset: int) -> list[str]:
    """Modules named by ``-X importtime`` lines written to ``log`` after ``offset`` bytes."""
    with log.open("rb") as handle:
        handle.seek(offset)
        lines = handle.read().decode(errors="replace").splitlines()
    return [
        line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:") and "|" in line
    ]


def imports(modules: list[str], package: str) -> bool:
    """Whether ``package`` or one of its submodules is among ``modules`` (``-X importtime`` does not always
    log the package itself: scipy's lazily loaded subpackages show only their submodules)."""
    return any(m == package or m.startswith(package + ".") for m in modules)


def one_run(
    layout: Layout,
    parties: dict[str, str],
    admin: dict[str, int],
    *,
    count_modules: bool,
    timeout: float,
    roles: tuple[str, ...] = ROLES,
) -> dict[str, Any]:
    """Start ``roles`` in turn (each once the previous is ready), then stop them."""
    env = {"PYTHONPROFILEIMPORTTIME": "1"} if count_modules else None
    figures: dict[str, Any] = {}
    started: list[PartyProcess] = []
    try:
        for role in roles:
            party = parties[role]
            log = layout.log(party)
            offset = log.stat().st_size if log.exists() else 0
            t0 = time.perf_counter()
            proc = start_party(layout, party=party, role=role, admin_port=admin[party], env=env)
            started.append(proc)
            figures[f"{role}_ready_s"] = wait_ready(layout, proc, started=t0, timeout=timeout)
            figures[f"{role}_cpu_s"] = cpu_seconds(proc.pid)
            if count_modules:
                modules = imported_modules(log, offset=offset)
                figures[f"{role}_modules"] = len(set(modules))
                figures[f"{role}_imports_torch"] = imports(modules, "torch")
                figures[f"{role}_imports_scipy_special"] = imports(modules, "scipy.special")
    finally:
        stop_processes(started, grace=10)
    return figures


def prepare(root: Path, *, heads: int, train: bool = True) -> tuple[Layout, dict[str, str], dict[str, int]]:
    """The federation in ``root`` (provisioned unless there already, hospital-1's heads trained unless
    ``train`` is False or they exist); returns its layout, the party measured for each role and the admin
    ports."""
    from capc_services.teacher.settings import TeacherSettings
    from capc_services.teacher.train import train_party_heads

    layout, config = ensure_provisioned(root, options(heads))
    teacher = config.teacher_names[0]
    if train and not (layout.party_dir(teacher) / "heads.safetensors").exists():
        train_party_heads(TeacherSettings.load(layout.site(teacher)))
    parties = {"guardian": config.guardian, "student": config.student, "teacher": teacher}
    return layout, parties, Endpoints.from_dict(read_state(layout)["endpoints"]).admin


def run(*, runs: int, heads: int, state_dir: Path | None, timeout: float = 120.0) -> dict[str, Any]:
    """One counting run, then ``runs`` timed ones; the medians and the modules."""
    root = state_dir or Path(tempfile.mkdtemp(prefix="capc-startup-")) / "state"
    layout, parties, admin = prepare(root, heads=heads)
    result: dict[str, Any] = one_run(layout, parties, admin, count_modules=True, timeout=timeout)
    timed = [one_run(layout, parties, admin, count_modules=False, timeout=timeout) for _ in range(runs)]
    for role in ROLES:
        seconds = [round(r[f"{role}_ready_s"], 3) for r in timed]
        result[f"{role}_ready_s"] = round(statistics.median(seconds), 3)
        result[f"{role}_ready_runs"] = seconds
        result[f"{role}_cpu_s"] = round(statistics.median(r[f"{role}_cpu_s"] for r in timed), 3)
    return {**result, "runs": runs, "heads": heads}


@click.command()
@click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True, help="Timed runs (median).")
@click.option(
    "--heads", type=click.IntRange(min=1), default=189, show_default=True, help="hospital-1's heads."
)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def main(runs: int, heads: int, state_dir: Path | None, fmt: str) -> None:
    """Seconds from process start to /readyz for the guardian, the student and a teacher."""
    result = run(runs=runs, heads=heads, state_dir=state_dir)
    if fmt == "json":
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:<26} {value}")


if __name__ == "__main__":
    main()
