"""Peak and steady resident memory of every party's process, against the records per party and the mechanism.

Usage: ``.venv/bin/python benchmarks/memory.py --format json [--mechanism secagg-dpsgd --mechanism
confident-gnmax] [--records 5000 --records 20000] [--parties 3] [--alone | --shipped-basis] [--smoke]``.
Prints one object:

* ``rows``: one per role, mechanism and records: ``role`` (``guardian``, ``student``, ``teacher``: the
  ``capc teacher serve`` process; ``teacher-train``: a PATE party's ``capc teacher train`` process, which a
  Kubernetes teacher runs inside its serving process on first start), ``mechanism``, ``records`` (the
  ``--train-limit`` each party was given), ``peak_rss_mb`` (the largest ``VmHWM`` of the role's processes:
  the kernel's own high-water mark of each), ``steady_rss_mb`` (the largest of their median resident sizes
  over ``--settle`` seconds once the student has published: what a party holds while it idles between
  federations), ``with_children_peak_mb`` (the largest sampled sum of one process's resident size and its
  child processes': a teacher featurises its records in a child process, and a container holds both),
  ``torch`` (whether any of them had loaded torch: its library mapped when last sampled), ``cpu_s`` (the
  most user and system CPU seconds one of them used), ``processes`` and ``caches`` (``shared``, ``alone`` or
  ``shipped-basis``: below).
* ``federations``: per mechanism and records, ``held`` (records each teacher party holds: the
  ``--train-limit`` selects by content hash, so about that many, at most its shard; release mechanisms only),
  ``up_s`` (``capc local up`` until every party is ready), ``work_s`` (ready until published) and ``round_s``
  (the median time between two releases one teacher contributed to; release mechanisms only, else null).
* ``growth``: per role and mechanism measured at two or more record counts, ``steady_kb_per_record`` (the
  slope of the steady size between the smallest and the largest count).
* ``setup``: parties, settle and sampling seconds, ``smoke``, ``caches``.

Each federation is what a person starts with ``capc local up --state-dir DIR --mechanism M --parties P
--train-limit R`` (``federations[].command``), in a fresh state directory: provisioned, then started by that
command and run until the student publishes, then ``capc local down``. Its parties share one machine's
caches (the public basis is computed once, by whichever party gets there first); ``--alone`` removes the
caches from every site file, so each party computes everything itself as in its own container;
``--shipped-basis`` removes them too but gives each teacher and the student a feature cache of its own that
holds only the public basis file ``capc federation basis`` wrote (what a coordinator ships to each hospital's
container: a party reads the basis instead of computing it). One
federation runs at a time; every process it starts is sampled (``/proc/PID/status``, ``/proc/PID/stat``)
every ``--interval`` seconds from its start.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import psutil
import yaml
from _force import benchmark_force

from capc_services.local.federation import down, ensure_provisioned, status
from capc_services.local.provision import LocalOptions

#: What ``capc`` command a party's process runs → the role reported.
_ROLES = {
    ("guardian", "serve"): "guardian",
    ("student", "run"): "student",
    ("teacher", "serve"): "teacher",
    ("teacher", "train"): "teacher-train",
}
#: A smoke run's federation: toy records, two releases over a small public basis, a few PATE batches.
_SMOKE = {
    "secagg-dpsgd": {
        "mechanism_params": {
            "rounds": 2, "projection": {"dim": 16, "generators": ["dead_leaves"], "images": 64, "seed": 7},
        },
    },
    "confident-gnmax": {
        "teachers_per_party": 2, "queries": 128, "batch_size": 32, "bn_batch": 32, "threshold": 3.0,
        "sigma1": 3.0, "sigma2": 2.5, "epsilon": 300.0,
    },
}  # fmt: skip
#: Site-file keys of caches parties on one machine share (public features) or keep (their records'
#: features): ``--alone`` removes them, so every party computes as on a machine of its own.
_CACHES = ("feature_cache", "records_cache")


@dataclass
class _Process:
    """What the sampler saw of one party process."""

    role: str
    party: str
    peak_kb: int = 0
    with_children_kb: int = 0
    torch: bool = False
    cpu_s: float = 0.0
    rss_kb: list[tuple[float, int]] = field(default_factory=list)


class _Sampler:
    """Samples every process whose ``--site`` lies in ``sites`` until stopped."""

    def __init__(self, sites: Path, *, interval: float) -> None:
        self.sites, self.interval = str(sites) + os.sep, interval
        self.seen: dict[int, _Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        """One look at every party process (a process that ended keeps what was seen of it)."""
        now = time.monotonic()
        for pid, role, party in self._parties():
            status = _status(pid)
            if status is None:
                continue
            entry = self.seen.setdefault(pid, _Process(role=role, party=party))
            entry.peak_kb = max(entry.peak_kb, status.get("VmHWM", 0))
            entry.rss_kb.append((now, status.get("VmRSS", 0)))
            children = sum((_status(child) or {}).get("VmRSS", 0) for child in _children(pid))
            entry.with_children_kb = max(entry.with_children_kb, status.get("VmRSS", 0) + children)
            entry.torch = _maps_torch(pid, entry.torch)
            entry.cpu_s = max(entry.cpu_s, _cpu_s(pid))

    def _parties(self) -> Iterator[tuple[int, str, str]]:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            args = proc.info["cmdline"] or []
            if "--site" not in args[:-1] or not args[args.index("--site") + 1].startswith(self.sites):
                continue
            command = [a for a in args if not a.startswith("-")]
            for i in range(len(command) - 1):
                role = _ROLES.get((command[i], command[i + 1]))
                if role is not None:
                    yield proc.info["pid"], role, Path(args[args.index("--site") + 1]).stem
                    break


def _status(pid: int) -> dict[str, int] | None:
    """``VmRSS`` and ``VmHWM`` (kB) of a live process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return {
        k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in lines) if k in ("VmRSS", "VmHWM")
    }


