"""Prompted teachers (Prom-PATE): a learned visual prompt plus a label map on the frozen shared backbone.

Prom-PATE (Li et al. 2023, "Exploring the benefits of visual prompting in differential privacy") trains each
teacher as a *visual prompt* — a learned input perturbation — and a *label mapping* on a frozen source model,
then aggregates the teachers' votes with PATE. The paper's source model is an ImageNet classifier; none is
available here, so the source model is the project's own synthetic-pretrained backbone (``hybrid-28x28x1``
for 28×28×1 images, the training-free scattering backbone for other shapes). It has no source classes, so
the label map is a linear map from the backbone's features to the target classes — the "full label mapping"
form, not the paper's one-to-one source-class mapping.

A teacher ``t`` classifies an image ``x`` (``[0, 1]`` pixels, ``(C, H, W)``) as
``argmax(W_t · f(x·keep + P_t·mask) + b_t)``, where ``f`` is the frozen backbone with BatchNorm **current
statistics**, ``P_t`` the prompt and (by :class:`PromptRecipe` ``kind``) either ``pad`` — the outer
``width`` pixels are replaced by the prompt (the padding prompt of Bahng et al. 2022, without resizing: the
borders of 28×28 images are nearly empty) — or ``additive`` — the prompt is added to every pixel.

**One example moves one teacher** (docs/privacy.md §2). Each teacher is a function of its own shard only:

* its shard is run through the backbone alone, in chunks of exactly ``bn_batch`` of its own (prompted)
  images, so BatchNorm statistics never mix shards; at voting time a teacher's prompted query batch is cut
  into chunks of the query batch only;
* training has two stages, both per teacher with its own parameters and optimiser state and a fixed number
  of steps (no joint stopping rule): the label map is first fitted on the features of the shard at the
  initial prompt (the DIET-PATE head recipe, :func:`~capc_common.learn.heads.train_heads`, whose heads are
  independent bit for bit); then prompt and map are trained together by full-batch Adam through the frozen
  backbone, one teacher at a time;
* a teacher whose shard is shorter than one chunk abstains: it is not trained and casts the fixed vote of
  :func:`~capc_common.learn.heads.fixed_votes`, as a DIET-PATE head does.

Tests (``tests/learn/test_prompts.py``) change one example of one shard and check that every other
teacher's prompt and map are bit-identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from capc_common.errors import InputError
from capc_common.learn.featurizers import BackboneFeaturizer
from capc_common.learn.heads import HeadRecipe, fixed_votes, read_safetensors, train_heads
from capc_common.learn.teachers import shard_features, short_shards
from capc_common.models import Backbone, bn_stats, chunk_starts, to_tensor

__all__ = ["PromptKind", "PromptRecipe", "PromptedTeachers", "train_prompted_teachers"]

PromptKind = Literal["pad", "additive"]

#: ``format`` of a prompted-teachers file (:meth:`PromptedTeachers.save`).
_FORMAT = "capc-prompted-teachers-v1"


@dataclass(frozen=True)
class PromptRecipe:
    """How a prompted teacher is made.

    Attributes:
        kind: ``pad`` (the prompt replaces a border of ``width`` pixels) or ``additive`` (added everywhere).
        width: border width of a ``pad`` prompt, in pixels.
        map_steps: stage 1, the label map alone on the shard's features at the initial prompt: full-batch
            Adam steps (the DIET-PATE teacher recipe).
        map_lr: stage 1 learning rate.
        steps: stage 2, prompt and map together through the backbone: full-batch Adam steps. The
            expensive part (a forward and a backward pass of the shard per step).
        prompt_lr: stage 2 learning rate of the prompt (pixels are in ``[0, 1]``).
        joint_map_lr: stage 2 learning rate of the map.
    """

    kind: PromptKind = "pad"
    width: int = 3
    map_steps: int = 50
    map_lr: float = 1e-3
    steps: int = 10
    prompt_lr: float = 0.05
    joint_map_lr: float = 1e-3

    def __post_init__(self) -> None:
        if self.kind not in ("pad", "additive"):
            raise InputError(f"unknown prompt kind {self.kind!r}; choose 'pad' or 'additive'")
        if self.width < 1 or self.map_steps < 1 or self.steps < 0:
            raise InputError(
                f"need width >= 1, map_steps >= 1 and steps >= 0, got width={self.width}, "
                f"map_steps={self.map_steps}, steps={self.steps}"
            )
        if not (self.map_lr > 0 and self.prompt_lr > 0 and self.joint_map_lr > 0):
            raise InputError(
                f"learning rates must be > 0, got map_lr={self.map_lr}, prompt_lr={self.prompt_lr}, "
                f"joint_map_lr={self.joint_map_lr}"
            )

    def describe(self) -> dict[str, str | int | float]:
        """The recipe as plain values (for reports and cache keys)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def mask(self, shape: tuple[int, int, int]) -> torch.Tensor:
        """Where the prompt acts: ``(C, H, W)`` of 0/1 for an ``(H, W, C)`` image.

        Raises:
            InputError: a ``pad`` border that would cover the whole image.
        """
        h, w, c = shape
        if self.kind == "additive":
            return torch.ones(c, h, w)
        if 2 * self.width >= min(h, w):
            raise InputError(
                f"a pad prompt of width {self.width} covers the whole {h}×{w} image; lower width"
            )
        m = torch.ones(c, h, w)
        m[:, self.width : h - self.width, self.width : w - self.width] = 0.0
        return m


