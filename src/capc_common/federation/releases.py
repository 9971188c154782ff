"""Release-family mechanisms in a federation: what each party does per release, and what the student makes of
the released totals.

A release federation runs ``rounds`` releases. For each, the student publishes a public *state* (DP-SGD: the
current head; DP prototypes: nothing), every teacher party turns its own per-example features into an integer
contribution at that state (:meth:`ReleaseProtocol.contribute`) and secret-shares it, the guardian charges the
mechanism's ``release_rdp`` and adds its noise, and the student folds the revealed noisy total into its state
(:meth:`ReleaseProtocol.absorb`). The result is a linear head over L2-normalised per-example features
(:meth:`ReleaseProtocol.head`), the same form for both mechanisms, so the student publishes one kind of model.

The same arithmetic as the central runners (:func:`~capc_common.mechanisms.central.run_prototypes`,
:func:`~capc_common.mechanisms.central.run_secure_dpsgd`), step for step: with seeded noise a federation
publishes their result bit for bit (the differential test).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError, IntegrityError
from capc_common.federation.config import (
    Budget,
    DPPLMechanism,
    DPPLPublicMechanism,
    FederationConfig,
    ProjectionSection,
    ReleaseMember,
    SecAggDPSGDMechanism,
)
from capc_common.mechanisms import (
    DPPrototypes,
    FixedPoint,
    PublicPrototypeVotes,
    ReleaseMechanism,
    SecureDPSGD,
    normalise,
)
from capc_common.mechanisms.central import PER_EXAMPLE_PASS
from capc_common.mechanisms.training import DPSGDTrainer, Recipe
from capc_common.privacy.claims import (
    GUARDIAN_AND_TEACHER,
    OUTSIDER,
    STUDENT_AND_TEACHER,
    Coalition,
    coalition_epsilon,
)

if TYPE_CHECKING:
    from capc_common.models import Backbone
    from capc_common.models.cache import FeatureCache
    from capc_common.privacy import NoiseSource

__all__ = [
    "MAX_RECORDS",
    "DPSGDProtocol",
    "Featuriser",
    "LazyBackbone",
    "OneReleaseProtocol",
    "PrototypesProtocol",
    "PublicVotesProtocol",
    "ReleaseProtocol",
    "check_records",
    "federation_basis",
    "planned_figures",
    "protocol_for",
    "prototype_head",
]


MAX_RECORDS = 2**24
"""The most records a release federation may hold in all (16.7 M): the fixed point is checked against it."""


def check_records(config: FederationConfig, records: int) -> None:
    """Refuse a party holding more than its share of :data:`MAX_RECORDS` (the bound the ring was checked for).

    Raises:
        InputError: naming the count and the bound.
    """
    share = MAX_RECORDS // len(config.teachers)
    if records > share:
        m = config.mechanism
        lower = isinstance(m, ReleaseMember) and m.fixed_point  # whole counts have no fixed point to lower
        raise InputError(
            f"this party holds {records} records; a release federation of {len(config.teachers)} parties "
            f"checks its ring for at most {share} per party ({MAX_RECORDS} in all); split the data over more "
            f"parties{' or lower mechanism.fixed_point_bits' if lower else ''}"
        )


class LazyBackbone:
    """The shared backbone, loaded by ``load`` on first use, once (thread-safe).

    A party that holds a release protocol but never featurises anything (the guardian of secure-aggregation
    DP-SGD: its basis is computed by the parties that contribute and the student) never loads the model, so
    never imports torch: 230 MB of its resident memory.
    """

    def __init__(self, load: Callable[[], Backbone]) -> None:
        self._load: Callable[[], Backbone] | None = load
        self._loaded: Backbone | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Backbone:
        with self._lock:
            if self._loaded is None:
                assert self._load is not None
                self._loaded, self._load = self._load(), None
            return self._loaded


@dataclass(frozen=True)
class Featuriser:
    """How a party maps public images (a candidate pool, a public basis's images) to the per-example features
    its records use.

    Attributes:
        source: the shared backbone (per example: BatchNorm running statistics), or how to load it when first
            needed.
        shape: ``(height, width, channels)`` of the federation's images.
        cache: the party's shared cache of public images' features (parties on one machine compute once).
    """

    source: Backbone | LazyBackbone
    shape: tuple[int, int, int]
    cache: FeatureCache | None = None

    @property
    def backbone(self) -> Backbone:
        """The shared backbone (loaded now if it was not)."""
        return self.source() if isinstance(self.source, LazyBackbone) else self.source

    def __call__(self, images: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        """Per-example features of ``images``."""
        from capc_common.mechanisms import per_example

        if self.cache is not None and len(images) >= PER_EXAMPLE_PASS:
            return self.cache.extract(self.backbone, images, bn_batch=PER_EXAMPLE_PASS, mode="running")
        return per_example(self.backbone, images)


def protocol_for(
    config: FederationConfig,
    *,
    dim: int,
    backbone: Backbone | LazyBackbone | None = None,
    cache: FeatureCache | None = None,
) -> ReleaseProtocol:
    """The federation's release protocol over ``dim``-dimensional features, refused unless every release
    it plans fits the budget (so no party starts a federation the ledger would stop half way).

    Args:
        config: the federation.
        dim: the backbone's feature dimension.
        backbone: the shared backbone (or how to load it), for a mechanism that featurises public images
            (DPPL-Public's pool, at once; secure-aggregation DP-SGD's basis, when a party first needs it); the
            others never use it.
        cache: the party's shared cache of public features, if it has one.

    Raises:
        InputError: the mechanism is not of the release family, or its releases cost more than the budget.
    """
    from capc_common.privacy.analysis import rdp_budget_at_order

    m = config.mechanism
    if not isinstance(m, ReleaseMember):
        raise InputError(f"federation {config.name!r} runs {m.name!r}, not a release mechanism")
    q = config.queries
    featuriser = None if backbone is None else Featuriser(backbone, (q.height, q.width, q.channels), cache)
    protocol = _PROTOCOLS[type(m)](m, classes=config.classes, dim=dim, featuriser=featuriser)
    # The ring must hold the noisy total of every record the federation could hold (a wrap would corrupt
    # the released model silently); each teacher also refuses a share of more than its part of this bound.
    protocol.mechanism.check_capacity(records=MAX_RECORDS)
    b = config.budget
    budget = rdp_budget_at_order(epsilon=b.epsilon, delta=b.delta, order=b.order)
    per_release = protocol.release_rdp(b.order)
    if protocol.rounds * per_release > budget:
        raise InputError(
            f"{m.name}: {protocol.rounds} release(s) of RDP {per_release:.4g} each at order {b.order:g} cost "
            f"{protocol.rounds * per_release:.4g}, more than the budget {budget:.4g} (ε={b.epsilon:g}, "
            f"δ={b.delta:g}); lower the rounds, add noise, or raise ε"
        )
    return protocol


def planned_figures(protocol: ReleaseProtocol, budget: Budget) -> dict[str, Any]:
    """What a release plan promises before any release, at the ledger's order and δ: its size, each release's
    RDP, the guarantee ``epsilon`` (every planned release's charge: the plan is fixed before any data is
    touched, and :func:`protocol_for` checked that it fits the budget) and ε per coalition
    (:meth:`ReleaseProtocol.coalitions`). The guardian adds what its ledger holds (releases made, RDP spent,
    its chain head); the model card publishes that."""
    from capc_common.privacy.analysis import epsilon_at_order

    rdp = protocol.release_rdp(budget.order)
    planned = protocol.rounds * rdp
    epsilon = max(0.0, float(epsilon_at_order(budget.order, planned, delta=budget.delta)))
    return {
        "releases_planned": protocol.rounds,
        "rdp_per_release": rdp,
        "rdp_planned": planned,
        "epsilon": epsilon,
        "epsilon_limit": budget.epsilon,
        "delta": budget.delta,
        "order": budget.order,
        "coalitions": [c.to_dict() for c in protocol.coalitions(epsilon=epsilon, delta=budget.delta)],
    }


def prototype_head(
    sums: npt.NDArray[np.float64], counts: npt.NDArray[np.float64], *, metric: str
) -> npt.NDArray[np.float64]:
    """Nearest prototype as a linear head ``(classes, dim + 1)`` over L2-normalised features.

    Cosine: the normalised sums, no bias. Euclidean to the means ``m = sum / max(count, 1)``:
    ``argmin ‖x − m‖² = argmax 2x·m − ‖m‖²``. One published form for every release mechanism.
    """
    if metric == "cosine":
        return np.concatenate([normalise(sums), np.zeros((sums.shape[0], 1))], axis=1)
    means = sums / np.maximum(counts, 1.0)[:, None]
    return np.concatenate([2 * means, -(means**2).sum(axis=1, keepdims=True)], axis=1)


class ReleaseProtocol(ABC):
    """One release federation's per-round arithmetic (parties' side stateless, student's side stateful).

    Attributes:
        mechanism: the release mechanism (noise, accounting, encoding).
        rounds: how many releases the federation runs.
    """

    mechanism: ReleaseMechanism
    rounds: int

    @property
    def length(self) -> int:
        """Coordinates of every contribution and total."""
        return int(self.mechanism.sigmas().size)

    def release_rdp(self, order: float) -> float:
        """RDP of one release at the ledger's order (what the guardian charges per release)."""
        return float(self.mechanism.release_rdp(np.array([order], dtype=np.float64))[0])

    def sampler_delta(self, *, epsilon: float) -> float:
        """What the noise tables' distance from the exact discrete Gaussian adds to δ: the released totals
        depend on ``rounds × length`` noise values of each party's part, each within its table's bound
        (:func:`~capc_common.privacy.analysis.delta_with_sampler_distance`)."""
        from capc_common.privacy.analysis import delta_with_sampler_distance

        draws, eta = self.sampler_draws()
        return delta_with_sampler_distance(epsilon=epsilon, draws=draws, distance=eta)

    def sampler_draws(self) -> tuple[int, float]:
        """The noise values the released totals depend on (``rounds × length`` of each party's part of the
        noise) and each one's distance bound."""
        from capc_common.mechanisms.release import NOISE_PARTS
        from capc_common.privacy.noise import discrete_gaussian_table

        eta = max(
            discrete_gaussian_table(sigma=float(s)).distance_bound
            for s in np.unique(self.mechanism.part_sigmas())
        )
        return NOISE_PARTS * self.rounds * self.length, eta

    def coalitions(self, *, epsilon: float, delta: float) -> list[Coalition]:
        """ε per coalition of the plan (DESIGN §2). The outsider's is the plan's guarantee ``epsilon`` (the
        sum of both parts of the noise is at least the planned ``N_Z(0, σ²)``); a coalition of the guardian
        or the student with a teacher party knows one part and sees every round's total through the other
        alone: ``rounds ×`` :meth:`~capc_common.mechanisms.release.ReleaseMechanism.coalition_rdp`, at its
        best order and never below the outsider's."""
        mechanism, rounds = self.mechanism, self.rounds
        known = coalition_epsilon(lambda lam: rounds * mechanism.coalition_rdp(lam), delta=delta)
        part = ", ".join(f"{s:.6g}" for s in np.unique(mechanism.part_sigmas()))
        return [
            Coalition(OUTSIDER, epsilon, "both parts of the noise: their sum is at least the planned noise"),
            Coalition(
                GUARDIAN_AND_TEACHER,
                max(known, epsilon),
                f"the student's part of the noise alone (N_Z(0, s²), s = {part})",
            ),
            Coalition(
                STUDENT_AND_TEACHER,
                max(known, epsilon),
                f"the guardian's part of the noise alone (N_Z(0, s²), s = {part})",
            ),
        ]

    def prepare(self, features: npt.ArrayLike, *, consume: bool = False) -> npt.ArrayLike:
        """A party's per-example features as its contributions use them, computed once (default: as is).
        ``consume``: the caller hands ``features`` over; they may be overwritten."""
        return features

    def precompute(self) -> None:
        """Compute now what the protocol derives from public inputs alone and otherwise computes on first use
        (secure-aggregation DP-SGD's basis; default: nothing): the student does while the parties featurise
        their records, so a party sharing its cache finds it there instead of computing it after them."""
        return None

    def precomputed(self) -> dict[str, npt.NDArray[Any]]:
        """What :meth:`precompute` derived, by name (computed now if it was not), for :meth:`adopt` in
        another process of the party: one that featurises with the backbone hands it to one that never loads
        the backbone (default: nothing)."""
        return {}

    def precomputed_names(self) -> frozenset[str]:
        """The names :meth:`precomputed` returns, known without computing anything: what a party that adopts
        them must be handed (default: none)."""
        return frozenset()

    def adopt(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        """Use what :meth:`precomputed` returned in another process of the same party, checked as when it is
        computed here (default: nothing to use).

        Raises:
            InputError: names this protocol does not derive.
            IntegrityError: a public array other than the one ``federation.yaml`` pins.
        """
        if arrays:
            raise InputError(f"{self.mechanism.name} derives no {', '.join(sorted(arrays))}")

    @abstractmethod
    def state(self) -> npt.NDArray[np.float64]:
        """The public state the parties compute the next contribution at (empty when there is none)."""

    @abstractmethod
    def contribute(
        self,
        state: npt.NDArray[np.float64],
        features: npt.ArrayLike,
        labels: npt.NDArray[np.int64],
        source: NoiseSource,
    ) -> npt.NDArray[np.int64]:
        """A party's integer contribution at ``state`` from its own per-example features (raw: each mechanism
        normalises them as its central runner does).

        Raises:
            InputError: a state or data that does not fit the mechanism.
        """

    @abstractmethod
    def absorb(self, total: npt.NDArray[np.int64]) -> None:
        """Fold one revealed noisy total into the student's state (post-processing)."""

    @abstractmethod
    def head(self) -> npt.NDArray[np.float64]:
        """The model so far: a linear head ``(classes, dim + 1)`` over L2-normalised features, bias last."""


class OneReleaseProtocol(ReleaseProtocol):
    """A federation of one release whose contribution needs no public state (every record, no sampling) and
    whose head is made from the released total (DP prototypes, DPPL-Public)."""

    rounds = 1
    _head: npt.NDArray[np.float64] | None = None

    def state(self) -> npt.NDArray[np.float64]:
        """Nothing: a party's contribution depends on nothing public but the configuration."""
        return np.zeros(0)

    def contribute(
        self,
        state: npt.NDArray[np.float64],
        features: npt.ArrayLike,
        labels: npt.NDArray[np.int64],
        source: NoiseSource,
    ) -> npt.NDArray[np.int64]:
        """The party's contribution over all its records."""
        del state, source
        return self.contribution(features, labels)

    @abstractmethod
    def contribution(self, features: npt.ArrayLike, labels: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The mechanism's integer contribution of these records."""

    @abstractmethod
    def head_of(self, total: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The linear head the released total makes (post-processing)."""

    def absorb(self, total: npt.NDArray[np.int64]) -> None:
        """The released total becomes the head."""
        self._head = self.head_of(total)

    def head(self) -> npt.NDArray[np.float64]:
        """The head made from the release.

        Raises:
            InputError: nothing was released yet.
        """
        if self._head is None:
            raise InputError(
                f"{self.mechanism.name}: nothing was released yet; the head exists after the release"
            )
        return self._head


class PrototypesProtocol(OneReleaseProtocol):
    """DP prototypes: one release of the per-class sums and counts; the head is the nearest prototype."""

    def __init__(self, mechanism: DPPrototypes, *, metric: str) -> None:
        self.mechanism = self.prototypes = mechanism
        self.metric = metric

    @classmethod
    def of(
        cls, config: DPPLMechanism, *, classes: int, dim: int, featuriser: Featuriser | None = None
    ) -> PrototypesProtocol:
        """From ``federation.yaml``'s ``dppl`` member and the backbone's feature dimension."""
        del featuriser
        bits = None if config.fixed_point_bits is None else FixedPoint(config.fixed_point_bits)
        mechanism = DPPrototypes(
            classes=classes, dim=dim, rho=config.rho, count_share=config.count_share, fixed_point=bits
        )
        return cls(mechanism, metric=config.metric)

    def contribution(self, features: npt.ArrayLike, labels: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The party's fixed-point per-class sums and counts."""
        return self.prototypes.contribution(features, labels)

    def head_of(self, total: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The released sums and counts as the nearest-prototype head."""
        sums, counts = self.prototypes.prototypes(total)
        return prototype_head(sums, counts, metric=self.metric)


class PublicVotesProtocol(OneReleaseProtocol):
    """DPPL-Public: one release of the noisy nearest-candidate vote counts; the head is the nearest prototype
    by cosine, each class's most-voted candidates weighted by their noisy counts (the central runner's
    student as a linear head)."""

    def __init__(self, mechanism: PublicPrototypeVotes) -> None:
        self.mechanism = self.votes = mechanism

    @classmethod
    def of(
        cls, config: DPPLPublicMechanism, *, classes: int, dim: int, featuriser: Featuriser | None
    ) -> PublicVotesProtocol:
        """From ``federation.yaml``'s ``dppl-public`` member: the pool's images generated and featurised here
        (deterministic, so every party gets the same candidates up to floating point).

        Raises:
            InputError: no featuriser (the pool needs the shared backbone), or pool features of another width.
        """
        from capc_common.synth import generate

        if featuriser is None:
            raise InputError(
                "dppl-public featurises its public candidate pool with the shared backbone; none given"
            )
        height, width, channels = featuriser.shape
        images = generate(
            config.pool_generator,
            seed=config.pool_seed,
            start=0,
            count=config.pool_size,
            height=height,
            width=width,
            channels=channels,
        )
        candidates = featuriser(images)
        if candidates.shape != (config.pool_size, dim):
            raise InputError(
                f"the pool's features have shape {candidates.shape}, expected ({config.pool_size}, {dim})"
            )
        return cls(
            PublicPrototypeVotes(
                classes=classes, candidates=candidates, rho=config.rho, per_class=config.per_class
            )
        )

    def contribution(self, features: npt.ArrayLike, labels: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The party's per-class nearest-candidate vote counts."""
        return self.votes.contribution(features, labels)

    def head_of(self, total: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The released counts become the prototypes, and those the nearest-prototype head."""
        prototypes = self.votes.prototypes(total)
        return prototype_head(prototypes, np.ones(len(prototypes)), metric="cosine")


class DPSGDProtocol(ReleaseProtocol):
    """Secure-aggregation DP-SGD by the recipe (:class:`~capc_common.mechanisms.training.DPSGDTrainer`): a
    statistics release, then per round the parties' clipped gradient sums at the current head; the student
    steps on the noisy mean gradient."""

    def __init__(self, trainer: DPSGDTrainer, *, feature_dim: int, pin: str | None = None) -> None:
        self.trainer, self.feature_dim, self.pin = trainer, feature_dim, pin
        self.mechanism = self.sgd = trainer.mechanism
        self.rounds = trainer.rounds

    @classmethod
    def of(
        cls, config: SecAggDPSGDMechanism, *, classes: int, dim: int, featuriser: Featuriser | None = None
    ) -> DPSGDProtocol:
        """From ``federation.yaml``'s ``secagg-dpsgd`` member and the backbone's feature dimension. The public
        basis is computed on first use (only a contributing party and the publishing student need it)."""
        bits = None if config.fixed_point_bits is None else FixedPoint(config.fixed_point_bits)
        p = config.projection
        k = dim if p is None else min(p.dim, dim)
        mechanism = SecureDPSGD(
            classes=classes,
            dim=k,
            clip=config.clip,
            noise_multiplier=config.noise_multiplier,
            sampling_rate=config.sampling_rate,
            fixed_point=bits,
        )
        recipe = Recipe(
            rounds=config.rounds,
            statistics=config.statistics,
            optimizer=config.optimizer,
            learning_rate=config.learning_rate,
            momentum=config.momentum,
            beta2=config.beta2,
            adam_eps=config.adam_eps,
            variance_floor=config.variance_floor,
            expected_batch=config.expected_batch,
            step_noise=config.step_noise,
            unit_variance=bool(config.unit_variance),
        )
        basis = None if p is None else (lambda: federation_basis(p, featuriser=featuriser))
        trainer = DPSGDTrainer(mechanism, recipe, basis=basis)
        return cls(trainer, feature_dim=dim, pin=None if p is None else p.sha256)

    def prepare(
        self, features: npt.ArrayLike, *, consume: bool = False
    ) -> npt.NDArray[np.float64] | npt.NDArray[np.float32]:
        """The party's records on the public basis (once; every round reuses them)."""
        return self.trainer.prepare(features, consume=consume)

    def precompute(self) -> None:
        """The public basis."""
        self.trainer.basis  # noqa: B018 -- the property computes it on first use

    def precomputed_names(self) -> frozenset[str]:
        """``basis`` if the federation projects on one."""
        return frozenset({"basis"}) if self.trainer.projects else frozenset()

    def precomputed(self) -> dict[str, npt.NDArray[Any]]:
        """The public basis, if the federation projects on one."""
        basis = self.trainer.basis
        return {} if basis is None else {"basis": basis}

    def adopt(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        """The public basis, checked against ``federation.yaml``'s pin as :func:`federation_basis` checks it.

        Raises:
            InputError: another name than ``basis``, or a basis of another shape.
            IntegrityError: a basis whose digest is not the pinned one.
        """
        from capc_common.mechanisms.basis import basis_digest

        if set(arrays) - {"basis"}:
            super().adopt({k: v for k, v in arrays.items() if k != "basis"})
        if "basis" in arrays:
            basis = arrays["basis"]
            if self.pin is not None and basis_digest(basis) != self.pin:
                raise IntegrityError(
                    f"the public basis handed over has SHA-256 {basis_digest(basis)}, federation.yaml pins "
                    f"{self.pin}"
                )
            self.trainer.adopt_basis(basis, feature_dim=self.feature_dim)

    def state(self) -> npt.NDArray[np.float64]:
        """The next release's phase, the feature map and the current head."""
        return self.trainer.state()

    def contribute(
        self,
        state: npt.NDArray[np.float64],
        features: npt.ArrayLike,
        labels: npt.NDArray[np.int64],
        source: NoiseSource,
    ) -> npt.NDArray[np.int64]:
        """The statistics or the clipped gradient sum at ``state`` over this release's Poisson sample of the
        records (``features`` as :meth:`prepare` returned them)."""
        # As prepared (float32 on a basis): a float64 copy each round would defeat the trainer's caches.
        return self.trainer.contribute(state, np.asarray(features), labels, source)

    def absorb(self, total: npt.NDArray[np.int64]) -> None:
        """The statistics, or one optimiser step on the noisy gradient sum."""
        self.trainer.absorb(total)

    def head(self) -> npt.NDArray[np.float64]:
        """The current head over the L2-normalised features."""
        return self.trainer.head()


def federation_basis(
    projection: ProjectionSection, *, featuriser: Featuriser | None
) -> npt.NDArray[np.float32]:
    """The federation's public basis, computed with the shared backbone (once per machine when the party has
    a shared feature cache: its synthetic images' features and the basis itself are cached there).

    Raises:
        InputError: no backbone to compute it with.
        IntegrityError: a basis whose digest differs from the one pinned in ``federation.yaml``.
    """
    from capc_common.mechanisms.basis import BASIS_VERSION, BasisSpec, basis_digest, is_basis, public_basis
    from capc_common.models.features import features_version

    if featuriser is None:
        raise InputError("secagg-dpsgd's public basis is computed with the shared backbone; none given")
    spec = BasisSpec(
        dim=projection.dim, generators=projection.generators, images=projection.images, seed=projection.seed
    )

    def compute() -> npt.NDArray[np.float32]:
        return public_basis(spec, featurize=featuriser, shape=featuriser.shape)

    cache = featuriser.cache
    if cache is None:
        basis = compute()
    else:
        name = (
            f"public-basis v{BASIS_VERSION} {features_version()} {featuriser.backbone.sha256} "
            f"{featuriser.shape} {spec.describe()}"
        )
        basis = cache.array(name, compute, valid=lambda a: is_basis(a, spec.dim))
    digest = basis_digest(basis)
    if projection.sha256 is not None and digest != projection.sha256:
        raise IntegrityError(
            f"this machine's public basis (basis version {BASIS_VERSION}) has SHA-256 {digest}, "
            f"federation.yaml pins {projection.sha256}: its floating point differs from the coordinator's, "
            "or the pin was made by another version of this software (version 3 since 2026-12-03); run on "
            "the coordinator's machine type and software, or pin the basis this machine computes (every "
            "party must compute the same one)"
        )
    return basis


#: The protocol each release member of ``federation.yaml`` runs, built by its ``of`` (the config only names
#: the parameters; this module runs them).
_PROTOCOLS: dict[type[ReleaseMember], Callable[..., ReleaseProtocol]] = {
    DPPLMechanism: PrototypesProtocol.of,
    DPPLPublicMechanism: PublicVotesProtocol.of,
    SecAggDPSGDMechanism: DPSGDProtocol.of,
}
