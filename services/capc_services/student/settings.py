"""The student's site settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from capc_services.common.settings import SiteSettings
from capc_services.guardian.settings import GrpcSettings


class EvaluateSettings(BaseModel):
    """Optional held-out evaluation of the published student (reported in the model card)."""

    model_config = ConfigDict(extra="forbid")
    dataset: str
    limit: int | None = Field(default=None, ge=16)


class TrainSettings(BaseModel):
    """How the student's head is trained once labelling ends.

    Attributes:
        device: where features are computed.
        evaluate: optional held-out evaluation.
        chunk_queries: most queries whose features are held in memory at once; a longer run is fitted in
            chunks and its head averaged (see ``capc_services.student.training``).
    """

    model_config = ConfigDict(extra="forbid")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    evaluate: EvaluateSettings | None = None
    chunk_queries: int = Field(default=16384, ge=256)


class StudentSettings(SiteSettings):
    """``capc student run --site FILE``.

    Attributes:
        grpc: the listener teacher parties dial into.
        guardian_address: ``host:port`` of the guardian.
        store: the durable label store (SQLite).
        output_dir: where ``student.safetensors`` and ``model_card.json`` are published.
        pipeline_depth: collected batches that may wait for the 2PC (1 = teachers vote on batch k+1 while
            batch k is computed; 0 = one batch at a time).
        connect_timeout_s: how long to wait for a quorum of teacher parties before giving up.
        exit_when_done: exit after publishing (a one-shot job) instead of serving the admin API on.
        torch_threads: CPU threads for torch and numpy's BLAS (None: their defaults).
        feature_cache: a directory of *public* images' features and arrays
            (:class:`~capc_common.models.cache.FeatureCache`): shared with the teachers of the same machine (a
            local federation), or the student's own, seeded with the public basis file ``capc federation
            basis`` wrote (read instead of computed, checked against ``federation.yaml``'s pin).
    """

    grpc: GrpcSettings = GrpcSettings(bind="0.0.0.0:50052")
    guardian_address: str
    store: Path
    output_dir: Path
    pipeline_depth: int = Field(default=1, ge=0, le=8)
    connect_timeout_s: float = Field(default=600.0, gt=0)
    exit_when_done: bool = False
    torch_threads: int | None = Field(default=None, ge=1)
    train: TrainSettings = TrainSettings()
    feature_cache: Path | None = None

    def check_role(self) -> None:
        self._require_role("student")

    def listen_addresses(self) -> dict[str, str]:
        return {**super().listen_addresses(), "grpc.bind": self.grpc.bind}
