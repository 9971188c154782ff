"""The plug-in interface every mechanism of the engine implements (DESIGN §3, "Mechanisms share this engine").

The engine — parties holding private data, secret-shared contributions, a guardian that adds noise and keeps
the ledger, a 2PC step where needed, a student — is the same for every mechanism. What differs is captured
by one object:

* what a teacher party contributes (its :class:`~capc_common.mechanisms.voters.Voter`);
* what a batch costs (its accounting, next to it: per screened query and per answered query, at any orders);
* how the guardian noises the secret-shared total, and what the student adds itself, in the canonical order;
* the plaintext output rule given that noise (the central runner and the reference the secure path matches);
* the 2PC that turns the shared total plus noise into the output (:meth:`SelectionMechanism.garble`).

Services and the central runner take such an object and never branch on a mechanism's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from capc_common.aggregation.histogram import check_histograms
from capc_common.aggregation.noise import MechanismNoise
from capc_common.mechanisms.voters import HeadsVoter, PartyResources, Voter

if TYPE_CHECKING:
    from capc_common.models import Backbone, FixedFront
    from capc_common.mpc import GarblerSession, MpcConfig, Reveal
    from capc_common.privacy import DataDependentPATEAccountant, NoiseSource

__all__ = ["UNANSWERED", "BatchNoise", "SelectionMechanism", "TrainedTeachers"]

UNANSWERED = -1
"""Label of a query a selection mechanism did not answer (its noisy top vote failed the threshold)."""

Commit = Callable[["Reveal"], None]
"""The ledger hook: gets the batch's pass bits and decoding bits (:class:`~capc_common.mpc.Reveal`) before any
reveal, and makes the charge durable before returning."""
Mark = Callable[[], None]
"""Called once before the first pass bit is decoded (the guardian records the computation there)."""


@dataclass(frozen=True)
class TrainedTeachers:
    """What a party trained for its voter, not yet saved (it stays on site).

    Attributes:
        save: writes it, atomically, to the party's teachers file (its voter loads it from there).
        train_accuracy: each teacher on its own shard, a sanity figure for the operator (None when every
            teacher abstains).
        abstaining: the teachers whose shard is shorter than one BatchNorm chunk (they cast a fixed vote).
    """

    save: Callable[[Path], None]
    train_accuracy: float | None
    abstaining: tuple[int, ...] = ()


@dataclass(frozen=True)
class BatchNoise:
    """One batch's secret noise, drawn by one party in the mechanism's canonical order.

    Attributes:
        arrays: named integer arrays (e.g. ``z1`` and ``z2`` for Confident-GNMax's guardian). Never logged.
    """

    arrays: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> npt.NDArray[np.int64]:
        return self.arrays[name]


class SelectionMechanism(ABC):
    """A PATE-family mechanism: parties contribute per-query vote counts; the output is a noisy argmax per
    query, possibly only for queries that pass a noisy screening (Confident-GNMax).

    Subclasses hold the public parameters (validated in ``__init__``) and implement the accounting, the
    noise draws, the plaintext rule and — where the mechanism has a secure path — the 2PC.

    Attributes:
        name: registry name (``federation.yaml`` / ``run.yaml`` ``mechanism.name``).
        accounting: what one screened and one answered query are charged, with the source.
        classes: number of classes ``c`` of the vote counts.
    """

    name: ClassVar[str]
    #: What a screened and an answered query cost, with the source: the model card's ``accountant`` names it
    #: (:func:`capc_common.privacy.claims.accountant`), so a card says which mechanism ran.
    accounting: ClassVar[str]
    #: Whether a teacher party votes with heads it trained (``capc local up`` trains missing ones).
    trains_heads: ClassVar[bool] = True
    #: Whether :meth:`train_teachers` featurises the party's images through the backbone as they are, so
    #: a :class:`~capc_common.models.FixedFront` of them computed once serves it (and the records cache).
    shares_fixed_front: ClassVar[bool] = True
    classes: int

    # ------------------------------------------------------------------ what a teacher party contributes
    def voter(self, party: PartyResources) -> Voter:
        """The teacher party's voter under this mechanism: by default its trained heads (PATE)."""
        return HeadsVoter(party.backbone, party.heads(), classes=self.classes, cache=party.feature_cache)

    def train_teachers(
        self,
        backbone: Backbone,
        images: npt.NDArray[np.uint8],
        labels: npt.NDArray[np.int64],
        shards: Sequence[npt.NDArray[np.int64]],
        *,
        bn_batch: int,
        front: FixedFront | None = None,
    ) -> TrainedTeachers:
        """What a party trains for its voter (``capc teacher train``), one teacher per shard of its own data,
        each on its shard alone: by default PATE heads (the central pipeline's
        :func:`~capc_common.learn.teachers.fit_teachers`, features in current statistics over ``bn_batch``
        chunks of the shard, the setting the party votes in). A teacher whose shard is shorter than one
        chunk abstains (a fixed vote) rather than refusing the party.

        Args:
            backbone: the shared backbone.
            images: the party's images.
            labels: their labels.
            shards: disjoint index arrays, one per teacher.
            bn_batch: the federation's BatchNorm chunk.
            front: the backbone's fixed front end of ``images``, computed once by the party (the same
                features, without computing the scattering again).
        """
        from capc_common.learn import BackboneFeaturizer, fit_teachers, shard_features

        featurizer = BackboneFeaturizer(backbone, front=front)
        features, owners, index = shard_features(
            featurizer, images, shards, bn_batch=bn_batch, mode="current"
        )
        ensemble = fit_teachers(
            featurizer,
            images,
            labels,
            shards,
            classes=self.classes,
            bn_batch=bn_batch,
            features=lambda: features,
        )
        own = ensemble.heads.predict_own(features, owners)
        return TrainedTeachers(
            save=ensemble.save,
            train_accuracy=float((own == labels[index]).mean()) if len(index) else None,
            abstaining=ensemble.abstaining,
        )

    # ------------------------------------------------------------------ accounting
    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The public parameters (JSON-serialisable): recorded with every ledger entry and report."""

    @abstractmethod
    def costs(self, orders: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Data-independent RDP at each order of one screened query and of one answered query.

        A batch of ``B`` queries of which ``a`` were answered costs ``B·query + a·answer``; mechanisms that
        answer every query put their whole per-query cost in ``answer`` (and 0 in ``query``).
        """

    def data_dependent(self) -> DataDependentPATEAccountant | None:
        """A PATE-2018 data-dependent accountant for central research reports (UNSANITISED), or None where
        the mechanism has no such analysis."""
        return None

    def pass_probability(self, top_votes: float) -> float:
        """The probability that a query whose top class holds ``top_votes`` votes is answered: 1 where the
        mechanism answers every query (no screening). A planning figure from public parameters, never a
        charge."""
        del top_votes
        return 1.0

    # ------------------------------------------------------------------ noise (canonical order)
    @abstractmethod
    def guardian_noise(self, source: NoiseSource, *, batch: int) -> BatchNoise:
        """The guardian's secret noise of one batch of ``batch`` queries."""

    def student_noise(self, source: NoiseSource, *, batch: int) -> npt.NDArray[np.int64] | None:
        """The student's part of one batch's noise (entered into the 2PC by the student); None if none."""
        del source, batch
        return None

    # ------------------------------------------------------------------ output
    @abstractmethod
    def rule(
        self,
        histograms: npt.NDArray[np.int64],
        guardian: BatchNoise,
        student: npt.NDArray[np.int64] | None,
    ) -> npt.NDArray[np.int64]:
        """The plaintext output for given histograms and noise: labels, :data:`UNANSWERED` (−1) where a query
        is unanswered."""

    def answer(self, histograms: npt.ArrayLike, noise: MechanismNoise) -> npt.NDArray[np.int64]:
        """Answer one batch in plaintext, drawing both parties' noise as a federation does.

        Args:
            histograms: vote histograms ``(B, c)``.
            noise: the guardian's and the student's sources (CSPRNGs, or seeded ones in tests).

        Returns:
            ``int64`` labels ``(B,)``, :data:`UNANSWERED` where unanswered.
        """
        hist = check_histograms(histograms, classes=self.classes)
        guardian = self.guardian_noise(noise.guardian, batch=hist.shape[0])
        student = self.student_noise(noise.student, batch=hist.shape[0])
        return self.rule(hist, guardian, student)

    # ------------------------------------------------------------------ secure path
    @abstractmethod
    def mpc_config(self, *, teachers: int) -> MpcConfig:
        """The 2PC parameters for ``teachers`` voting heads (ring width from the noise bounds).

        Raises:
            InputError: the mechanism has no secure path (central runs only).
        """

    @abstractmethod
    def garble(
        self,
        session: GarblerSession,
        *,
        batch_id: str,
        seeds: Sequence[bytes],
        shape: tuple[int, int],
        noise: BatchNoise,
        commit: Commit,
        before_decode: Mark | None = None,
    ) -> npt.NDArray[np.bool_]:
        """The guardian's side of one batch's 2PC; ``commit`` gets the reveal before anything is revealed.

        Args:
            session: the garbler session over the student link.
            batch_id: the batch (the evaluator opens the same one).
            seeds: one share seed per agreed teacher party, in federation order.
            shape: ``(B, c)``.
            noise: the guardian's noise of this batch (:meth:`guardian_noise`).
            commit: the ledger hook; it must make the charge durable before returning.
            before_decode: called once before the first pass bit is decoded.

        Returns:
            ``(B,)`` pass bits.

        Raises:
            InputError: the mechanism has no secure path.
        """
