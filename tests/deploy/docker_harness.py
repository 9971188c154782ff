"""A real Docker engine, the project's image and Compose for the container tests.

The engine: the one already running, else ``dockerd`` started here (root only; stopped again at the end of the
session, and only if started here). The image: ``deploy/Dockerfile`` built with the classic builder from a
base image made of Debian packages (``deploy/docker-here.sh base``, since no container registry is reachable
from this project's machines) and the offline wheelhouse (``deploy/docker-here.sh wheels``). Both layers and
base image stay in the engine's cache between runs on one machine, so a rebuild after a source change takes
seconds. Compose: the v2 plugin (``docker compose``) where present, else Debian's ``docker-compose`` 1.29.

Where no engine can be had (no Docker installed, not root, dockerd fails), :func:`engine_or_skip_reason`
returns the reason and the tests skip with it; ``CAPC_SKIP_DOCKER=1`` skips them on purpose.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
# One tag per checkout, so sessions in several worktrees sharing one engine never run each other's code
# (layers are shared all the same); docker-compose.yml takes it as CAPC_IMAGE.
IMAGE = os.environ.get("CAPC_IMAGE") or f"diet-capc:test-{hashlib.sha256(bytes(REPO)).hexdigest()[:8]}"
# Sessions using the engine hold this lock shared; the one that started dockerd stops it only if it can then
# take the lock exclusively, i.e. no other session is still using the engine.
ENGINE_LOCK = Path("/tmp/capc-docker-engine.lock")
DEFAULT_BASE = "capc-base:bookworm"
HERE_SCRIPT = REPO / "deploy" / "docker-here.sh"


def run(
    *args: str, timeout: float = 600, check: bool = True, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run a command, raising with its output tail when ``check`` and it fails."""
    proc = subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"`{' '.join(args)}` exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


@dataclass
class Engine:
    """A reachable Docker engine, and the dockerd process this session started (None: it was running)."""

    compose: list[str]
    started: subprocess.Popen[bytes] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    lock: IO[bytes] | None = None

    def docker(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``docker ARGS``."""
        return run("docker", *args, **kwargs)

    def stop(self) -> None:
        """Stop dockerd if this session started it and no other session uses it (never one found running)."""
        if self.lock is not None:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
        if self.started is None or self.started.poll() is not None:
            return
        if self.lock is not None:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another session still uses the engine: leave it running
        self.started.terminate()
        try:
            self.started.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.started.kill()
            self.started.wait(timeout=10)


def _engine_up() -> bool:
    return run("docker", "info", "--format", "{{.ServerVersion}}", check=False, timeout=30).returncode == 0


def _compose_command() -> list[str] | None:
    """``docker compose`` (v2 plugin) if it works, else Debian's ``docker-compose`` 1.29, else None."""
    if run("docker", "compose", "version", check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def engine_or_skip_reason(log: Path) -> Engine | str:
    """A running engine (started here if needed), or why there cannot be one on this machine."""
    if os.environ.get("CAPC_SKIP_DOCKER") == "1":
        return "CAPC_SKIP_DOCKER=1: container tests skipped on request"
    if shutil.which("docker") is None:
        return "no docker CLI on PATH (on Debian as root: deploy/docker-here.sh install)"
    lock = ENGINE_LOCK.open("ab")
    fcntl.flock(lock, fcntl.LOCK_SH)
    started: subprocess.Popen[bytes] | None = None
    if not _engine_up():
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            return "no Docker engine running and no dockerd to start (deploy/docker-here.sh install)"
        if os.geteuid() != 0:
            return "no Docker engine running, and starting dockerd needs root"
        # No iptables: these machines have no netfilter rights to spare; published ports still work through
        # docker-proxy and containers on one user-defined network reach each other by name.
        with log.open("wb") as sink:
            started = subprocess.Popen(
                [dockerd, "--iptables=false"], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 90
        while not _engine_up():
            if started.poll() is not None or time.monotonic() > deadline:
                started.kill()
                started.wait(timeout=10)
                tail = log.read_text(errors="replace")[-1500:]
                return f"dockerd could not start (exit {started.returncode}); its log ends:\n{tail}"
            time.sleep(1)
    engine = Engine(compose=_compose_command() or [], started=started, lock=lock)
    if not engine.compose:
        engine.stop()
        return "no Compose: neither `docker compose` (v2) nor docker-compose (deploy/docker-here.sh install)"
    return engine


def base_image(engine: Engine) -> str:
    """The base image: $CAPC_BASE_IMAGE, else one made from Debian packages, else python:3.11-slim."""
    chosen = os.environ.get("CAPC_BASE_IMAGE")
    if chosen:
        return chosen
    if engine.docker("image", "inspect", DEFAULT_BASE, check=False).returncode == 0:
        return DEFAULT_BASE
    if shutil.which("mmdebstrap"):
        start = time.monotonic()
        run(str(HERE_SCRIPT), "base", timeout=1200)
        engine.timings["base_image_s"] = round(time.monotonic() - start, 1)
        return DEFAULT_BASE
    return "python:3.11-slim"


def build_image(engine: Engine, log: Path) -> dict[str, Any]:
    """Build ``diet-capc:latest`` (cached layers reused); returns the base, seconds and size."""
    base = base_image(engine)
    run(str(HERE_SCRIPT), "wheels", timeout=1200)
    start = time.monotonic()
    proc = run(
        "docker",
        "build",
        "-f",
        "deploy/Dockerfile",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "-t",
        IMAGE,
        ".",
        env={"DOCKER_BUILDKIT": "0"},
        timeout=3600,
        check=False,
    )
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise AssertionError(
            f"docker build failed (exit {proc.returncode}); log {log}:\n{proc.stdout[-4000:]}"
        )
    size = int(engine.docker("image", "inspect", "-f", "{{.Size}}", IMAGE).stdout)
    seconds = round(time.monotonic() - start, 1)
    return {"tag": IMAGE, "base": base, "build_s": seconds, "size_mb": round(size / 1e6)}


class Project:
    """One Compose project (``-p NAME``) of the repository's docker-compose.yml."""

    def __init__(self, engine: Engine, name: str, env: dict[str, str]) -> None:
        self.engine = engine
        self.name = name
        self.env = env

    def compose(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker compose -p NAME ARGS`` in the repository."""
        return run(*self.engine.compose, "-p", self.name, *args, env=self.env, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        """The container id of ``service`` (stopped ones too)."""
        ids = self.compose("ps", "-a", "-q", service).stdout.split()
        assert len(ids) == 1, f"expected one container for {service}, got {ids}"
        return ids[0]

    def volume_dir(self, volume: str) -> Path:
        """Where a named volume of this project lies on the host."""
        info = json.loads(self.engine.docker("volume", "inspect", f"{self.name}_{volume}").stdout)
        return Path(info[0]["Mountpoint"])

    def logs(self) -> str:
        """Every service's log (for failure messages)."""
        return self.compose("logs", "--no-color", check=False).stdout[-20000:]
