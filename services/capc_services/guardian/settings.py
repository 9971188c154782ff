"""The guardian's site settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from capc_common.errors import InputError
from capc_services.common.admission import StreamLimits
from capc_services.common.settings import SiteSettings, check_admin_url, parse_bind


class GrpcSettings(BaseModel):
    """Where a party's gRPC server listens, and how much of it one peer may hold
    (:class:`~capc_services.common.admission.StreamLimits`).

    Attributes:
        bind: ``host:port``.
        max_workers: worker threads (each open call but a health watch holds one).
        max_calls_per_peer: calls one peer may have open at once (beyond: RESOURCE_EXHAUSTED).
        first_message_s: how long a stream may take to send its first message.
        idle_connection_s: a connection with no call for this long is closed.
    """

    model_config = ConfigDict(extra="forbid")
    bind: str = "0.0.0.0:50051"
    max_workers: int = Field(default=32, ge=4, le=1024)
    max_calls_per_peer: int = Field(default=StreamLimits.calls_per_peer, ge=2, le=1024)
    first_message_s: float = Field(default=StreamLimits.first_message_s, gt=0, le=600)
    idle_connection_s: float = Field(default=StreamLimits.idle_connection_s, ge=1, le=86400)

    def limits(self) -> StreamLimits:
        """The server's admission limits."""
        return StreamLimits(
            calls_per_peer=self.max_calls_per_peer,
            first_message_s=self.first_message_s,
            idle_connection_s=self.idle_connection_s,
        )

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        parse_bind(value)
        return value


class StudentAdminSettings(BaseModel):
    """Where the guardian reads the student's admin API (progress, model card) for its dashboard.

    Attributes:
        url: ``http://`` on this machine only; ``https://`` elsewhere (the student's ``admin.tls``), verified
            against the federation CA and pinned to the student's certificate.
        token_file: the *student's* admin token (its role's, not the guardian's).
    """

    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https?://")
    token_file: Path

    @field_validator("url")
    @classmethod
    def _no_cleartext_token(cls, value: str) -> str:
        try:
            return check_admin_url(value)
        except InputError as exc:
            raise ValueError(f"student_admin.url: {exc}") from None


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
