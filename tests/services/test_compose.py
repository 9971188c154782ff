"""docker-compose.yml and deploy/ without a Docker engine: every command a container runs must be a valid
``capc`` invocation, every site file it names must load for its role, and the images run as non-root."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from capc_cli.main import cli
from capc_common.federation import FederationConfig
from capc_services.guardian.settings import GuardianSettings
from capc_services.student.settings import StudentSettings
from capc_services.teacher.settings import TeacherSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
SETTINGS = {"guardian": GuardianSettings, "student": StudentSettings, "teacher": TeacherSettings}


def resolve(args: list[str]) -> click.Context:
    """Parse ``capc ARGS`` down to the leaf command without running it (raises on any bad argument)."""
    command: click.Command = cli
    ctx = command.make_context("capc", list(args))
    while isinstance(command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        assert rest, f"`capc {' '.join(args)}` names a group, not a command"
        _, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None
        command = sub
        ctx = command.make_context(sub.name, rest, parent=ctx)
    return ctx


def mounts(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of every mount, short (``src:dst[:ro]``) or long syntax."""
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found.append((volume["source"], volume["target"], bool(volume.get("read_only"))))
        else:
            parts = volume.split(":")
            found.append((parts[0], parts[1], parts[2:] == ["ro"]))
    return found


def container_path(service: dict[str, Any], path: str) -> Path | None:
    """The repository file a container path comes from through the service's bind mounts (None: a volume)."""
    for source, target, _ in mounts(service):
        if source.startswith("./") and path.startswith(target + "/"):
            return REPO / source / path[len(target) + 1 :]
    return None


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_command_is_a_valid_capc_invocation(name: str) -> None:
    service = SERVICES[name]
    ctx = resolve(service["command"])
    assert ctx.command.name in {"serve", "run", "bootstrap"}
    health = service.get("healthcheck", {}).get("test")
    if health:
        assert health[:2] == ["CMD", "capc"], f"{name}'s healthcheck must run capc, got {health}"
        resolve(health[2:])


def _substituted(value: str, mechanism: str) -> str:
    """A compose value as the container gets it: ``${CAPC_MECHANISM:-…}`` set to ``mechanism``."""
    return re.sub(r"\$\{CAPC_MECHANISM:-[^}]*\}", mechanism, value)


