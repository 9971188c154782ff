"""The guardian's site settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from capc_services.common.settings import SiteSettings, parse_bind


class GrpcSettings(BaseModel):
    """Where a party's gRPC server listens."""

    model_config = ConfigDict(extra="forbid")
    bind: str = "0.0.0.0:50051"
    max_workers: int = Field(default=32, ge=4, le=1024)

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        parse_bind(value)
        return value


class StudentAdminSettings(BaseModel):
    """Where the guardian reads the student's admin API (progress, model card) for its dashboard."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https?://")
    token_file: Path


class GuardianSettings(SiteSettings):
    """``capc guardian serve --site FILE``.

    Attributes:
        grpc: the gRPC listener (student and teachers connect here).
        ledger: the budget ledger's file (durable; back it up).
        student_admin: the student's admin API, relayed on ``/api/v1/student`` for the dashboard and
            ``capc budget watch`` (optional: without it they show the student as not reachable).
        force: the operator's reason to run a federation that the pre-spend checks refuse as a judgement
            (:mod:`capc_common.federation.refusals`; a certain refusal cannot be forced). Without it the
            guardian refuses every batch of such a federation before the first charge; with it, it logs
            what it overrode and why.
    """

    grpc: GrpcSettings = GrpcSettings()
    ledger: Path
    student_admin: StudentAdminSettings | None = None
    force: str | None = Field(default=None, min_length=1, max_length=2000)

    def check_role(self) -> None:
        self._require_role("guardian")

    def listen_addresses(self) -> dict[str, str]:
        return {**super().listen_addresses(), "grpc.bind": self.grpc.bind}
