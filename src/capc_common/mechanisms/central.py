"""Central runners of the release mechanisms and of Private-kNN: the whole federation in one process.

Each runner plays every party exactly as the services do — a party computes its contribution on its own
records, secret-shares it with a fresh seed (:func:`~capc_common.mechanisms.release.share_contribution`),
the student adds its part of the noise to its shares (:func:`~capc_common.mechanisms.release.student_half`),
the guardian adds its part to the expanded seeds (:func:`~capc_common.mechanisms.release.masked_total`) and
the student reveals the noisy total (:func:`~capc_common.mechanisms.release.reveal`) — so with seeded
sources a federation must release the same totals, and the runners are the references of the differential
tests. :func:`run_private_knn` plays Private-kNN's parties and both noise draws batch by batch, as the
federation's teachers, guardian and student do (the 2PC equals the plaintext rule). The randomness of each
party (its Poisson samples), of the guardian and of the student (their parts of the noise) comes from its own
:class:`~capc_common.privacy.NoiseSource`: CSPRNGs unless seeded sources are injected for a test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import numpy.typing as npt

from capc_common.aggregation.noise import MechanismNoise, mechanism_noise
from capc_common.errors import InputError
from capc_common.mechanisms.knn import PrivateKNN
from capc_common.mechanisms.prototypes import DPPrototypes, normalise
from capc_common.mechanisms.public_prototypes import PublicPrototypes
from capc_common.mechanisms.public_votes import PublicPrototypeVotes
from capc_common.mechanisms.release import (
    ReleaseMechanism,
    masked_total,
    reveal,
    share_contribution,
    student_half,
)
from capc_common.mechanisms.training import DPSGDTrainer
from capc_common.privacy import NoiseSource, SystemNoise

if TYPE_CHECKING:
    from capc_common.dietpate.cache import FeatureCache
    from capc_common.learn.featurizers import Featurizer

__all__ = [
    "DPSGDResult",
    "PartyData",
    "extract_per_example",
    "per_example_features",
    "predict_head",
    "records_digest",
    "records_entry",
    "release_once",
    "run_private_knn",
    "run_prototypes",
    "run_public_prototype_votes",
    "run_public_prototypes",
    "run_secure_dpsgd",
    "write_per_example",
]

#: Images featurised (and cached) per chunk, so an interrupted extraction resumes where it stopped.
FEATURE_CHUNK = 2000
#: Images per forward pass with running statistics (per-example whatever the pass size; a fixed size keeps
#: the float arithmetic, hence the features, identical wherever they are computed).
PER_EXAMPLE_PASS = 64


def extract_per_example(
    featurizer: Featurizer, images: npt.NDArray[np.uint8], *, cache: FeatureCache | None = None
) -> npt.NDArray[np.float32]:
    """Per-example features (BatchNorm running statistics) of ``images``, a party's own records.

    The one extraction the release mechanisms use, in a teacher party's process and in the central runner
    alike, so both see the same floats (the differential test compares them bit for bit).

    Args:
        featurizer: the shared map.
        images: uint8 ``(N, H, W, C)``.
        cache: the party's *own* cache (the features are derived from its records: never one shared with
            other parties), keyed by the map and the records' content: a party that featurised the same
            records before (it starts again; the same site in another federation on its machine; what the
            site gets alone) reads them back instead of featurising them again. A cached file that does not
            load or holds another shape or dtype than ``(N, feature_dim)`` float32 (truncated, edited) is
            featurised again and replaced, with a warning naming it.
    """

    def extract() -> npt.NDArray[np.float32]:
        return np.asarray(featurizer.extract(images, bn_batch=PER_EXAMPLE_PASS, mode="running"))

    if cache is None:
        return extract()
    shape = (len(images), featurizer.feature_dim)
    return cache.get_or_compute(
        records_entry(featurizer, images), extract, valid=lambda a: a.shape == shape and a.dtype == np.float32
    )


def records_entry(featurizer: Featurizer, images: npt.NDArray[np.uint8]) -> dict[str, str]:
    """The records cache's entry for the per-example features of ``images`` under ``featurizer``: the map,
    the code computing it, the records' content (:func:`extract_per_example`, :func:`write_per_example`)."""
    from capc_common.models.features import features_version

    return {
        "kind": "records",
        "map": featurizer.sha256,
        "code": features_version(),
        "content": records_digest(images),
        "mode": "running",
    }


