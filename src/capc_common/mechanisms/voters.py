"""What a teacher party contributes to a selection mechanism: a *voter* turns query images into per-query vote
counts on the party's own private data (DESIGN §3, "Mechanisms share this engine").

The teacher service asks the federation's mechanism for its voter (:meth:`SelectionMechanism.voter`) and
calls it for every work item; the sharing, the guardian's noise and the 2PC that follow are the same for
every voter. Two exist:

* :class:`HeadsVoter` (PATE: Confident-GNMax, GNMax): the party's trained heads on the shared backbone in
  current-statistics mode, one one-hot vote per head;
* :class:`KNNVoter` (Private-kNN): for each query a fresh Poisson sample of the party's records votes with
  its ``k`` nearest (cosine on per-example features);
* :class:`PromptedVoter` (Prom-PATE): the party's prompted teachers, each on its own prompted copy of the
  query batch, one vote per teacher.

The voter gets what it needs from the party through :class:`PartyResources`, which loads lazily: a kNN party
has no teachers file and a heads party never featurises its records.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from capc_common.learn.heads import HeadEnsemble
    from capc_common.learn.prompts import PromptedTeachers
    from capc_common.mechanisms.knn import PrivateKNN
    from capc_common.models import Backbone
    from capc_common.models.cache import FeatureCache
    from capc_common.privacy import NoiseSource

__all__ = ["HeadsVoter", "KNNVoter", "PartyResources", "PromptedVoter", "Voter", "per_example"]

#: Images per forward pass of per-example (running-statistics) features: the result does not depend on it.
PER_EXAMPLE_CHUNK = 64


def per_example(backbone: Backbone, images: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """Features of ``images``, each computed alone (BatchNorm running statistics).

    Private-kNN's sensitivity argument (one record moves at most one vote) needs a record's features to
    depend on that record only; with current statistics it would move the features of its chunk-mates.
    Records and queries go through this same map, in the federation and in the central runner alike.
    """
    from capc_common.models import extract_features

    if len(images) == 0:
        return np.zeros((0, backbone.feature_dim), dtype=np.float32)
    chunk = min(PER_EXAMPLE_CHUNK, len(images))  # running statistics: any chunk gives the same features
    return extract_features(backbone, images, bn_batch=chunk, mode="running")


class PartyResources(Protocol):
    """What a teacher party can lend its voter; each is loaded only when a voter asks for it."""

    @property
    def backbone(self) -> Backbone:
        """The shared backbone (verified against federation.yaml)."""

    @property
    def teachers_file(self) -> Path:
        """Where the party keeps what it trained for its voter (``capc teacher train`` writes it)."""

    def heads(self) -> HeadEnsemble:
        """The party's trained heads, checked against federation.yaml."""

    def records(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """The party's own labelled images (its site's ``data:`` section)."""

    def sampling(self) -> NoiseSource:
        """The party's own randomness for sampling: a CSPRNG, or its seeded stream in insecure-noise mode."""

    @property
    def feature_cache(self) -> FeatureCache | None:
        """Query features shared with the parties of the same machine (a local federation), or None."""


class Voter(ABC):
    """Turns query images into this party's vote counts ``(B, classes)``.

    Attributes:
        heads: the most votes the voter casts per query (the ``heads`` federation.yaml gives the party; the
            student checks it at hello).
    """

    heads: int

    @abstractmethod
    def vote(self, images: npt.NDArray[np.uint8], *, bn_batch: int) -> npt.NDArray[np.int64]:
        """Vote counts of one batch of query images (``bn_batch``: the federation's BatchNorm chunk)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Public facts for the party's ``/api/v1/status`` (never its data)."""


class HeadsVoter(Voter):
    """PATE teachers: the backbone once over the batch (current statistics, ``bn_batch`` chunks), then every
    head; one one-hot vote per head per query.

    Args:
        backbone: the shared backbone.
        heads: the party's heads.
        classes: classes of the federation.
        cache: features of the (public) query chunks shared with co-located parties, if any.
    """

    def __init__(
        self, backbone: Backbone, heads: HeadEnsemble, *, classes: int, cache: FeatureCache | None = None
    ) -> None:
        self.backbone = backbone
        self.ensemble = heads
        self.heads = heads.heads
        self.classes = classes
        self.cache = cache

    def vote(self, images: npt.NDArray[np.uint8], *, bn_batch: int) -> npt.NDArray[np.int64]:
        """One-hot votes of every head, summed per query."""
        from capc_common.aggregation import vote_histogram
        from capc_common.models import extract_features

        if self.cache is not None:
            features = self.cache.extract(self.backbone, images, bn_batch=bn_batch, mode="current")
        else:
            features = extract_features(self.backbone, images, bn_batch=bn_batch, mode="current")
        return vote_histogram(self.ensemble.predict(features), classes=self.classes)

    def describe(self) -> dict[str, Any]:
        """The number of heads."""
        return {"voter": "heads", "heads": self.heads}


class KNNVoter(Voter):
    """Private-kNN: per query, a fresh Poisson sample of the party's records votes with its ``k`` nearest.

    The records' per-example features are computed once, when the voter is made; query features are
    computed per batch with the same map (:func:`per_example`), so BatchNorm chunks play no part.

    Args:
        mechanism: the federation's Private-kNN (``k``, ``q``, classes).
        backbone: the shared backbone.
        images: the party's record images.
        labels: their labels.
        source: the party's sampling randomness (a CSPRNG in production).
    """

    def __init__(
        self,
        mechanism: PrivateKNN,
        backbone: Backbone,
        images: npt.NDArray[np.uint8],
        labels: npt.NDArray[np.int64],
        *,
        source: NoiseSource,
    ) -> None:
        self.mechanism = mechanism
        self.backbone = backbone
        self.features = per_example(backbone, images)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.source = source
        self.heads = mechanism.neighbours

    def vote(self, images: npt.NDArray[np.uint8], *, bn_batch: int) -> npt.NDArray[np.int64]:
        """kNN votes, a fresh Poisson sample per query (per-example features: ``bn_batch`` plays no part)."""
        del bn_batch
        queries = per_example(self.backbone, images)
        return self.mechanism.votes(self.features, self.labels, queries, source=self.source)

    def describe(self) -> dict[str, Any]:
        """``k``, ``q`` and how many records the party votes from (a count its peers could infer anyway)."""
        return {
            "voter": "private-knn",
            "heads": self.heads,
            "neighbours": self.mechanism.neighbours,
            "sampling_rate": self.mechanism.sampling_rate,
            "records": len(self.labels),
        }


class PromptedVoter(Voter):
    """Prom-PATE teachers: each teacher runs the backbone on its own prompted copy of the query batch (current
    statistics, ``bn_batch`` chunks of that batch only, as they were trained) and casts one vote.

    Args:
        teachers: the party's prompted teachers (:meth:`PromptedTeachers.load`).
    """

    def __init__(self, teachers: PromptedTeachers) -> None:
        self.teachers = teachers
        self.heads = teachers.teachers

    def vote(self, images: npt.NDArray[np.uint8], *, bn_batch: int) -> npt.NDArray[np.int64]:
        """One vote per teacher per query (the whole batch is one voting batch).

        Raises:
            InputError: the federation's BatchNorm chunk is not the one the teachers were trained with.
        """
        from capc_common.errors import InputError

        if bn_batch != self.teachers.bn_batch:
            raise InputError(
                f"the prompted teachers were trained with BatchNorm chunks of {self.teachers.bn_batch}, but "
                f"the federation votes in chunks of {bn_batch}: retrain them"
            )
        return self.teachers.histograms(images, batch=len(images))

    def describe(self) -> dict[str, Any]:
        """The number of teachers and the prompt recipe (public: federation.yaml holds it)."""
        return {"voter": "prompted", "heads": self.heads, "recipe": self.teachers.recipe.describe()}