def prompted(x: torch.Tensor, prompt: torch.Tensor, *, mask: torch.Tensor, kind: PromptKind) -> torch.Tensor:
    """Images ``x`` ``(N, C, H, W)`` with ``prompt`` ``(C, H, W)`` applied (replacing or added)."""
    if kind == "pad":
        return x * (1.0 - mask) + prompt * mask
    return x + prompt * mask


def _features(backbone: Backbone, x: torch.Tensor, *, bn_batch: int) -> torch.Tensor:
    """Backbone features of ``x`` in chunks of exactly ``bn_batch`` (the rule of
    :func:`~capc_common.models.chunk_starts`), differentiable; statistics as set by the caller's
    :func:`~capc_common.models.bn_stats`."""
    parts = []
    done = 0
    for start in chunk_starts(x.shape[0], bn_batch=bn_batch):
        feats = backbone.features(x[start : start + bn_batch])
        parts.append(feats[done - start :])
        done = start + bn_batch
    return torch.cat(parts)


@contextmanager
def _frozen(backbone: Backbone) -> Iterator[None]:
    """No gradients for the backbone's own weights (only the prompt and map learn); restored afterwards."""
    before = [p.requires_grad for p in backbone.parameters()]
    backbone.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(backbone.parameters(), before, strict=True):
            p.requires_grad_(flag)


