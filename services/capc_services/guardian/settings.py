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


class GuardianSettings(SiteSettings):
    """``capc guardian serve --site FILE``.

    Attributes:
        grpc: the gRPC listener (student and teachers connect here).
        ledger: the budget ledger's file (durable; back it up).
    """

    grpc: GrpcSettings = GrpcSettings()
    ledger: Path

    def check_role(self) -> None:
        self._require_role("guardian")

    def listen_addresses(self) -> dict[str, str]:
        return {**super().listen_addresses(), "grpc.bind": self.grpc.bind}