def _children(pid: int) -> list[int]:
    """The process ids of a live process's children, grandchildren, ... (none once it is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _maps_torch(pid: int, before: bool) -> bool:
    """Whether a live process has torch's library mapped (``before`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return before


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds a process has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _round_s(log: Path) -> float | None:
    """Median seconds between two releases a teacher contributed to (from its log), or None."""
    times = []
    for line in log.read_text().splitlines():
        if '"msg": "contributed"' in line:
            times.append(datetime.fromisoformat(json.loads(line)["ts"]).timestamp())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return round(statistics.median(gaps), 3) if gaps else None


def _held(root: Path) -> int | None:
    """Records each teacher party of a release federation holds (the smallest), from their logs."""
    found = re.findall(r'"msg": "features ready", "records": (\d+)', "".join(
        log.read_text() for log in (root / "logs").glob("*.log")))  # fmt: skip
    return min(int(n) for n in found) if found else None


def measure(
    work: Path,
    *,
    mechanism: str,
    records: int,
    parties: int,
    settle: float,
    interval: float,
    smoke: bool,
    caches: str,
    timeout: float,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Provision one federation in ``work`` (``caches``: ``shared``, the machine's; ``alone``, none;
    ``shipped-basis``, each party's own holding only the basis file), start it with ``capc local up``, sample
    it until the student published, stop it."""
    root = work / f"{mechanism}-{records}"
    given = {
        "mechanism": mechanism,
        "parties": parties,
        "train_limit": records,
        **(_SMOKE[mechanism] if smoke else {}),
        "force": benchmark_force("party memory"),
    }
    layout, _ = ensure_provisioned(root, LocalOptions(**given))
    if caches != "shared":
        shipped = _shipped_basis(root) if caches == "shipped-basis" else None
        for site in layout.sites.glob("*.yaml"):
            given_site = yaml.safe_load(site.read_text())
            document = {k: v for k, v in given_site.items() if k not in _CACHES}
            if shipped is not None and "feature_cache" in given_site:  # the teachers and the student
                own = root / "own-caches" / site.stem  # the party's own feature cache: the basis alone
                own.mkdir(parents=True)
                shutil.copyfile(shipped, own / shipped.name)
                document["feature_cache"] = str(own)
            site.write_text(yaml.safe_dump(document))
    command = [
        sys.executable, "-m", "capc_cli", "local", "up", "--state-dir", str(root), "--ready-timeout",
        str(timeout), "--format", "json",
    ]  # fmt: skip
    with _Sampler(root / "sites", interval=interval) as sampler:
        started = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
            if proc.returncode != 0:
                raise click.ClickException(f"`capc local up` exited {proc.returncode}: {proc.stderr[-2000:]}")
            ready = time.monotonic()
            state = _wait_published(root, timeout=timeout)
            done = time.monotonic()
            time.sleep(settle)
            sampler.sample()
        finally:
            if (root / "state.json").exists():
                down(root)
    if state != "published":
        raise click.ClickException(f"{mechanism}: the student ended {state!r}; see {root / 'logs'}")
    rows = []
    for role in sorted({p.role for p in sampler.seen.values()}):
        of_role = [p for p in sampler.seen.values() if p.role == role]
        steady = [
            statistics.median(kb for t, kb in p.rss_kb if t >= done)
            for p in of_role
            if p.rss_kb[-1][0] >= done
        ]
        rows.append({
            "role": role,
            "mechanism": mechanism,
            "records": records,
            "peak_rss_mb": round(max(p.peak_kb for p in of_role) / 1024, 1),
            "steady_rss_mb": round(max(steady) / 1024, 1) if steady else None,
            "with_children_peak_mb": round(max(p.with_children_kb for p in of_role) / 1024, 1),
            "torch": any(p.torch for p in of_role),
            "cpu_s": round(max(p.cpu_s for p in of_role), 1),
            "processes": len(of_role),
            "caches": caches,
        })  # fmt: skip
    first = root / "logs" / "hospital-1.log"
    federation = {
        "mechanism": mechanism,
        "records": records,
        "held": _held(root),
        "up_s": round(ready - started, 1),
        "work_s": round(done - ready, 1),
        "round_s": _round_s(first) if first.exists() else None,
        "command": _command_text(root, given)
        + {
            "shared": "",
            "alone": " (every site file without " + " or ".join(_CACHES) + ")",
            "shipped-basis": " (every site file without " + " or ".join(_CACHES) + "; each teacher's and the "
            "student's feature_cache its own directory holding only `capc federation basis`'s file)",
        }[caches],
    }
    return rows, federation


def _shipped_basis(root: Path) -> Path:
    """The public basis file, as a coordinator makes it for the hospitals: ``capc federation basis`` on the
    federation's federation.yaml (provisioning computed the basis into the machine's shared cache, where the
    command finds it and checks it against the pin)."""
    command = [
        sys.executable, "-m", "capc_cli", "federation", "basis", "--federation",
        str(root / "federation.yaml"), "--out", str(root / "feature-cache"), "--format", "json",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise click.ClickException(f"`capc federation basis` exited {proc.returncode}: {proc.stderr[-2000:]}")
    return Path(json.loads(proc.stdout)["file"])


def _command_text(root: Path, given: dict[str, Any]) -> str:
    """The ``capc local up`` command that provisions the same federation."""
    flags = []
    for name, value in given.items():
        if name == "mechanism_params":
            flags += [f"--mechanism-param '{k}={json.dumps(v)}'" for k, v in value.items()]
        else:
            shown = f"{value:g}" if isinstance(value, float) else shlex.quote(str(value))
            flags.append(f"--{name.replace('_', '-')} {shown}")
    return " ".join(["capc local up --state-dir", str(root), *flags])


def _wait_published(root: Path, *, timeout: float) -> str:
    """Poll the student's progress until it published or failed; its last state."""
    deadline = time.monotonic() + timeout
    state = "unknown"
    while time.monotonic() < deadline:
        progress = status(root).get("progress")
        state = progress.get("state", state) if isinstance(progress, dict) else state
        if state in ("published", "failed", "stopped"):
            return state
        time.sleep(0.5)
    return f"{state} after {timeout:g} s"


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steady kB per record between the smallest and the largest record count, per role and mechanism."""
    out = []
    for role, mechanism in sorted({(r["role"], r["mechanism"]) for r in rows}):
        measured = sorted((r["records"], r["steady_rss_mb"]) for r in rows if (r["role"], r["mechanism"]) == (
            role, mechanism) and r["steady_rss_mb"] is not None)  # fmt: skip
        if len(measured) >= 2 and measured[-1][0] > measured[0][0]:
            (low, a), (high, b) = measured[0], measured[-1]
            out.append({
                "role": role, "mechanism": mechanism, "records": [low, high],
                "steady_kb_per_record": round((b - a) * 1024 / (high - low), 2),
            })  # fmt: skip
    return out


@click.command()
@click.option("--mechanism", "mechanisms", multiple=True, default=["secagg-dpsgd", "confident-gnmax"],
              show_default=True)  # fmt: skip
@click.option("--records", "record_counts", multiple=True, type=click.IntRange(min=10), default=[5000, 20000],
              show_default=True, help="--train-limit of each party, one federation per count.")  # fmt: skip
@click.option("--parties", type=click.IntRange(min=2), default=3, show_default=True)
@click.option("--settle", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="Seconds sampled after publication for the steady size.")  # fmt: skip
@click.option("--interval", type=click.FloatRange(min=0.05), default=0.2, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=10), default=1800.0, show_default=True)
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option(
    "--alone",
    is_flag=True,
    help="Every party computes alone, as on a machine of its own (a hospital's container): no shared "
    "feature cache (each computes the public basis), no records cache.",
)
@click.option(
    "--shipped-basis",
    is_flag=True,
    help="As --alone, but each teacher and the student has a feature cache of its own holding only the "
    "public basis file `capc federation basis` writes (the coordinator ships it; no party computes it).",
)
@click.option(
    "--smoke", is_flag=True, help="Toy federations: 2 parties, 150 records, 2 releases or 4 batches."
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def main(
    mechanisms: tuple[str, ...],
    record_counts: tuple[int, ...],
    parties: int,
    settle: float,
    interval: float,
    timeout: float,
    work_dir: Path | None,
    alone: bool,
    shipped_basis: bool,
    smoke: bool,
    fmt: str,
) -> None:
    """Measure every party's peak and steady resident memory in local federations, one at a time."""
    if alone and shipped_basis:
        raise click.UsageError(
            "--alone and --shipped-basis are two ways to give the parties caches; give one"
        )
    caches = "shipped-basis" if shipped_basis else "alone" if alone else "shared"
    if smoke:
        parties, record_counts, settle = 2, (150,), 1.0
    with tempfile.TemporaryDirectory(prefix="capc-memory-") as tmp:
        work = work_dir or Path(tmp)
        rows, federations = [], []
        for mechanism in mechanisms:
            for records in record_counts:
                found, federation = measure(
                    work, mechanism=mechanism, records=records, parties=parties, settle=settle,
                    interval=interval, smoke=smoke, caches=caches, timeout=timeout,
                )  # fmt: skip
                rows += found
                federations.append(federation)
                if fmt == "text":
                    for row in found:
                        click.echo(
                            f"{mechanism:<16} {records:>7} {row['role']:<14} "
                            f"peak {row['peak_rss_mb']:>7} MB  steady {row['steady_rss_mb']} MB",
                            err=True,
                        )
    result = {
        "rows": rows,
        "federations": federations,
        "growth": growth(rows),
        "setup": {
            "parties": parties,
            "settle_s": settle,
            "interval_s": interval,
            "smoke": smoke,
            "caches": caches,
        },
    }
    if fmt == "json":
        click.echo(json.dumps(result))
    else:
        click.echo(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
