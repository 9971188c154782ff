"""``federation.yaml``: the public parameters every party of one federation shares.

All parties load the same file and send its hash (:meth:`FederationConfig.config_hash`) with every call;
a peer whose hash differs is refused, so two parties can never silently run different mechanisms, budgets
or query generators against each other. Site-specific settings (addresses, paths, local caps) live in each
party's own site file, not here, so they do not change the hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from capc_common.errors import InputError

if TYPE_CHECKING:
    from capc_common.learn.prompts import PromptRecipe
    from capc_common.mechanisms import SelectionMechanism

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_party_name(value: str) -> str:
    """Return ``value`` if it is a valid party name (a DNS label: it becomes a certificate CN and SAN).

    Raises:
        ValueError: it is not (pydantic turns this into a field error; callers get an InputError).
    """
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"party name {value!r} must be a DNS label (lowercase letters, digits and '-', 1-63 chars): "
            "it becomes the certificate CN and a DNS SAN"
        )
    return value


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _OmitsUnset(_Frozen):
    """A section whose optional fields are dropped from the canonical form while unset, so adding one never
    changes the hash of a federation that does not use it."""

    _omitted_when_unset: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in self._omitted_when_unset:
            if data.get(key) is None:
                data.pop(key, None)
        return data


class TeacherParty(_OmitsUnset):
    """One teacher party (an organisation), how many teacher heads it holds and, optionally, how many
    labelled examples it declared.

    Attributes:
        name: the party's name (its certificate's common name).
        heads: its teacher heads (votes per query).
        examples: the number of labelled examples the party declared (the figure its ``heads`` were planned
            from: public by design, docs/threat-model.md), or None when undeclared. With it, every party can
            tell before the first charge whether the party's heads can vote at all — a head abstains when its
            shard is shorter than one BatchNorm chunk (:mod:`capc_common.federation.refusals`). Left out of
            the canonical form when unset.
        cap: the local ε cap the party declared (its site file's ``cap.epsilon``, which its teacher refuses
            to start below), or None when undeclared: with it, the guardian can tell before the first charge
            whether enough parties' caps cover the plan (:func:`~capc_common.federation.refusals.
            uncovered_caps`). Left out of the canonical form when unset.
    """

    _omitted_when_unset: ClassVar[tuple[str, ...]] = ("examples", "cap")

    name: str
    heads: int = Field(ge=1, le=10_000)
    examples: int | None = Field(default=None, ge=0)
    cap: float | None = Field(default=None, gt=0)

    _name = field_validator("name")(check_party_name)


class _MechanismConfig(_OmitsUnset):
    """What every ``mechanism:`` member of ``federation.yaml`` shares: the insecure test seed.

    Attributes:
        insecure_noise_seed: draw the guardian's and the student's noise (and, for mechanisms that sample,
            each teacher party's samples) from streams seeded by this string — reproducible, hence **not
            private**: only to compare a federation with the central reference. It is part of the config
            hash, so every party sees it: teachers refuse such a federation unless their site file says
            ``allow_insecure_noise: true``, and every party refuses non-loopback binds. Left out of the
            canonical form when unset, so the hash of a private federation is what it was before the field
            existed.
    """

    _omitted_when_unset: ClassVar[tuple[str, ...]] = ("insecure_noise_seed",)

    insecure_noise_seed: str | None = Field(default=None, min_length=1, max_length=256)

    def votes_per_party(self) -> int | None:
        """The ``heads`` every teacher party must declare (the votes it casts per query), or None when a
        party's heads are its own choice (one vote per trained head)."""
        return None


class _ConfidentMember(_MechanismConfig):
    """Confident-GNMax's public parameters, shared by every member aggregated by it."""

    threshold: float = Field(ge=0)
    sigma1: float = Field(gt=0)
    sigma2: float = Field(gt=0)

    def confident(self, *, classes: int, teachers: int, min_teachers: int | None) -> dict[str, Any]:
        """The arguments of :class:`~capc_common.mechanisms.ConfidentGNMax` (or a subclass)."""
        return {
            "classes": classes,
            "teachers": teachers,
            "threshold": self.threshold,
            "sigma1": self.sigma1,
            "sigma2": self.sigma2,
            "min_teachers": min_teachers,
        }

    def noise_hint(self) -> str:
        """Which field to raise for more noise per answer (named in errors about a budget too small)."""
        return f"mechanism.sigma2 (now {self.sigma2:g})"

    def noise_sigmas(self) -> tuple[float, ...]:
        """Every σ the parties sample discrete Gaussians at (for the samplers' distance in δ)."""
        return (self.sigma1, self.sigma2)


class Mechanism(_ConfidentMember):
    """Confident-GNMax: pass if max votes + N_Z(0, σ1²) ≥ T, then answer argmax(votes + N_Z(0, σ2²)).

    The default member of ``mechanism:`` (a config without ``name`` means this one).
    """

    name: Literal["confident-gnmax"] = "confident-gnmax"

    def build(self, *, classes: int, teachers: int, min_teachers: int | None) -> SelectionMechanism:
        """The mechanism object every party of the federation plugs into the engine."""
        from capc_common.mechanisms import ConfidentGNMax

        return ConfidentGNMax(**self.confident(classes=classes, teachers=teachers, min_teachers=min_teachers))


class PromPATEMechanism(_ConfidentMember):
    """Prom-PATE: every party's prompted teachers (one per shard of its data, a visual prompt and a label map
    on the frozen shared backbone) vote, aggregated by Confident-GNMax.

    The prompt recipe is public and the same for every party: it is part of the config hash, and a party's
    teachers file trained under another recipe is refused. Fields as
    :class:`~capc_common.learn.prompts.PromptRecipe` (validated by it).
    """

    name: Literal["prom-pate"]
    kind: Literal["pad", "additive"] = "pad"
    width: int = Field(default=3, ge=1)
    map_steps: int = Field(default=50, ge=1)
    map_lr: float = Field(default=1e-3, gt=0)
    steps: int = Field(default=10, ge=0)
    prompt_lr: float = Field(default=0.05, gt=0)
    joint_map_lr: float = Field(default=1e-3, gt=0)

    def recipe(self) -> PromptRecipe:
        """The prompt recipe every party trains its teachers with."""
        from capc_common.learn.prompts import PromptRecipe

        fields = PromptRecipe.__dataclass_fields__
        return PromptRecipe(**{k: getattr(self, k) for k in fields})

    def build(self, *, classes: int, teachers: int, min_teachers: int | None) -> SelectionMechanism:
        """A :class:`~capc_common.mechanisms.PromPATE`: Confident-GNMax's accounting, prompted voters."""
        from capc_common.mechanisms import PromPATE

        return PromPATE(
            recipe=self.recipe(),
            **self.confident(classes=classes, teachers=teachers, min_teachers=min_teachers),
        )


class GNMaxMechanism(_MechanismConfig):
    """GNMax: answer every query with argmax(votes + N_Z(0, σ²)), no screening."""

    name: Literal["gnmax"]
    sigma: float = Field(gt=0)

    def build(self, *, classes: int, teachers: int, min_teachers: int | None) -> SelectionMechanism:
        """A :class:`~capc_common.mechanisms.GNMax` (every query answered, so no quorum range matters)."""
        from capc_common.mechanisms import GNMax

        del teachers, min_teachers
        return GNMax(classes=classes, sigma=self.sigma)

    def noise_hint(self) -> str:
        """σ sets the cost of an answer."""
        return f"mechanism.sigma (now {self.sigma:g})"

    def noise_sigmas(self) -> tuple[float, ...]:
        """The one σ of the argmax noise."""
        return (self.sigma,)


class PrivateKNNMechanism(_MechanismConfig):
    """Private-kNN: per query every teacher party's fresh Poisson sample of its records (probability
    ``sampling_rate``) votes with its ``neighbours`` nearest records; argmax(votes + N_Z(0, σ²)).

    A party casts at most ``neighbours`` votes per query, so every teacher party declares exactly that many
    ``heads`` (the votes it casts): the ring, the 2PC and the parties' hello check all count votes by heads.
    """

    name: Literal["private-knn"]
    sigma: float = Field(gt=0)
    neighbours: int = Field(ge=1, le=10_000)
    sampling_rate: float = Field(gt=0, le=1)

    def build(self, *, classes: int, teachers: int, min_teachers: int | None) -> SelectionMechanism:
        """A :class:`~capc_common.mechanisms.PrivateKNN` (accounting: the Poisson-subsampled GNMax)."""
        from capc_common.mechanisms import PrivateKNN

        del teachers, min_teachers
        return PrivateKNN(
            classes=classes, sigma=self.sigma, neighbours=self.neighbours, sampling_rate=self.sampling_rate
        )

    def votes_per_party(self) -> int:
        """``neighbours``: the votes one party casts per query."""
        return self.neighbours

    def noise_hint(self) -> str:
        """σ sets the cost of an answer (with the sampling rate)."""
        return f"mechanism.sigma (now {self.sigma:g}) or lower mechanism.sampling_rate"

    def noise_sigmas(self) -> tuple[float, ...]:
        """The one σ of the argmax noise."""
        return (self.sigma,)


class ReleaseMember(_MechanismConfig):
    """What every release-family member shares: the seeded-noise switch and ``fixed_point_bits`` (None: the
    library's choice for the noise; refused by a member whose contributions are whole counts), both left out
    of the canonical form when unset. Each member's protocol (what the parties run) is built from it by
    :func:`capc_common.federation.releases.protocol_for`: the config names parameters, it runs nothing."""

    _omitted_when_unset: ClassVar[tuple[str, ...]] = ("insecure_noise_seed", "fixed_point_bits")
    #: Whether contributions are fixed-point encodings (False: whole counts, with no fixed point to lower).
    fixed_point: ClassVar[bool] = True
    #: Whether its protocol featurises public images as soon as it is built (DPPL-Public's pool: every party
    #: holds their features, so the process that builds it loads the backbone, reading the machine's shared
    #: cache of public features); False: only on first use (secure-aggregation DP-SGD's basis), if at all.
    featurises_when_built: ClassVar[bool] = False

    fixed_point_bits: int | None = Field(default=None, ge=0, le=40)


class DPPLMechanism(ReleaseMember):
    """DP prototypes (DPPL "mean"): one release of noisy per-class feature sums and counts, ``rho``-zCDP.

    Attributes:
        rho: zCDP of the one release (the ledger charges ``rho · order`` RDP).
        count_share: the fraction of ``rho`` spent on the counts.
        metric: how the released prototypes classify (post-processing).
    """

    name: Literal["dppl"]
    rho: float = Field(gt=0)
    count_share: float = Field(default=0.1, gt=0, lt=1)
    metric: Literal["cosine", "euclidean"] = "euclidean"


class DPPLPublicMechanism(ReleaseMember):
    """DPPL-Public as a release: every record votes for its nearest candidate of a public synthetic pool, one
    release of the noisy per-class vote counts (``rho``-zCDP), each class's prototype is its ``per_class``
    most-voted candidates weighted by their noisy counts
    (:class:`~capc_common.mechanisms.PublicPrototypeVotes`).

    Attributes:
        rho: zCDP of the one release (the ledger charges ``rho · order`` RDP).
        per_class: candidates kept per class (post-processing; 100 chosen on the validation split).
        pool_generator / pool_seed / pool_size: the public candidate pool, the first ``pool_size`` images of
            that generator's stream at the federation's query image size; every party featurises it with
            the shared backbone per example (running statistics).
    """

    name: Literal["dppl-public"]
    fixed_point: ClassVar[bool] = False
    featurises_when_built: ClassVar[bool] = True
    rho: float = Field(gt=0)
    per_class: int = Field(default=100, ge=1)
    pool_generator: str = Field(default="shaders", min_length=1)
    pool_seed: int = Field(default=1, ge=0, lt=2**63)
    pool_size: int = Field(default=2000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _no_fixed_point(self) -> Self:
        if self.fixed_point_bits is not None:  # accepted and ignored would mislead whoever set it
            raise ValueError(
                "fixed_point_bits does not apply to dppl-public: its contributions are whole vote counts, "
                "shared as integers with no fixed point; remove it"
            )
        return self

    @model_validator(mode="after")
    def _fits_the_pool(self) -> Self:
        if self.per_class > self.pool_size:
            raise ValueError(
                f"per_class {self.per_class} is more than the pool's {self.pool_size} candidates"
            )
        return self


class ProjectionSection(_Frozen):
    """The public subspace a secure-aggregation DP-SGD head lives in (:mod:`capc_common.mechanisms.basis`):
    the top ``dim`` principal directions of the shared backbone's features on ``images`` synthetic images of
    each generator, computed alike by every party (no data, no privacy cost).

    Attributes:
        dim: directions kept (at most the backbone's feature dimension).
        generators: synthetic generators.
        images: images per generator.
        seed: the generators' seed.
        sha256: the basis's digest, if the coordinator pinned it: a party whose own computation differs (a
            machine with other floating point) refuses instead of training in other coordinates.
    """

    dim: int = Field(default=1024, ge=1, le=65_536)
    generators: tuple[str, ...] = Field(default=("dead_leaves", "shaders"), min_length=1)
    images: int = Field(default=5000, ge=2, le=100_000)
    seed: int = Field(default=7, ge=0, lt=2**63)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class SecAggDPSGDMechanism(ReleaseMember):
    """Secure-aggregation DP-SGD of a linear head: a statistics release, then one release of the noisy
    clipped gradient sum per round (:mod:`capc_common.mechanisms.training` has the recipe and why).

    Attributes:
        rounds: gradient rounds (each charged the Poisson-subsampled discrete Gaussian's RDP; with
            ``statistics`` one more release is charged the same).
        noise_multiplier: ``z = σ/Δ``.
        clip: per-example L2 clipping norm.
        sampling_rate: every record's Poisson inclusion probability per release.
        statistics: release the projected features' noisy sums first and standardise them.
        projection: the public subspace, or null for the backbone's own coordinates.
        optimizer / learning_rate / momentum / beta2 / adam_eps: the student's step (post-processing;
            ``momentum`` is Adam's β1).
        variance_floor: added to every variance, as a multiple of the median (the standardisation).
        expected_batch: ``q · N``, the public normaliser of the noisy sum; only without ``statistics``
            (with it, the released count normalises).
        step_noise: heavy ball only: the step follows the noise (``learning_rate`` is then its cap), see
            :class:`~capc_common.mechanisms.training.Recipe`.
        unit_variance: standardise to unit variance per coordinate (the recipe with ``step_noise``).

    The schema's defaults stay those of the federations already running (a default that changed would
    change their config hash); the planner (:func:`~capc_common.federation.sizing.dpsgd_mechanism`) writes
    the recipe new federations get.
    """

    _omitted_when_unset: ClassVar[tuple[str, ...]] = (
        "insecure_noise_seed",
        "fixed_point_bits",
        "expected_batch",
        "step_noise",
        "unit_variance",
    )

    name: Literal["secagg-dpsgd"]
    rounds: int = Field(ge=1, le=100_000)
    noise_multiplier: float = Field(gt=0)
    clip: float = Field(default=1.0, gt=0)
    sampling_rate: float = Field(default=1.0, gt=0, le=1)
    statistics: bool = True
    projection: ProjectionSection | None = Field(default_factory=ProjectionSection)
    optimizer: Literal["adam", "momentum"] = "adam"
    learning_rate: float = Field(default=0.3, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.999, gt=0, lt=1)
    adam_eps: float = Field(default=1e-4, gt=0)
    variance_floor: float = Field(default=1.0, ge=0)
    expected_batch: float | None = Field(default=None, gt=0)
    step_noise: float | None = Field(default=None, gt=0)
    unit_variance: bool | None = None

    @model_validator(mode="after")
    def _normaliser(self) -> Self:
        if not self.statistics and self.expected_batch is None:
            raise ValueError(
                "without statistics the noisy gradient sum is normalised by expected_batch (q · N): set it, "
                "or set statistics: true"
            )
        if self.step_noise is not None and self.optimizer != "momentum":
            raise ValueError(
                f"step_noise sets a heavy-ball step, but optimizer is {self.optimizer!r}: set optimizer: "
                "momentum, or remove step_noise"
            )
        return self

    @property
    def releases(self) -> int:
        """Releases in all: the statistics release (if any) and the gradient rounds."""
        return self.rounds + int(self.statistics)


def _mechanism_name(value: Any) -> str:
    """The member a ``mechanism:`` mapping names; configs written before the union have no ``name``."""
    if isinstance(value, dict):
        return str(value.get("name", "confident-gnmax"))
    return str(getattr(value, "name", "confident-gnmax"))


SelectionMember = Mechanism | GNMaxMechanism | PrivateKNNMechanism | PromPATEMechanism
"""The members whose parties vote on query batches (2PC noisy argmax, labels for a student)."""

MechanismConfig = Annotated[
    Annotated[Mechanism, Tag("confident-gnmax")]
    | Annotated[GNMaxMechanism, Tag("gnmax")]
    | Annotated[PrivateKNNMechanism, Tag("private-knn")]
    | Annotated[PromPATEMechanism, Tag("prom-pate")]
    | Annotated[DPPLMechanism, Tag("dppl")]
    | Annotated[DPPLPublicMechanism, Tag("dppl-public")]
    | Annotated[SecAggDPSGDMechanism, Tag("secagg-dpsgd")],
    Discriminator(
        _mechanism_name,
        custom_error_type="mechanism_name",
        custom_error_message=(
            "mechanism.name must be one of confident-gnmax, gnmax, private-knn, prom-pate, dppl, "
            "dppl-public, secagg-dpsgd"
        ),
    ),
]
"""``federation.yaml``'s ``mechanism:``: one member per mechanism a federation runs, chosen by ``name``."""


class Budget(_Frozen):
    """The Rényi filter's budget: (ε, δ) reported with the improved conversion at one fixed order."""

    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    order: float = Field(gt=1)


class Queries(_Frozen):
    """The synthetic query stream: generator, seed, how many, in batches of ``batch_size``."""

    generator: str = Field(min_length=1)
    seed: int = Field(ge=0, lt=2**63)
    total: int = Field(ge=1)
    batch_size: int = Field(ge=1, le=65_536)
    bn_batch: int = Field(ge=16)
    height: int = Field(ge=1)
    width: int = Field(ge=1)
    channels: Literal[1, 3]

    @model_validator(mode="after")
    def _bn_divides(self) -> Self:
        if self.batch_size % self.bn_batch:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of bn_batch {self.bn_batch}: "
                "current-statistics BatchNorm runs over chunks of exactly bn_batch queries, "
                "so pick batch_size = k * bn_batch"
            )
        return self


class Backbone(_Frozen):
    """The shared backbone every teacher and the student start from, pinned by its weights' hash."""

    name: str = Field(min_length=1)
    sha256: str

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError(f"backbone sha256 must be 64 lowercase hex digits, got {value!r}")
        return value


class Quorum(_Frozen):
    """How many teacher parties a batch needs, and how long to wait for stragglers (seconds)."""

    min_parties: int = Field(ge=1)
    vote_deadline_s: float = Field(gt=0)
    share_deadline_s: float = Field(gt=0)


class Revocation(_Frozen):
    """One revoked party certificate: every party refuses it, as a caller and as a server it dials.

    Attributes:
        serial: the certificate's serial number in hex (``capc cert show`` prints it; colons, a ``0x``
            prefix and upper case are accepted and normalised).
        party: whose certificate it was (for the reader; the serial alone decides).
        reason: why it was revoked (a lost laptop, a key rotated), for the record.
    """

    serial: str
    party: str = ""
    reason: str = Field(default="", max_length=500)

    @field_validator("serial", mode="before")
    @classmethod
    def _serial(cls, value: object) -> str:
        text = str(value).strip().lower().replace(":", "").removeprefix("0x")
        if not re.fullmatch(r"[0-9a-f]{1,40}", text.lstrip("0") or ("0" if text else "")):
            raise ValueError(
                f"revoked serial {value!r} must be the certificate's serial number in hex (at most 20 "
                "bytes), as `capc cert show` prints it"
            )
        return text.lstrip("0") or "0"


class MembershipChange(_Frozen):
    """One earlier membership change this federation continues from (``history:`` in ``federation.yaml``).

    Written by ``capc federation add-party`` / ``retire-party``. The student and each teacher party accept
    their own records (label store, cap record) written under ``previous`` as this federation's: what they
    spent before the change still counts. The guardian does not take the file's word for it: it continues
    its ledger only through the admin-authorised membership entry (``POST /api/v1/membership``).

    Attributes:
        previous: the config hash before the change.
        added / retired: teacher parties the change added or retired.
    """

    previous: str
    added: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()

    @field_validator("previous")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError(
                f"history.previous must be a config hash (64 lowercase hex digits), got {value!r}"
            )
        return value

    def describe(self) -> str:
        """``added hospital-4; retired hospital-2``."""
        parts = [f"added {', '.join(self.added)}" if self.added else "",
                 f"retired {', '.join(self.retired)}" if self.retired else ""]  # fmt: skip
        return "; ".join(p for p in parts if p) or "no party added or retired"


def serial_hex(serial: int) -> str:
    """A certificate serial number as ``federation.yaml`` lists it: lowercase hex, no leading zeros."""
    return format(serial, "x")


class FederationConfig(_Frozen):
    """The parsed, validated ``federation.yaml``.

    ``revoked`` lists certificates every party refuses. It is *not* part of :meth:`config_hash`: revoking a
    certificate changes who may connect, not what the federation computes, so the ledger, the label store and
    every party's cap record carry on under the same hash. The list has its own hash
    (:meth:`revocation_hash`), which the parties compare on every call like the config hash. Nor is
    ``history`` (the membership changes this config continues from, :class:`MembershipChange`): it says
    which earlier hashes the parties' own records may carry, not what the federation computes.

    ``class_names`` (optional) names the classes in index order: ``capc data import --federation`` maps a
    hospital's folder names and labels onto exactly these indices, and ``capc teacher train``/``preflight``
    refuse a site file whose stored class names differ. When set it is part of the hash (what a label index
    means is a parameter every party must share); when unset it is left out of the canonical form, so a
    federation without it keeps the hash it had before the field existed.
    """

    version: Literal[1] = 1
    name: str = Field(min_length=1)
    classes: int = Field(ge=2, le=10_000)
    class_names: tuple[str, ...] | None = None
    guardian: str = "guardian"
    student: str = "student"
    teachers: tuple[TeacherParty, ...] = Field(min_length=1)
    mechanism: MechanismConfig
    budget: Budget
    queries: Queries
    backbone: Backbone
    quorum: Quorum
    revoked: tuple[Revocation, ...] = ()
    history: tuple[MembershipChange, ...] = ()

    _guardian = field_validator("guardian")(check_party_name)
    _student = field_validator("student")(check_party_name)

    @field_validator("class_names")
    @classmethod
    def _class_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        blank = [i for i, name in enumerate(value) if not name.strip() or name != name.strip()]
        if blank:
            raise ValueError(
                f"class names must be non-empty, without surrounding spaces; see indices {blank}"
            )
        repeated = sorted({n for n in value if value.count(n) > 1})
        if repeated:
            raise ValueError(f"class names must be unique; repeated: {repeated}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.class_names is not None and len(self.class_names) != self.classes:
            raise ValueError(
                f"class_names lists {len(self.class_names)} names but classes is {self.classes}: name every "
                "class once, in index order"
            )
        names = [self.guardian, self.student, *(t.name for t in self.teachers)]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"party names must be unique; repeated: {duplicates}")
        if self.quorum.min_parties > len(self.teachers):
            raise ValueError(
                f"quorum.min_parties {self.quorum.min_parties} exceeds the {len(self.teachers)} teacher "
                "parties: no batch could ever proceed"
            )
        votes = self.mechanism.votes_per_party()
        wrong = [t.name for t in self.teachers if votes is not None and t.heads != votes]
        if wrong:
            raise ValueError(
                f"under mechanism {self.mechanism.name} a teacher party casts {votes} votes per query "
                f"(mechanism.neighbours), so its heads must be {votes}; {wrong} declare otherwise: set "
                f"heads: {votes} for every teacher party"
            )
        return self

    @property
    def insecure_noise(self) -> bool:
        """True when the guardian's and student's noise is seeded (reproducible, NOT private)."""
        return self.mechanism.insecure_noise_seed is not None

    @property
    def total_heads(self) -> int:
        """Teacher heads across all parties: the largest possible vote count of one class."""
        return sum(t.heads for t in self.teachers)

    @property
    def teacher_names(self) -> tuple[str, ...]:
        """Teacher party names in federation order (the order shares are summed in)."""
        return tuple(t.name for t in self.teachers)

    def teacher(self, name: str) -> TeacherParty:
        """The teacher party called ``name``.

        Raises:
            InputError: no such teacher party.
        """
        for party in self.teachers:
            if party.name == name:
                return party
        raise InputError(f"{name!r} is not a teacher party of federation {self.name!r}: {self.teacher_names}")

    def role_of(self, name: str) -> Literal["guardian", "student", "teacher"] | None:
        """Which role a certificate CN plays in this federation (None: not a party)."""
        if name == self.guardian:
            return "guardian"
        if name == self.student:
            return "student"
        if name in self.teacher_names:
            return "teacher"
        return None

    @property
    def party_names(self) -> tuple[str, ...]:
        """Every party of the federation: guardian, student, then the teacher parties."""
        return (self.guardian, self.student, *self.teacher_names)

    @property
    def revoked_serials(self) -> frozenset[str]:
        """Serials (normalised hex) of the revoked certificates."""
        return frozenset(r.serial for r in self.revoked)

    @property
    def previous_hashes(self) -> dict[str, MembershipChange]:
        """Config hashes this federation continues from (``history``), each with the change that left it."""
        return {change.previous: change for change in self.history}

    def _unset(self) -> set[str]:
        """Optional fields left out of the canonical form and the saved file while unset."""
        return {"class_names"} if self.class_names is None else set()

    def parameters(self) -> dict[str, Any]:
        """Every parameter the federation computes with (all fields but ``revoked`` and ``history``, and
        ``class_names`` while unset), as JSON values."""
        return self.model_dump(mode="json", exclude={"revoked", "history", *self._unset()})

    def canonical_json(self) -> str:
        """Deterministic JSON of :meth:`parameters`: sorted keys, no whitespace, plain ASCII."""
        return json.dumps(self.parameters(), sort_keys=True, separators=(",", ":"))

    def config_hash(self) -> str:
        """SHA-256 (hex) of :meth:`canonical_json`: equal exactly when every parameter is equal."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def revocation_hash(self) -> str:
        """SHA-256 (hex) of the revoked serials, sorted: equal exactly when two configs revoke the same
        certificates (the reasons and party names beside them are for the reader and do not count)."""
        return hashlib.sha256(json.dumps(sorted(self.revoked_serials)).encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "federation config") -> FederationConfig:
        """Validate a mapping, turning pydantic's errors into one :class:`InputError` naming every field.

        Raises:
            InputError: a field is missing, unknown or out of range.
        """
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise InputError(f"{source} is invalid: {problems}") from None

    @classmethod
    def load(cls, path: str | Path) -> FederationConfig:
        """Read and validate ``federation.yaml``.

        Raises:
            InputError: the file is missing, is not YAML, or fails validation.
        """
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise InputError(
                f"federation config {path} does not exist; create it or pass --federation"
            ) from None
        except yaml.YAMLError as exc:
            raise InputError(f"federation config {path} is not valid YAML: {exc}") from None
        return cls.from_dict(data, source=f"federation config {path}")

    def save(self, path: str | Path) -> None:
        """Write the config as YAML (atomic: a temporary file renamed into place), creating its folder."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        data = self.model_dump(mode="json", exclude=self._unset() | (set() if self.history else {"history"}))
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        tmp.replace(path)
