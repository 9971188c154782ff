"""DIET-PATE teachers: one linear head per private shard, over the frozen shared backbone.

A teacher party holds one or more teachers. Training computes the backbone's features **once** — each shard
on its own, in chunks of exactly ``bn_batch`` images with current statistics, so a teacher's features depend
only on its own data (a teacher whose statistics mixed in another shard's images would break the PATE
sensitivity argument) — and trains all heads at once, each on its own shard only
(:func:`capc_common.learn.heads.train_heads`). :func:`fit_teachers` is the one path from images to
teachers, used by the central pipeline and by a federation's teacher party alike.

A shard shorter than one chunk (:func:`short_shards`) cannot give its teacher BatchNorm statistics of its own
data, so that teacher *abstains*: it is not trained and casts a fixed, data-independent vote
(:func:`capc_common.learn.heads.fixed_votes`). Refusing the whole party instead would make whether a party
takes part at all depend on one example (docs/privacy.md, "A short shard abstains").

Answering queries (what ``capc teacher serve`` does): featurise the query batch in chunks of exactly
``bn_batch`` with current statistics (:func:`capc_common.models.extract_features`), then
:meth:`TeacherEnsemble.predict` gives every head's label and :meth:`TeacherEnsemble.votes` the party's
per-query vote histogram, which is what gets secret-shared.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.aggregation import vote_histogram
from capc_common.errors import InputError, IntegrityError
from capc_common.learn.heads import HeadEnsemble, HeadRecipe, train_heads

if TYPE_CHECKING:
    from capc_common.learn.featurizers import Featurizer

__all__ = ["TeacherEnsemble", "fit_teachers", "shard_features", "short_shards", "train_teachers"]


@dataclass(frozen=True)
class TeacherEnsemble:
    """A party's teachers: heads plus the backbone and BatchNorm settings they were trained with.

    Attributes:
        heads: one head per teacher.
        backbone_sha256: content hash of the backbone the heads sit on (queries must use the same one).
        bn_batch: chunk size the training features were computed with.
        bn_mode: ``"current"`` or ``"running"``.
    """

    heads: HeadEnsemble
    backbone_sha256: str
    bn_batch: int
    bn_mode: str = "current"

    @property
    def teachers(self) -> int:
        """Number of teachers (heads)."""
        return self.heads.heads

    @property
    def classes(self) -> int:
        """Number of classes."""
        return self.heads.classes

    @property
    def abstaining(self) -> tuple[int, ...]:
        """Teachers whose shard was shorter than one BatchNorm chunk: they cast a fixed vote."""
        return self.heads.abstaining

    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Every teacher's label for each query: ``int64`` ``(teachers, N)``.

        Args:
            features: ``(N, dim)`` query features from the same backbone (current statistics, chunks of
                exactly ``bn_batch``).
        """
        return self.heads.predict(features)

    def votes(self, features: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """This party's vote histogram ``(N, classes)``: the sum of its teachers' one-hot votes."""
        return vote_histogram(self.predict(features), classes=self.classes)

    def save(self, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
        """Write the teachers to a safetensors file (metadata: backbone hash, BatchNorm settings)."""
        meta = {
            **self.heads.metadata,
            "role": "teachers",
            "backbone_sha256": self.backbone_sha256,
            "bn_batch": str(self.bn_batch),
            "bn_mode": self.bn_mode,
        }
        if extra:
            meta["extra"] = json.dumps(extra, sort_keys=True)
        HeadEnsemble(self.heads.kind, self.heads.params, self.heads.classes, meta, self.abstaining).save(path)

    @classmethod
    def load(cls, path: str | Path, *, backbone_sha256: str | None = None) -> TeacherEnsemble:
        """Read teachers written by :meth:`save`.

        Args:
            path: the safetensors file.
            backbone_sha256: if given, the hash the heads must have been trained on.

        Raises:
            InputError: not a teachers file.
            IntegrityError: the heads were trained on a different backbone.
        """
        heads = HeadEnsemble.load(path)
        meta = heads.metadata
        if meta.get("role") != "teachers" or "backbone_sha256" not in meta:
            raise InputError(f"{path} holds heads but not teachers (no backbone hash recorded)")
        if backbone_sha256 is not None and meta["backbone_sha256"] != backbone_sha256.lower():
            raise IntegrityError(
                f"teachers in {path} were trained on backbone {meta['backbone_sha256']}, not on "
                f"{backbone_sha256}; retrain them on the federation's backbone"
            )
        return cls(heads, meta["backbone_sha256"], int(meta["bn_batch"]), meta.get("bn_mode", "current"))


def short_shards(shards: Sequence[npt.ArrayLike], *, bn_batch: int) -> tuple[int, ...]:
    """The teachers whose shard holds fewer than ``bn_batch`` images: they abstain (module docstring)."""
    return tuple(t for t, s in enumerate(shards) if len(np.asarray(s)) < bn_batch)


def shard_features(
    featurizer: Featurizer,
    images: npt.NDArray[np.uint8],
    shards: Sequence[npt.NDArray[np.int64]],
    *,
    bn_batch: int,
    mode: str = "current",
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Features of every shard that holds one BatchNorm chunk, each computed on its own in chunks of exactly
    ``bn_batch``; a shorter shard (:func:`short_shards`, its teacher abstains) contributes no rows.

    Args:
        featurizer: the shared frozen map, e.g. ``BackboneFeaturizer(backbone)``.
        images: uint8 ``(N, H, W, C)``.
        shards: disjoint index arrays, one per teacher.
        bn_batch: BatchNorm chunk size.
        mode: ``"current"`` or ``"running"`` statistics.

    Returns:
        ``(features (M, dim), owners (M,), index (M,))``: row ``r`` is image ``index[r]`` of teacher
        ``owners[r]``; rows are grouped by teacher.
    """
    index, owners = _voting_rows(shards, bn_batch=bn_batch)
    out = np.empty((len(index), featurizer.feature_dim), np.float32)
    for t in np.unique(owners).tolist():
        rows = owners == t
        out[rows] = featurizer.extract(images[index[rows]], bn_batch=bn_batch, mode=mode)
    return out, owners, index


def _voting_rows(
    shards: Sequence[npt.ArrayLike], *, bn_batch: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(index, owners)`` of the training rows of the teachers that do not abstain, grouped by teacher."""
    short = set(short_shards(shards, bn_batch=bn_batch))
    voting = [(t, np.asarray(s, np.int64)) for t, s in enumerate(shards) if t not in short]
    index = np.concatenate([s for _, s in voting] or [np.zeros(0, np.int64)])
    owners = np.repeat(np.array([t for t, _ in voting], np.int64), [len(s) for _, s in voting])
    return index, owners


def train_teachers(
    features: npt.ArrayLike,
    labels: npt.ArrayLike,
    owners: npt.ArrayLike,
    *,
    teachers: int,
    classes: int,
    backbone_sha256: str,
    bn_batch: int,
    bn_mode: str = "current",
    recipe: HeadRecipe | None = None,
    seed: int = 0,
    abstain: Sequence[int] = (),
) -> TeacherEnsemble:
    """Train every teacher's head on features from :func:`shard_features` (each head on its own rows only).

    Args:
        features: ``(M, dim)`` shard features.
        labels: ``(M,)`` their private labels.
        owners: ``(M,)`` teacher of each row.
        teachers: number of teachers.
        classes: number of classes.
        backbone_sha256: hash of the backbone (featurizer) the features came from, recorded with the heads.
        bn_batch: chunk size the features were computed with.
        bn_mode: statistics mode the features were computed with.
        recipe: how each head is fitted (default: the paper's fixed-step Adam on the last layer).
        seed: MLP initialisation seed (shared by all teachers: same initialisation).
        abstain: teachers with a short shard (:func:`short_shards`): no rows, a fixed vote.

    Returns:
        The :class:`TeacherEnsemble`.
    """
    heads = train_heads(
        features,
        labels,
        owners=owners,
        heads=teachers,
        classes=classes,
        recipe=recipe,
        seed=seed,
        abstain=abstain,
    )
    return TeacherEnsemble(heads, backbone_sha256.lower(), int(bn_batch), bn_mode)


def fit_teachers(
    featurizer: Featurizer,
    images: npt.NDArray[np.uint8],
    labels: npt.NDArray[np.int64],
    shards: Sequence[npt.NDArray[np.int64]],
    *,
    classes: int,
    bn_batch: int,
    bn_mode: str = "current",
    recipe: HeadRecipe | None = None,
    seed: int = 0,
    features: Callable[[], npt.NDArray[np.float32]] | None = None,
) -> TeacherEnsemble:
    """A party's (or a central run's) teachers from its images: the one training path of both.

    Each shard is featurised on its own (:func:`shard_features`) and each head trained on its own shard
    (:func:`train_teachers`), so one training example can change one teacher only; a teacher whose shard is
    shorter than ``bn_batch`` abstains (:func:`short_shards`).

    Args:
        featurizer: the shared frozen map.
        images: uint8 ``(N, H, W, C)`` training images.
        labels: ``(N,)`` their labels.
        shards: disjoint index arrays into ``images``, one per teacher.
        classes: number of classes.
        bn_batch: BatchNorm chunk size.
        bn_mode: ``"current"`` or ``"running"``.
        recipe: how each head is fitted.
        seed: MLP initialisation seed.
        features: optional loader of the rows :func:`shard_features` would return for these shards (a
            cache); called instead of featurising.

    Raises:
        InputError: bad labels, or cached features that do not match the shards.
    """
    rows = (
        features()
        if features is not None
        else shard_features(featurizer, images, shards, bn_batch=bn_batch, mode=bn_mode)[0]
    )
    index, owners = _voting_rows(shards, bn_batch=bn_batch)
    if rows.shape[0] != len(index):
        raise InputError(
            f"cached shard features have {rows.shape[0]} rows for {len(index)} shard images; clear the cache"
        )
    return train_teachers(
        rows,
        np.asarray(labels)[index],
        owners,
        teachers=len(shards),
        classes=classes,
        backbone_sha256=featurizer.sha256,
        bn_batch=bn_batch,
        bn_mode=bn_mode,
        recipe=recipe,
        seed=seed,
        abstain=short_shards(shards, bn_batch=bn_batch),
    )