@dataclass(frozen=True)
class PromptedTeachers:
    """``teachers`` prompted teachers on one frozen backbone.

    Attributes:
        backbone: the shared frozen backbone (never modified).
        prompts: ``(teachers, C, H, W)`` float32 prompts.
        weights: ``(teachers, classes, dim)`` label maps.
        biases: ``(teachers, classes)``.
        recipe: how they were made.
        bn_batch: BatchNorm chunk size (current statistics) of training and voting.
        losses: ``(teachers, steps)`` stage-2 training loss before each step (empty with ``steps = 0``).
        abstaining: teachers whose shard was shorter than ``bn_batch``: untrained, they cast a fixed vote.
    """

    backbone: Backbone
    prompts: torch.Tensor
    weights: torch.Tensor
    biases: torch.Tensor
    recipe: PromptRecipe
    bn_batch: int
    losses: npt.NDArray[np.float64]
    abstaining: tuple[int, ...] = ()

    @property
    def teachers(self) -> int:
        """Number of teachers."""
        return int(self.prompts.shape[0])

    @property
    def classes(self) -> int:
        """Number of classes."""
        return int(self.weights.shape[1])

    def predict(self, images: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
        """Every teacher's label for a batch of images (ties to the lowest class).

        Each teacher runs the backbone on its own prompted copy of the batch, in chunks of exactly
        ``bn_batch`` of it with current statistics — the query batch's statistics, as DIET-PATE teachers
        vote. The cost is one backbone pass per teacher per image.

        Args:
            images: uint8 ``(N, H, W, C)``, ``N ≥ bn_batch``.

        Returns:
            ``int64`` ``(teachers, N)``.

        Raises:
            InputError: fewer images than one chunk, or images of the wrong shape.
        """
        if images.ndim != 4 or tuple(images.shape[1:]) != tuple(self.backbone.input_shape):
            raise InputError(f"expected uint8 images (N, {self.backbone.input_shape}), got {images.shape}")
        if len(images) < self.bn_batch:
            raise InputError(f"{len(images)} images are fewer than one BatchNorm chunk of {self.bn_batch}")
        x = to_tensor(images)
        h, w, c = self.backbone.input_shape
        mask = self.recipe.mask((h, w, c))
        out = np.empty((self.teachers, len(images)), np.int64)
        with torch.inference_mode(), bn_stats(self.backbone, "current"):
            for t in range(self.teachers):
                if t in self.abstaining:
                    out[t] = fixed_votes(t, len(images), classes=self.classes)
                    continue
                feats = _features(
                    self.backbone,
                    prompted(x, self.prompts[t], mask=mask, kind=self.recipe.kind),
                    bn_batch=self.bn_batch,
                )
                logits = torch.addmm(self.biases[t], feats, self.weights[t].T)
                out[t] = logits.argmax(dim=1).numpy()
        return out

    def teacher(self, index: int) -> PromptedTeachers:
        """Teacher ``index`` alone (e.g. to check it on its own shard without running every other teacher)."""
        part = slice(index, index + 1)
        return replace(
            self,
            prompts=self.prompts[part],
            weights=self.weights[part],
            biases=self.biases[part],
            losses=self.losses[part],
            abstaining=(0,) if index in self.abstaining else (),
        )

    def save(self, path: str | Path) -> None:
        """Write the teachers to a safetensors file, atomically (a temporary file, then a rename).

        The file names the backbone (its SHA-256) and the recipe they were trained with, so
        :meth:`load` can refuse to vote with prompts learned on another backbone or under another recipe —
        they would run, but vote as teachers nobody trained.
        """
        from safetensors.torch import save_file

        target = Path(path)
        tensors = {
            "prompts": self.prompts,
            "weights": self.weights,
            "biases": self.biases,
            "losses": torch.from_numpy(np.ascontiguousarray(self.losses)),
        }
        header = {
            "format": _FORMAT,
            "backbone_sha256": self.backbone.sha256,
            "recipe": json.dumps(self.recipe.describe(), sort_keys=True),
            "bn_batch": str(self.bn_batch),
            "abstaining": json.dumps(list(self.abstaining)),
        }
        partial = target.with_name(f"{target.name}.partial")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial), metadata=header)
        partial.replace(target)

    @classmethod
    def load(cls, path: str | Path, *, backbone: Backbone, recipe: PromptRecipe) -> PromptedTeachers:
        """Read teachers written by :meth:`save`, for ``backbone`` under ``recipe``.

        Raises:
            InputError: the file is missing or not a prompted-teachers file, or it was trained on another
                backbone or with another recipe (retrain them).
        """
        source = Path(path)
        if not source.is_file():
            raise InputError(f"prompted-teachers file {source} does not exist; train the teachers first")
        meta, tensors = read_safetensors(source)
        if meta.get("format") != _FORMAT:
            raise InputError(f"{source} is not a prompted-teachers file (format {meta.get('format')!r})")
        if meta.get("backbone_sha256") != backbone.sha256:
            raise InputError(
                f"{source} was trained on the backbone with SHA-256 {meta.get('backbone_sha256')}, but this "
                f"party's backbone is {backbone.sha256}: retrain the prompted teachers on it"
            )
        stored = json.loads(meta.get("recipe", "{}"))
        if stored != json.loads(json.dumps(recipe.describe(), sort_keys=True)):
            raise InputError(
                f"{source} was trained with the prompt recipe {stored}, but the federation's is "
                f"{recipe.describe()}: retrain the prompted teachers under it"
            )
        return cls(
            backbone=backbone,
            prompts=tensors["prompts"],
            weights=tensors["weights"],
            biases=tensors["biases"],
            recipe=recipe,
            bn_batch=int(meta["bn_batch"]),
            losses=tensors["losses"].numpy(),
            abstaining=tuple(int(t) for t in json.loads(meta.get("abstaining", "[]"))),
        )

    def histograms(self, images: npt.NDArray[np.uint8], *, batch: int = 256) -> npt.NDArray[np.int64]:
        """Vote histograms ``(N, classes)`` of the teachers on ``images``, voting batch by batch.

        Args:
            images: uint8 ``(N, H, W, C)``.
            batch: the voting batch (a multiple of ``bn_batch``; the last batch may be shorter but at
                least ``bn_batch``): chunks never cross a batch boundary, as in a federation's batches.
        """
        if batch % self.bn_batch:
            raise InputError(f"the voting batch {batch} must be a multiple of bn_batch {self.bn_batch}")
        out = np.zeros((len(images), self.classes), np.int64)
        rows = np.arange(len(images))
        for start in range(0, len(images), batch):
            labels = self.predict(images[start : start + batch])
            for t in range(self.teachers):
                np.add.at(out, (rows[start : start + batch], labels[t]), 1)
        return out


