"""docker-compose.yml and deploy/ without a Docker engine: every command a container runs must be a valid
``capc`` invocation, every site file it names must load for its role, and the images run as non-root."""

from __future__ import annotations

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


def container_path(service: dict[str, Any], path: str) -> Path | None:
    """The repository file a container path comes from through the service's bind mounts (None: a volume)."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
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


@pytest.mark.parametrize("name", sorted(n for n in SERVICES if "--site" in SERVICES[n]["command"]))
def test_site_files_load_for_their_role(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = SERVICES[name]
    for key, value in service.get("environment", {}).items():  # as the container sees them
        monkeypatch.setenv(key, str(value))
    command = service["command"]
    role = command[0]
    site = container_path(service, command[command.index("--site") + 1])
    assert site is not None and site.is_file(), f"{name}: site file not in the repository via a bind mount"
    settings = SETTINGS[role].load(site)
    assert settings.party == name, f"service {name} runs party {settings.party}"
    assert settings.admin.bind.endswith(":8080"), "the healthcheck probes port 8080"
    assert settings.federation_config.role_of(name) == role


def test_certificate_job_covers_every_party_and_runs_first() -> None:
    command = SERVICES["certs"]["command"]
    parties = {command[i + 1] for i, arg in enumerate(command) if arg == "--party"}
    federation = FederationConfig.load(REPO / "deploy" / "compose" / "federation.yaml")
    assert parties == {federation.guardian, federation.student, *federation.teacher_names}
    assert set(SERVICES) == parties | {"certs"}
    for name in parties:
        assert SERVICES[name]["depends_on"]["certs"]["condition"] == "service_completed_successfully"


def test_volumes_are_declared_and_state_is_persistent() -> None:
    declared = set(COMPOSE["volumes"])
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith(("/", "./")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
        if name != "certs":
            assert any(v.endswith(":/var/lib/capc") for v in service["volumes"]), (
                f"{name} has no state volume"
            )
            assert any(v.startswith("certs:") and v.endswith(":ro") for v in service["volumes"])


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

    federation = FederationConfig.load(REPO / "deploy" / "compose" / "federation.yaml")
    assert load_backbone(federation.backbone.name).sha256 == federation.backbone.sha256