def records_digest(images: npt.NDArray[np.uint8]) -> str:
    """SHA-256 (hex) of the records' dtype, shape and bytes: :func:`records_entry`'s ``content``, and what a
    party's serving process compares with what its featurising process read (the same data, not a file
    replaced in between)."""
    content = hashlib.sha256(f"{images.dtype} {images.shape}".encode())
    content.update(np.ascontiguousarray(images).tobytes())
    return content.hexdigest()


#: Records featurised together by :func:`write_per_example`: whole passes, a few MB of features at a time.
_BLOCK = 32 * PER_EXAMPLE_PASS


def write_per_example(
    featurizer: Featurizer, images: npt.NDArray[np.uint8], handle: BinaryIO, *, block: int = _BLOCK
) -> None:
    """Write :func:`extract_per_example`'s features of ``images`` (the same bits) to ``handle`` as a ``.npy``
    file, a block of records at a time: a process that featurises a party's records holds a block of their
    features, not all of them (17,941 records of 4,225 features: 289 MB).

    The blocks are ``block`` records, whole passes of :data:`PER_EXAMPLE_PASS`, the last one taking the
    remainder, so every pass is over the same images as in one call (the last overlapping the one before as
    there).

    Raises:
        InputError: as :meth:`~capc_common.learn.Featurizer.extract` (fewer records than one pass).
    """
    if block % PER_EXAMPLE_PASS or block <= 0:
        raise InputError(f"a block of {block} records is not whole passes of {PER_EXAMPLE_PASS}")
    n, dim = len(images), featurizer.feature_dim
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False}
    np.lib.format.write_array_header_1_0(handle, {**header, "shape": (n, dim)})
    starts = list(range(0, max(n, 1), block))
    if len(starts) > 1 and n - starts[-1] < PER_EXAMPLE_PASS:  # a short tail: part of the block before
        starts.pop()
    for start, end in zip(starts, [*starts[1:], n], strict=True):
        rows = np.asarray(featurizer.extract(images[start:end], bn_batch=PER_EXAMPLE_PASS, mode="running"))
        if rows.shape != (end - start, dim) or rows.dtype != np.float32:
            raise InputError(f"the featurizer gave {rows.dtype} {rows.shape} for {end - start} records")
        handle.write(np.ascontiguousarray(rows).tobytes())


@dataclass(frozen=True)
class PartyData:
    """One party's private records: per-example features and labels.

    Attributes:
        name: the party's name (it names its seeded test stream).
        features: ``(n, dim)`` float features (per-example: BatchNorm running statistics).
        labels: ``(n,)`` class indices.
        images: ``(n, H, W, C)`` the records' images, for what needs the records themselves rather than their
            features: dealing a party's records to its teachers by content hash (CaPC's heads, Prom-PATE's
            prompted teachers) and training prompted teachers; None if not at hand.
    """

    name: str
    features: npt.NDArray[np.float32]
    labels: npt.NDArray[np.int64]
    images: npt.NDArray[np.uint8] | None = None


