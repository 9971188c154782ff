"""Start, watch and stop the processes of a local federation.

Each party runs as its own ``python -m capc_cli ...`` process, detached into its own session with its log
in the state directory; ``state.json`` records the process ids this tool started, and ``down`` signals
exactly those (SIGTERM, then SIGKILL after a grace period), never anything found by name.

A :class:`Launch` places a party elsewhere than on this machine's loopback — a test harness runs each party
in its own network namespace behind a link it shapes (``capc_services.lab``): a command prefix, environment
overrides of its site file (its peers' addresses) and the host its admin API answers on. ``state.json``
keeps it, so a party restarted alone comes back in the same place.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import yaml

from capc_common.errors import CapcError, InputError, UnavailableError
from capc_common.federation import FederationConfig
from capc_services.common.admin_client import tls_client
from capc_services.common.settings import check_admin_url, load_admin_token
from capc_services.local.layout import Layout
from capc_services.local.provision import Endpoints


@dataclass(frozen=True)
class Launch:
    """Where a party process runs.

    Attributes:
        wrap: a command prefix the party's command runs under (``nsenter --net=NS --``); it must exec the
            command, so the recorded process id is the party's.
        env: environment overrides (site-file values such as ``CAPC_GUARDIAN_ADDRESS``).
        admin_host: the host its admin API answers on, from here.
        admin_scheme: ``https`` where that host is not this machine's loopback (the party sets ``admin.tls``).
    """

    wrap: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    admin_host: str = "127.0.0.1"
    admin_scheme: str = "http"


Placement = Callable[[str, str], Launch]
"""``placement(party, role)``: where ``capc local up`` starts that party."""


@dataclass(frozen=True)
class PartyProcess:
    """One running party (and where it runs: see :class:`Launch`)."""

    party: str
    role: str
    pid: int
    admin_url: str
    wrap: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        data: dict[str, Any] = {
            "party": self.party,
            "role": self.role,
            "pid": self.pid,
            "admin_url": self.admin_url,
        }
        if self.wrap or self.env:
            data.update(wrap=list(self.wrap), env=dict(self.env))
        return data

    def launch(self) -> Launch:
        """Where it runs, to start it again in the same place."""
        scheme, _, rest = self.admin_url.partition("://")
        host = rest.rsplit(":", 1)[0]
        return Launch(wrap=self.wrap, env=dict(self.env), admin_host=host, admin_scheme=scheme)


def _command(role: str, site: Path) -> list[str]:
    verb = {"guardian": "serve", "student": "run", "teacher": "serve"}[role]
    return [sys.executable, "-m", "capc_cli", role, verb, "--site", str(site)]


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists and has not exited: our own child is reaped here; another
    process's child that exited is a zombie until its parent reaps it, and counts as dead (a tool that
    attaches to a federation another process started, e.g. the chaos campaign, kills parties it is not
    the parent of)."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` exited and waits for its parent to reap it (its state in ``/proc``; without procfs,
    only our own children can be told dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def start_party(
    layout: Layout,
    *,
    party: str,
    role: str,
    admin_port: int,
    env: Mapping[str, str] | None = None,
    launch: Launch | None = None,
) -> PartyProcess:
    """Launch one party process detached from this one, logging to ``logs/PARTY.log``.

    Args:
        layout: the state directory.
        party: the party's name.
        role: ``guardian``, ``student`` or ``teacher``.
        admin_port: its admin port (from the endpoints).
        env: extra environment variables for this start only (e.g. ``CAPC_FAULTS`` in a chaos run).
        launch: where it runs (default: this machine's loopback).
    """
    launch = launch or Launch()
    layout.logs.mkdir(parents=True, exist_ok=True)
    log = layout.log(party).open("ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **launch.env, **(env or {})}
    proc = subprocess.Popen(
        [*launch.wrap, *_command(role, layout.site(party))],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,
        cwd=layout.root,
    )
    log.close()
    return PartyProcess(
        party=party,
        role=role,
        pid=proc.pid,
        admin_url=f"{launch.admin_scheme}://{launch.admin_host}:{admin_port}",
        wrap=launch.wrap,
        env=dict(launch.env),
    )


def train_parties(
    layout: Layout, parties: list[str], *, env: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Each party trains its heads in its own ``capc teacher train`` process, all at once (their output goes
    to their logs): as on the hospitals' own machines, one party's featurisation does not wait for another's,
    and a machine with several cores runs them side by side. ``env`` adds environment variables (e.g.
    ``CAPC_FEDERATION``: a party added by a membership change trains under the new file before it is in
    place).

    Returns:
        party → what ``capc teacher train --format json`` printed.

    Raises:
        CapcError: a party's training failed (the error class of its exit code; the message is its own).
    """
    layout.logs.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[subprocess.Popen[str], Any]] = {}
    for party in parties:
        log = layout.log(party).open("a")
        command = [sys.executable, "-m", "capc_cli", "teacher", "train", "--site", str(layout.site(party))]
        proc = subprocess.Popen(
            [*command, "--format", "json"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, **(env or {})},
        )
        running[party] = (proc, log)
    results: dict[str, dict[str, Any]] = {}
    failed: list[tuple[int, str]] = []
    for party, (proc, log) in running.items():
        out, _ = proc.communicate()
        log.close()
        if proc.returncode == 0:
            results[party] = json.loads(out)
        else:
            failed.append((proc.returncode, f"{party}: {failure_reason(layout.log(party))}"))
    if failed:
        code = failed[0][0]
        kind = next((c for c in (InputError, UnavailableError) if c.exit_code == code), CapcError)
        raise kind("; ".join(message for _, message in failed))
    return results


