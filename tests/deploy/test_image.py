"""The image on a real engine: what a hospital's host directories look like from inside the container, and
Compose's fallback (Debian's docker-compose 1.29) running the certificate job."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from docker_harness import IMAGE, REPO, Engine, Project

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]

FEDERATION = REPO / "deploy" / "compose" / "federation-confident-gnmax.yaml"
UID = 10001


def host_site(root: Path, *, owner: int) -> Path:
    """A hospital's /srv/capc: federation.yaml, its site file (data under /data) and a certs directory."""
    capc = root / "capc"
    (capc / "certs").mkdir(parents=True)
    (capc / "federation.yaml").write_bytes(FEDERATION.read_bytes())
    site = yaml.safe_load((REPO / "deploy" / "compose" / "sites" / "hospital-a.yaml").read_text())
    site.update(federation="/etc/capc/federation.yaml", data={"dataset": "/data/hospital-a.npz"})
    # As docs/operations.md's site file: in a container the admin API listens on all interfaces, which a
    # party accepts only over HTTPS with its own certificate (``allow_remote`` and ``tls`` together).
    site["admin"].update(allow_remote=True, tls=True)
    (capc / "hospital-a.yaml").write_text(yaml.safe_dump(site))
    (capc / "certs" / "ca.crt").write_text("placeholder")
    for path in (capc, capc / "certs", *capc.rglob("*")):
        os.chown(path, owner, owner)
        path.chmod(0o700 if path.is_dir() else 0o600)
    return capc


def train(engine: Engine, *mounts: str) -> Any:
    return engine.docker(
        "run", "--rm", *mounts, IMAGE, "teacher", "train", "--site", "/etc/capc/hospital-a.yaml", check=False
    )


def test_only_state_is_a_volume_so_a_bind_mount_of_etc_capc_is_what_the_container_sees(
    engine: Engine, image: dict[str, Any], tmp_path: Path
) -> None:
    # A VOLUME on /etc/capc/certs (as the image once declared) put an empty anonymous volume over the
    # certificates of `--mount …,dst=/etc/capc`: teachers found no certificates.
    volumes = engine.docker("image", "inspect", "-f", "{{json .Config.Volumes}}", IMAGE).stdout.strip()
    assert volumes == '{"/var/lib/capc":{}}', volumes
    capc = host_site(tmp_path, owner=UID)
    listed = engine.docker(
        "run", "--rm", "--mount", f"type=bind,src={capc},dst=/etc/capc,readonly", "--entrypoint", "ls",
        IMAGE, "/etc/capc/certs",
    )  # fmt: skip
    assert listed.stdout.split() == ["ca.crt"]
    user = engine.docker("run", "--rm", "--entrypoint", "id", IMAGE).stdout
    assert user.startswith(f"uid={UID}(capc) gid={UID}(capc)"), user


def test_no_private_key_or_token_is_baked_into_the_image(engine: Engine, image: dict[str, Any]) -> None:
    # Keys and tokens are made at run time into volumes; none may come with the build context.
    places = "/etc /var /home /tmp /opt/capc/venv/lib/python3.11/site-packages/capc_*"
    pem = r"^-----BEGIN ([A-Z]+ )?PRIVATE KEY-----$"
    found = engine.docker(
        "run", "--rm", "--entrypoint", "sh", IMAGE, "-c",
        f"grep -rlIE '{pem}' {places} 2>/dev/null; find {places} -name '*.token' -o -name '*.key' 2>&-",
        check=False,
    )  # fmt: skip
    assert found.stdout.strip() == "", found.stdout


def test_host_files_the_container_uid_cannot_read_give_a_clear_error(
    engine: Engine, image: dict[str, Any], tmp_path: Path, require: Callable[[bool, str], None]
) -> None:
    require(os.geteuid() == 0, "making host files owned by another uid needs root")
    capc = host_site(tmp_path, owner=0)  # root-owned, 0600: what a plain `cp` as root leaves behind
    proc = train(engine, "--mount", f"type=bind,src={capc},dst=/etc/capc,readonly")
    assert proc.returncode == 2, proc.stderr
    assert "permission denied: /etc/capc/hospital-a.yaml (this process runs as uid 10001" in proc.stderr
    assert "chown -R 10001:10001" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_host_data_directory_is_refused_or_explained(
    engine: Engine, image: dict[str, Any], tmp_path: Path
) -> None:
    capc = host_site(tmp_path, owner=UID)
    missing = tmp_path / "no-such-data"
    # --mount (as the docs write it): Docker itself refuses, before the container starts.
    proc = train(engine, "--mount", f"type=bind,src={capc},dst=/etc/capc,readonly",
                 "--mount", f"type=bind,src={missing},dst=/data,readonly")  # fmt: skip
    assert proc.returncode == 125 and "bind source path does not exist" in proc.stderr, proc.stderr
    assert not missing.exists()
    # -v creates the missing host directory and mounts it empty: the teacher says what that means.
    proc = train(
        engine, "--mount", f"type=bind,src={capc},dst=/etc/capc,readonly", "-v", f"{missing}:/data:ro"
    )
    assert proc.returncode == 2, proc.stderr
    assert "npz dataset /data/hospital-a.npz does not exist" in proc.stderr
    assert "The directory /data is empty: in a container, mount the host directory" in proc.stderr


def test_compose_fallback_docker_compose_1_29_runs_the_certificate_job(
    engine: Engine, image: dict[str, Any], require: Callable[[bool, str], None]
) -> None:
    import shutil

    require(
        engine.compose == ["docker", "compose"],
        "the fallback is checked where both Compose v2 and docker-compose 1.29 exist; no Compose v2 plugin "
        "(deploy/docker-here.sh install)",
    )
    require(
        shutil.which("docker-compose") is not None,
        "docker-compose 1.29 is not installed (deploy/docker-here.sh install)",
    )
    legacy = Engine(compose=["docker-compose"])
    env = {"CAPC_IMAGE": image["tag"], "CAPC_BASE_IMAGE": image["base"]}
    project = Project(legacy, f"capclegacytest{os.getpid()}", env)
    try:
        project.compose("config", "-q")
        project.compose("run", "--rm", "certs")
        certs = project.volume_dir("certs")
        federation = yaml.safe_load(FEDERATION.read_text())
        for party in ["guardian", "student", *(t["name"] for t in federation["teachers"])]:
            key = certs / f"{party}.key"
            assert (certs / f"{party}.crt").is_file() and stat.S_IMODE(key.stat().st_mode) == 0o600
            assert key.stat().st_uid == UID, "the job runs as the image's user"
        for role in ("guardian", "student", "teacher"):  # one admin token per role
            assert stat.S_IMODE((certs / f"{role}.token").stat().st_mode) == 0o600
    finally:
        project.compose("down", "-v", check=False)