@pytest.mark.parametrize("mechanism", ["secagg-dpsgd", "confident-gnmax"])
@pytest.mark.parametrize("name", sorted(n for n in SERVICES if "--site" in SERVICES[n]["command"]))
def test_site_files_load_for_their_role(name: str, mechanism: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = SERVICES[name]
    for key, value in service.get("environment", {}).items():  # as the container sees them
        value = _substituted(str(value), mechanism)
        host = container_path(service, value) if value.startswith("/etc/capc/config/") else None
        monkeypatch.setenv(key, str(host or value))
    command = service["command"]
    role = command[0]
    site = container_path(service, command[command.index("--site") + 1])
    assert site is not None and site.is_file(), f"{name}: site file not in the repository via a bind mount"
    settings = SETTINGS[role].load(site)
    assert settings.party == name, f"service {name} runs party {settings.party}"
    assert settings.admin.bind.endswith(":8080"), "the healthcheck probes port 8080"
    assert settings.federation_config.role_of(name) == role
    assert settings.federation_config.mechanism.name == mechanism


#: ``CAPC_MECHANISM`` → the federation file every compose party loads (docker-compose.yml's environment).
MECHANISMS = ("secagg-dpsgd", "confident-gnmax")


def _federation_file(mechanism: str) -> Path:
    return REPO / "deploy" / "compose" / f"federation-{mechanism}.yaml"


def test_capc_mechanism_picks_a_federation_file_for_every_party() -> None:
    """``CAPC_MECHANISM=… docker compose up`` (default secagg-dpsgd): every party's environment names the
    mechanism's file inside the mounted configuration, and each such file is a runnable federation of the
    same parties running that mechanism."""
    from capc_common.federation import check_runnable

    for name, service in SERVICES.items():
        if name == "certs":
            continue
        path = service["environment"]["CAPC_FEDERATION"]
        assert path == "/etc/capc/config/federation-${CAPC_MECHANISM:-secagg-dpsgd}.yaml", name
        assert ("./deploy/compose", "/etc/capc/config", True) in mounts(service), name
    for mechanism in MECHANISMS:
        federation = FederationConfig.load(_federation_file(mechanism))
        assert federation.mechanism.name == mechanism
        check_runnable(federation, model=False)
        assert set(federation.teacher_names) == {"hospital-a", "hospital-b", "hospital-c"}


def test_certificate_job_covers_every_party_and_runs_first() -> None:
    command = SERVICES["certs"]["command"]
    parties = {command[i + 1] for i, arg in enumerate(command) if arg == "--party"}
    for mechanism in MECHANISMS:
        federation = FederationConfig.load(_federation_file(mechanism))
        assert parties == {federation.guardian, federation.student, *federation.teacher_names}
    assert set(SERVICES) == parties | {"certs"}
    for name in parties:
        assert SERVICES[name]["depends_on"]["certs"]["condition"] == "service_completed_successfully"


def test_volumes_are_declared_and_state_is_persistent() -> None:
    declared = set(COMPOSE["volumes"])
    for name, service in SERVICES.items():
        for source, _, _ in mounts(service):
            if not source.startswith(("/", "./", "${")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
        if name != "certs":
            assert any(target == "/var/lib/capc" for _, target, _ in mounts(service)), f"{name} has no state"
            assert ("certs", "/etc/capc/certs", True) in mounts(service)


def test_host_directories_are_long_form_bind_mounts_so_a_missing_one_is_refused() -> None:
    # Short syntax (`/host:/container`) makes Docker create a missing host directory and mount it empty.
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            if isinstance(volume, str) and volume.startswith("/"):
                raise AssertionError(f"{name}: host path in short syntax: {volume}")


def test_image_runs_as_non_root_with_a_healthcheck() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users and not users[-1].startswith(("root", "0")), "the image must end as a non-root user"
    assert "HEALTHCHECK" in dockerfile
    for name, service in SERVICES.items():
        assert service.get("user") in (None, "10001:10001"), f"{name} overrides the non-root user"
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"


def test_compose_federation_pins_the_backbone_the_library_builds() -> None:
    from capc_common.models import load_backbone

    for mechanism in MECHANISMS:
        federation = FederationConfig.load(_federation_file(mechanism))
        assert load_backbone(federation.backbone.name).sha256 == federation.backbone.sha256


def test_the_image_pins_the_bootstrap_torch_and_takes_its_base_as_an_argument() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    pins = set(re.findall(r'"torch==([\d.]+)"', bootstrap))
    assert len(pins) == 1, pins
    pin = pins.pop()
    assert f"ARG TORCH_VERSION={pin}\n" in dockerfile
    assert f"\nTORCH_VERSION={pin}\n" in (REPO / "deploy" / "docker-here.sh").read_text()
    assert dockerfile.count("FROM ${BASE_IMAGE}") == 2 and "ARG BASE_IMAGE=python:3.11-slim\n" in dockerfile
    assert SERVICES["guardian"]["build"]["args"]["BASE_IMAGE"] == "${CAPC_BASE_IMAGE:-python:3.11-slim}"


def test_nothing_under_etc_capc_is_a_volume() -> None:
    # A VOLUME there hides the bind mount of the host's /etc/capc (the teacher then finds no certificates).
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    volumes = [v for line in re.findall(r"^VOLUME (.*)$", dockerfile, flags=re.M) for v in json.loads(line)]
    assert volumes == ["/var/lib/capc"], volumes


def test_the_build_context_leaves_out_the_virtualenv_and_git() -> None:
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:1] == ["*"], "allow-list: ignore everything, then name what is copied"
    copied = set(re.findall(r"^COPY (?!--from)(.*) \S+$", (REPO / "deploy" / "Dockerfile").read_text(), re.M))
    sources = {part.rstrip("/") for line in copied for part in line.split()}
    assert sources <= {entry[1:].rstrip("/") for entry in ignore if entry.startswith("!")}, sources