def write_state(layout: Layout, *, endpoints: Endpoints, processes: list[PartyProcess]) -> None:
    """Record what ``up`` started (atomically)."""
    data = {
        "root": str(layout.root),
        "endpoints": endpoints.to_dict(),
        "processes": [p.to_dict() for p in processes],
        "started": time.time(),
    }
    tmp = layout.state.with_name("state.json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(layout.state)


def not_started(layout: Layout) -> InputError:
    """The error for a state directory no ``capc local up`` started a federation in (a mistyped or
    relative ``--state-dir``, most often: the default ``.capc/local`` is relative to where ``up`` ran)."""
    return InputError(
        f"no local federation was started in {layout.root} (no state.json there). If one runs, pass the "
        "--state-dir it was started with (`capc local up` prints it; the default .capc/local is relative to "
        f"the directory it ran in); otherwise start one: `{layout.command('up')}`"
    )


def read_state(layout: Layout) -> dict[str, Any]:
    """What ``up`` recorded.

    Raises:
        InputError: nothing was started from this state directory.
    """
    if not layout.state.exists():
        raise not_started(layout)
    data: dict[str, Any] = json.loads(layout.state.read_text())
    return data


def processes_of(state: dict[str, Any]) -> list[PartyProcess]:
    """The recorded processes."""
    return [
        PartyProcess(**{**p, "wrap": tuple(p.get("wrap", ())), "env": dict(p.get("env", {}))})
        for p in state["processes"]
    ]


@cache
def _client(ca: Path | None, party: str | None) -> httpx.Client:
    """One HTTP client per CA and party for this process's probes: ``httpx.get`` builds a client, TLS context
    included, per call (50 ms of CPU each, measured), and ``wait_ready`` and the demo probe several parties
    every second."""
    return tls_client(ca=ca, party=party)


def probe(
    url: str,
    *,
    token: str | None = None,
    timeout: float = 2.0,
    ca: Path | None = None,
    party: str | None = None,
) -> tuple[int, Any]:
    """GET ``url``; returns ``(status, json body)`` or ``(0, error text)`` when nothing answers.

    An ``https://`` party (off loopback) is verified against ``ca`` under ``party``'s name.

    Raises:
        InputError: a token would go over plain HTTP to another machine.
    """
    if token:
        check_admin_url(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = _client(ca, party).get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return 0, str(exc)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def token(layout: Layout, party: str | None = None) -> str:
    """The admin token of ``party``'s role (default: the guardian), read from the file its site file names.

    Raises:
        InputError: the token file is missing or unusable.
    """
    party = party or federation_of(layout).guardian
    site = layout.site(party)
    named = yaml.safe_load(site.read_text())["admin"]["token_file"]
    return load_admin_token((site.parent / named).resolve())


def wait_ready(
    layout: Layout,
    processes: list[PartyProcess],
    *,
    timeout: float,
    on_ready: Callable[[PartyProcess], None] | None = None,
) -> None:
    """Poll every party's ``/readyz`` until all are ready.

    Raises:
        UnavailableError: a process exited, or not all were ready within ``timeout`` seconds (the message
            names them and the last lines of their logs).
    """
    pending = {p.party: p for p in processes}
    secrets = {p.party: token(layout, p.party) for p in processes}  # with it, /readyz says what fails
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while pending:
        for party, proc in list(pending.items()):
            if not pid_alive(proc.pid):
                raise UnavailableError(
                    f"{party} (pid {proc.pid}) exited during start-up: {failure_reason(layout.log(party))} "
                    f"(log: {layout.log(party)})"
                )
            code, body = probe(
                f"{proc.admin_url}/readyz", token=secrets[party], ca=layout.certs / "ca.crt", party=party
            )
            last[party] = body
            if code == 200:
                del pending[party]
                if on_ready is not None:
                    on_ready(proc)
        if not pending:
            return
        if time.monotonic() > deadline:
            details = "; ".join(f"{p}: {last.get(p)}" for p in sorted(pending))
            raise UnavailableError(f"not ready after {timeout:.0f} s: {details}")
        time.sleep(0.25)


def tail(path: Path, *, lines: int = 8) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def failure_reason(path: Path) -> str:
    """Why the process logging to ``path`` stopped: the CLI's last ``error: …`` line (what it exits with),
    else the last error record's message (a JSON-lines log), else the log's last line."""
    lines = [line for line in tail(path, lines=200).splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line.removeprefix("error: ")
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in ("error", "critical"):
            return str(record.get("error") or record.get("msg", "")).strip()
    return lines[-1] if lines else f"nothing in its log {path}"


def is_ours(proc: PartyProcess) -> bool:
    """Whether ``proc.pid`` is still the party process we started (guards against a reused pid)."""
    if not pid_alive(proc.pid):
        return False
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    if not cmdline.exists():
        return True  # no procfs: the pid check is all we have
    try:
        args = cmdline.read_bytes().split(b"\0")
    except OSError:
        return False
    return b"capc_cli" in args and f"{proc.party}.yaml".encode() in b" ".join(args)


def stop_processes(processes: list[PartyProcess], *, grace: float = 15.0) -> dict[str, str]:
    """SIGTERM each recorded process, SIGKILL those still alive after ``grace`` seconds.

    Only processes that are still the ones ``up`` started are signalled (see :func:`is_ours`).

    Returns:
        party → ``stopped``, ``killed`` or ``not running``.
    """
    outcome = {p.party: "not running" for p in processes}
    processes = [p for p in processes if is_ours(p)]
    for proc in processes:
        os.kill(proc.pid, signal.SIGTERM)
        # A stopped process (SIGSTOP, ^Z) handles its SIGTERM only once it is continued.
        os.kill(proc.pid, signal.SIGCONT)
        outcome[proc.party] = "stopped"
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p.pid) for p in processes):
        time.sleep(0.1)
    for proc in processes:
        if pid_alive(proc.pid):
            os.kill(proc.pid, signal.SIGKILL)
            outcome[proc.party] = "killed"
    return outcome


def federation_of(layout: Layout) -> FederationConfig:
    """The federation config of a state directory."""
    return FederationConfig.load(layout.federation)