def train_prompted_teachers(
    backbone: Backbone,
    images: npt.NDArray[np.uint8],
    labels: npt.ArrayLike,
    shards: Sequence[npt.NDArray[np.int64]],
    *,
    classes: int,
    bn_batch: int = 64,
    recipe: PromptRecipe | None = None,
) -> PromptedTeachers:
    """Train one prompted teacher per shard, each on its own shard only (see the module docstring).

    Args:
        backbone: the shared frozen backbone (its weights are not changed).
        images: uint8 ``(N, H, W, C)`` training images.
        labels: ``(N,)`` their labels.
        shards: disjoint index arrays into ``images``, one per teacher; a teacher whose shard is shorter
            than ``bn_batch`` abstains.
        classes: number of classes.
        bn_batch: BatchNorm chunk size (current statistics).
        recipe: how each teacher is made (default :class:`PromptRecipe`).

    Raises:
        InputError: bad labels, or a bad recipe for the image shape.
    """
    recipe = recipe or PromptRecipe()
    y_all = np.asarray(labels, dtype=np.int64)
    height, width, channels = (int(v) for v in images.shape[1:])
    mask = recipe.mask((height, width, channels))
    # Stage 1: each map on its shard's features at the initial prompt (zero: a blank border, or nothing
    # added), which as uint8 images are exact, so the shared per-shard featuriser applies.
    start = images.copy()
    if recipe.kind == "pad":
        start[:, mask.permute(1, 2, 0).numpy() > 0] = 0
    rows, owners, index = shard_features(BackboneFeaturizer(backbone), start, shards, bn_batch=bn_batch)
    abstaining = short_shards(shards, bn_batch=bn_batch)
    heads = train_heads(
        rows,
        y_all[index],
        owners=owners,
        heads=len(shards),
        classes=classes,
        recipe=HeadRecipe(steps=recipe.map_steps, lr=recipe.map_lr),
        abstain=abstaining,
    )
    weights = heads.params["w_out"].clone()
    biases = heads.params["b_out"].clone()
    prompts = torch.zeros(len(shards), *mask.shape)
    losses = np.zeros((len(shards), recipe.steps))
    # Stage 2: each teacher alone, its own optimiser, a fixed number of steps.
    with _frozen(backbone), bn_stats(backbone, "current"):
        for t, shard in enumerate(shards):
            if t in abstaining:
                continue
            x = to_tensor(images[shard])
            y = torch.from_numpy(y_all[shard])
            prompt = prompts[t].clone().requires_grad_(True)
            w = weights[t].clone().requires_grad_(True)
            b = biases[t].clone().requires_grad_(True)
            optimiser = torch.optim.Adam(
                [{"params": [prompt], "lr": recipe.prompt_lr}, {"params": [w, b], "lr": recipe.joint_map_lr}]
            )
            for step in range(recipe.steps):
                optimiser.zero_grad()
                feats = _features(
                    backbone, prompted(x, prompt, mask=mask, kind=recipe.kind), bn_batch=bn_batch
                )
                loss = F.cross_entropy(torch.addmm(b, feats, w.T), y)
                loss.backward()
                optimiser.step()
                losses[t, step] = float(loss.detach())
            with torch.no_grad():
                prompts[t], weights[t], biases[t] = prompt, w, b
    return PromptedTeachers(
        backbone=backbone,
        prompts=prompts,
        weights=weights,
        biases=biases,
        recipe=recipe,
        bn_batch=bn_batch,
        losses=losses,
        abstaining=abstaining,
    )