def per_example_features(
    featurizer: Featurizer,
    *,
    dataset: str,
    split: str,
    limit: int | None,
    cache: FeatureCache,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Features of the first ``limit`` images of a split, each computed alone (BatchNorm running
    statistics), cached chunk by chunk; and their labels.

    Per-example features are what the release mechanisms' sensitivity arguments need: with current
    statistics one record would move the features of the others in its chunk.
    """
    from capc_common.data import load_dataset

    data = load_dataset(dataset, split=split)
    n = len(data.labels) if limit is None else min(limit, len(data.labels))
    parts = []
    for start in range(0, n, FEATURE_CHUNK):
        stop = min(start + FEATURE_CHUNK, n)
        key = {
            "kind": "per-example",
            "map": featurizer.sha256,
            "dataset": dataset,
            "split": split,
            "range": [start, stop],
            "mode": "running",
        }
        found = cache.load(key)
        if found is None:
            log(f"features: {dataset} {split} [{start}, {stop}) of {n}")
            found = extract_per_example(featurizer, data.images[start:stop])
            cache.store(key, found)
        parts.append(found)
    return np.concatenate(parts), np.asarray(data.labels[:n], dtype=np.int64)


SourceOf = Callable[[str], NoiseSource]
"""A party's own randomness by its name (a fresh CSPRNG each, or seeded streams in a test)."""


def _party_sources(parties: Sequence[PartyData], source_of: SourceOf | None) -> dict[str, NoiseSource]:
    """Each party's sampling source: ``source_of(name)``, by default a fresh CSPRNG per party."""
    return {p.name: (source_of or (lambda _: SystemNoise()))(p.name) for p in parties}


def run_private_knn(
    parties: Sequence[PartyData],
    queries: npt.NDArray[np.float32],
    *,
    mechanism: PrivateKNN,
    batch_size: int,
    noise: MechanismNoise | None = None,
    party_sources: SourceOf | None = None,
) -> npt.NDArray[np.int64]:
    """Label ``queries`` with Private-kNN as a federation does: batch by batch, every party's kNN votes on a
    fresh Poisson sample per query, summed, then the guardian's noise and the argmax.

    The batching matters only for the order of the draws: the guardian draws each batch's noise when it
    computes that batch, so with seeded sources this runner releases what a federation with the same
    batches releases (the differential test).

    Args:
        parties: the parties' records (per-example features, as the teachers compute them).
        queries: query features ``(Q, dim)`` (the same map).
        mechanism: the Private-kNN object.
        batch_size: queries per batch (the federation's ``queries.batch_size``).
        noise: the guardian's and student's sources (default: CSPRNGs).
        party_sources: each party's sampling source by name (default: a fresh CSPRNG each).

    Returns:
        ``(Q,)`` labels (every query is answered).
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    sources = _party_sources(parties, party_sources)
    noise = noise or mechanism_noise()
    labels = []
    for start in range(0, len(queries), batch_size):
        batch = queries[start : start + batch_size]
        votes = [mechanism.votes(p.features, p.labels, batch, source=sources[p.name]) for p in parties]
        labels.append(mechanism.answer(np.sum(votes, axis=0), noise))
    return np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)


def release_once(
    mechanism: ReleaseMechanism, contributions: Sequence[npt.NDArray[np.int64]], *, noise: MechanismNoise
) -> npt.NDArray[np.int64]:
    """One release through real additive sharing: ``Σ contributions`` plus the guardian's and the student's
    parts of the noise, each from its own source (the student's drawn first, as the federation's student
    draws it before asking for the release; the sources are separate, so the order between them is moot).

    Raises:
        InputError: no contribution, or a total that could wrap around the ring.
    """
    if not contributions:
        raise InputError("a release needs at least one party's contribution")
    shared = [share_contribution(c) for c in contributions]
    half = student_half([share for _, share in shared], noise=mechanism.noise_part(noise.student))
    masked = masked_total([seed for seed, _ in shared], noise=mechanism.noise_part(noise.guardian))
    return reveal([half], masked)


def run_prototypes(
    parties: Sequence[PartyData], *, mechanism: DPPrototypes, noise: MechanismNoise | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Release the noisy per-class sums and counts of all parties' records (one release, cost ``ρ``).

    Returns:
        ``(sums (classes, dim), counts (classes,))`` in feature units.
    """
    mechanism.check_capacity(records=sum(len(p.labels) for p in parties))
    total = release_once(
        mechanism,
        [mechanism.contribution(p.features, p.labels) for p in parties],
        noise=noise or mechanism_noise(),
    )
    return mechanism.prototypes(total)


def run_public_prototypes(
    parties: Sequence[PartyData], *, mechanism: PublicPrototypes, selector: NoiseSource | None = None
) -> npt.NDArray[np.int64]:
    """DPPL-Public centrally: every party scores the public pool on its own records, the scores are summed
    and one curator draws the exponential mechanism (cost ``mechanism.release_rdp``).

    This runner is a *trusted curator*: it sees the summed scores. A federation would have to keep them
    secret-shared and draw the selection inside 2PC (docs/mechanisms.md says what is missing).

    Args:
        parties: each party's private records (features from the same map as the mechanism's pool).
        mechanism: the selection and its parameters (pool, ε, prototypes per class).
        selector: the curator's randomness; default a fresh :class:`~capc_common.privacy.SystemNoise`
            (a seeded source only in tests).

    Returns:
        ``(classes, per_class)`` indices of the selected candidates.

    Raises:
        InputError: no party, or a party's records that do not fit (shapes, labels, inf/NaN features).
    """
    if not parties:
        raise InputError("DPPL-Public needs at least one party's records")
    scores = np.sum([mechanism.contribution(p.features, p.labels) for p in parties], axis=0)
    return mechanism.select(scores, selector or SystemNoise())


def run_public_prototype_votes(
    parties: Sequence[PartyData], *, mechanism: PublicPrototypeVotes, noise: MechanismNoise | None = None
) -> npt.NDArray[np.int64]:
    """DPPL-Public as the federation runs it: one release of the parties' noisy nearest-candidate vote counts
    through real additive sharing (cost ``mechanism.release_rdp``).

    Returns:
        The released noisy counts (``classes × M``, class by class): ``mechanism.select`` /
        ``mechanism.prototypes`` / ``mechanism.predict`` post-process them.

    Raises:
        InputError: no party, or a party's records that do not fit (shapes, labels, inf/NaN features).
    """
    mechanism.check_capacity(records=sum(len(p.labels) for p in parties))
    return release_once(
        mechanism,
        [mechanism.contribution(p.features, p.labels) for p in parties],
        noise=noise or mechanism_noise(),
    )


@dataclass(frozen=True)
class DPSGDResult:
    """A trained head and what its training did.

    Attributes:
        weights: ``(classes, dim + 1)`` head, bias last, over L2-normalised features.
        rounds: releases made (the statistics release, if any, and the gradient rounds).
    """

    weights: npt.NDArray[np.float64]
    rounds: int

    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Labels of ``features`` (normalised as in training)."""
        return predict_head(self.weights, features)


def predict_head(weights: npt.NDArray[np.float64], features: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Labels under a linear head ``(classes, dim + 1)``, bias last, over L2-normalised ``features``: the
    form every release mechanism's model takes (DP-SGD's head, the nearest-prototype head)."""
    x = normalise(features)
    return np.argmax(x @ weights[:, :-1].T + weights[:, -1], axis=1).astype(np.int64)


def run_secure_dpsgd(
    parties: Sequence[PartyData],
    *,
    trainer: DPSGDTrainer,
    noise: MechanismNoise | None = None,
    party_sources: SourceOf | None = None,
) -> DPSGDResult:
    """Train the head as the federation does: per release, every party's contribution at the student's
    state over its own Poisson sample, released noisily, folded in by the student (post-processing).

    Args:
        parties: the parties' records (raw per-example features; the trainer normalises and projects them).
        trainer: the mechanism and its recipe (:class:`~capc_common.mechanisms.training.DPSGDTrainer`); it
            holds the student's state, and the trained head afterwards.
        noise: the guardian's and the student's noise sources (default: CSPRNGs).
        party_sources: each party's sampling source by name (default: a fresh CSPRNG each).
    """
    sources = _party_sources(parties, party_sources)
    trainer.mechanism.check_capacity(records=sum(len(p.labels) for p in parties))
    prepared = [trainer.prepare(p.features) for p in parties]
    noise = noise or mechanism_noise()
    for _ in range(trainer.rounds):
        state = trainer.state()
        contributions = [
            trainer.contribute(state, x, p.labels, sources[p.name])
            for p, x in zip(parties, prepared, strict=True)
        ]
        trainer.absorb(release_once(trainer.mechanism, contributions, noise=noise))
    return DPSGDResult(weights=trainer.head(), rounds=trainer.rounds)
