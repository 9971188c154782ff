"""A teacher party's site settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capc_common.data import HOLDOUT_FRACTION
from capc_services.common.settings import SiteSettings


class CapSettings(BaseModel):
    """The party's own worst-case ε cap and where its record of released shares is kept."""

    model_config = ConfigDict(extra="forbid")
    epsilon: float = Field(gt=0)
    record: Path


class LifetimeSettings(BaseModel):
    """The hospital's lifetime budget across federations and where its site ledger is kept.

    Every site file of the hospital (one per federation) names the same ledger, on the hospital's own volume
    (:mod:`capc_services.teacher.site_ledger`).

    Attributes:
        epsilon: the most ε every federation together may charge on the hospital's records.
        ledger: the site ledger (JSON lines).
        delta: the lifetime δ; fixed when the ledger is created (None: the first federation's δ).
        order: the Rényi order the ledger sums at; fixed when it is created (None: the order at which the
            limit holds the most federations like the first one it joins).
    """

    model_config = ConfigDict(extra="forbid")
    epsilon: float = Field(gt=0)
    ledger: Path
    delta: float | None = Field(default=None, gt=0, lt=1)
    order: float | None = Field(default=None, gt=1)


class DataSettings(BaseModel):
    """The site's own labelled data, for ``capc teacher train``.

    Every selection here is by a keyed hash of each example's own content
    (:func:`capc_common.data.site_part`), never by position or count, so the guarantee the model card states
    — for datasets that differ by adding or removing one example — holds for the site's whole file.

    Attributes:
        dataset: a dataset name the library knows (e.g. ``fashion-mnist``).
        shard / shards: this site's disjoint part of the dataset when several simulated sites share one
            (a real site uses ``shards: 1``).
        seed: seed of the split's hash.
        fraction: keep about this share of the site's examples (each kept or not by its own hash).
        sha256: the SHA-256 of the dataset's file (``sha256sum FILE`` where it was made): the party refuses
            any other file, e.g. a copy cut short (:mod:`capc_common.data.checksum`). Only for a dataset that
            is one ``.npz`` file.
    """

    model_config = ConfigDict(extra="forbid")
    dataset: str
    shard: int = Field(default=0, ge=0)
    shards: int = Field(default=1, ge=1)
    seed: int = Field(default=0, ge=0, lt=2**64)
    fraction: float = Field(default=1.0, gt=0, le=1)
    sha256: str | None = Field(default=None, pattern="^[0-9a-f]{64}$")

    @field_validator("sha256", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        """``sha256sum`` prints lower case; other tools print upper case: the same digest."""
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_file(self) -> DataSettings:
        """A checksum pins one file: refuse it for a dataset that is not one."""
        from capc_common.data.checksum import dataset_file

        if self.sha256 is not None and dataset_file(self.dataset) is None:
            raise ValueError(
                f"data.sha256 pins one file, but dataset {self.dataset!r} is not a .npz file (npz:PATH or "
                "PATH.npz); turn an image folder into one with `capc data import`, or drop data.sha256"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_limit(cls, data: Any) -> Any:
        """Refuse the former ``limit`` with the reason and the replacement (not pydantic's bare message)."""
        if isinstance(data, dict) and "limit" in data:
            raise ValueError(
                f"data.limit ({data['limit']}) is no longer supported: keeping the first N examples lets one "
                "added or removed example evict or admit another, which breaks the add/remove-one guarantee; "
                "use data.fraction (e.g. 0.1: each example kept or not by a hash of its own content)"
            )
        return data


class HoldoutSettings(BaseModel):
    """The share of the site's examples kept out of the federation, to compare models on afterwards
    (``capc teacher personalise``).

    An example is held out iff a keyed hash of its own content falls below ``fraction``
    (:func:`capc_common.data.holdout_part`, keyed by ``data.seed``): nothing the federation sees — heads,
    contributions, the records cache — is computed from a held-out example, and which examples are held out
    never depends on how many there are. The fraction is a fixed public number for that reason: a site plans
    it from the size it expects (:func:`capc_common.data.holdout_fraction`; ``capc local up`` does), never
    from its data's count.

    Attributes:
        fraction: the share held out, in ``[0, 1)`` (0: none; the site then cannot personalise).
    """

    model_config = ConfigDict(extra="forbid")
    fraction: float = Field(default=HOLDOUT_FRACTION, ge=0, lt=1)


class TeacherSettings(SiteSettings):
    """``capc teacher serve|train --site FILE``.

    Attributes:
        student_address / guardian_address: ``host:port`` the party dials (it listens on no gRPC port).
        heads: the party's teacher heads (written by ``capc teacher train``).
        cap: the local ε cap (this federation).
        lifetime: the hospital's lifetime budget across federations (None: no site ledger).
        allow_raw_queries: answer queries shipped as raw images (default: synthetic queries only).
        allow_insecure_noise: take part in a federation whose ``federation.yaml`` seeds the noise
            (``mechanism.insecure_noise_seed``: reproducible, NOT private; tests only). Refused by default.
        torch_threads: CPU threads for inference, torch's and numpy's BLAS (None: their defaults).
        data: the site's labelled data (its training part and its holdout).
        holdout: the share of ``data`` kept out of the federation (:class:`HoldoutSettings`).
        feature_cache: a directory of *public* images' features and arrays
            (:class:`~capc_common.models.cache.FeatureCache`): shared with the other parties of the same
            machine (a local federation, one operator), or the party's own, seeded with the public basis
            file ``capc federation basis`` wrote (a secure-aggregation DP-SGD hospital then reads the basis
            instead of computing it, checked against ``federation.yaml``'s pin).
        records_cache: a directory of the per-example features of the site's *own* records
            (:func:`~capc_common.mechanisms.central.extract_per_example`), beside its other private files
            and never shared: derived from its data. A release federation's party that starts again, or the
            same site in another federation on its machine, reads them instead of featurising its records
            again.
    """

    student_address: str
    guardian_address: str
    heads: Path
    cap: CapSettings
    lifetime: LifetimeSettings | None = None
    allow_raw_queries: bool = False
    allow_insecure_noise: bool = False
    torch_threads: int | None = Field(default=None, ge=1)
    data: DataSettings | None = None
    holdout: HoldoutSettings = Field(default_factory=HoldoutSettings)
    feature_cache: Path | None = None
    records_cache: Path | None = None

    def check_role(self) -> None:
        self._require_role("teacher")
