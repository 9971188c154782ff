"""The :class:`Backbone`: a trunk plus what a federation must agree on (architecture, shape, recipe, hash).

Every teacher and the student must start from the *same* backbone; the federation config pins its SHA-256.
The hash is a content hash — of the canonical metadata and of every stored tensor's name, dtype, shape and
bytes, in name order — so it identifies the model itself, not one file layout of it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from torch import nn

from capc_common.errors import InputError
from capc_common.models.architectures import Trunk, build_trunk
from capc_common.models.files import FORMAT, format_shape, parse_shape, tensor_digest

__all__ = ["Backbone", "build_backbone", "format_shape", "parse_shape"]


def content_hash(state: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """SHA-256 over canonical metadata and every tensor (name, dtype, shape, bytes) in name order
    (:func:`~capc_common.models.files.tensor_digest`, which a checkpoint file is verified with too)."""
    tensors = []
    for name, value in state.items():
        tensor = value.detach().to("cpu").contiguous()
        data = tensor.numpy().tobytes() if tensor.numel() else b""
        tensors.append((name, str(tensor.dtype), tuple(tensor.shape), data))
    return tensor_digest(metadata, tensors)


class Backbone(nn.Module):
    """A frozen feature extractor shared by every teacher and the student.

    Call :meth:`features` (or the module itself) on float32 images ``(N, C, H, W)`` in ``[0, 1]``; any
    normalisation happens inside. BatchNorm statistics follow :func:`capc_common.models.bn_stats`.

    Attributes:
        trunk: the architecture's module.
        arch: architecture name (see :data:`capc_common.models.ARCHITECTURES`).
        input_shape: ``(H, W, C)`` the backbone accepts.
        config: keyword configuration of the architecture.
        recipe: how it was obtained (pretraining generator, steps, ...); ``{}`` for a fresh backbone.
    """

    def __init__(
        self,
        trunk: Trunk,
        *,
        arch: str,
        input_shape: tuple[int, int, int],
        config: dict[str, Any],
        recipe: dict[str, Any],
    ) -> None:
        super().__init__()
        self.trunk = trunk
        self.arch = arch
        self.input_shape = input_shape
        self.config = dict(config)
        self.recipe = dict(recipe)

    @property
    def feature_dim(self) -> int:
        """Length of the feature vector."""
        return int(self.trunk.feature_dim)

    @property
    def learned_dim(self) -> int:
        """How many of the features (the last ones) come from learned layers (0 for pure scattering)."""
        return int(self.trunk.learned_dim)

    @property
    def ssl_dim(self) -> int:
        """Length of the learnable part of the features (what SimCLR trains)."""
        return int(self.trunk.ssl_dim)

    @property
    def device(self) -> torch.device:
        """Device of the backbone's tensors."""
        for tensor in self.state_dict().values():
            return tensor.device
        return torch.device("cpu")

    def _check(self, x: torch.Tensor) -> None:
        h, w, c = self.input_shape
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, h, w):
            raise InputError(
                f"backbone {self.arch} expects images (N, {c}, {h}, {w}) in [0, 1], got {tuple(x.shape)}"
            )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Features ``(N, feature_dim)`` of images ``x`` ``(N, C, H, W)`` in ``[0, 1]``."""
        self._check(x)
        out: torch.Tensor = self.trunk(x)
        return out

    @property
    def has_fixed(self) -> bool:
        """Whether the trunk starts with a fixed per-image transform (:meth:`fixed_features`)."""
        return bool(self.trunk.has_fixed)

    def fixed_features(self, x: torch.Tensor) -> torch.Tensor:
        """The trunk's fixed per-image front end of images ``x`` (the scattering; ``x`` if it has none)."""
        self._check(x)
        return self.trunk.fixed(x)

    def features_from_fixed(self, f: torch.Tensor) -> torch.Tensor:
        """:meth:`features` of the images whose :meth:`fixed_features` are ``f``."""
        return self.trunk.from_fixed(f)

    def ssl_features(self, x: torch.Tensor) -> torch.Tensor:
        """The learnable part of the features ``(N, ssl_dim)``, on which SimCLR's projection head sits."""
        self._check(x)
        return self.trunk.ssl_features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def header(self) -> dict[str, str]:
        """The string metadata stored in a checkpoint (and hashed)."""
        return {
            "format": FORMAT,
            "arch": self.arch,
            "input_shape": format_shape(self.input_shape),
            "feature_dim": str(self.feature_dim),
            "config": json.dumps(self.config, sort_keys=True),
            "recipe": json.dumps(self.recipe, sort_keys=True),
        }

    @property
    def metadata(self) -> dict[str, Any]:
        """Architecture, input shape, feature size, configuration, pretraining recipe and hash."""
        return {
            "arch": self.arch,
            "input_shape": self.input_shape,
            "feature_dim": self.feature_dim,
            "config": dict(self.config),
            "recipe": dict(self.recipe),
            "sha256": self.sha256,
        }

    @property
    def sha256(self) -> str:
        """Content hash of the metadata and all stored tensors (weights and BatchNorm buffers)."""
        return content_hash(self.state_dict(), self.header())


def _reinitialise(module: nn.Module, generator: torch.Generator) -> None:
    """Deterministic initialisation from an explicit generator (never the global RNG)."""
    for sub in module.modules():
        if isinstance(sub, nn.Conv2d):
            nn.init.kaiming_normal_(sub.weight, mode="fan_out", nonlinearity="relu", generator=generator)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.Linear):
            bound = 1.0 / np.sqrt(sub.in_features)
            nn.init.uniform_(sub.weight, -bound, bound, generator=generator)
            if sub.bias is not None:
                nn.init.uniform_(sub.bias, -bound, bound, generator=generator)


def build_backbone(
    arch: str,
    *,
    input_shape: tuple[int, int, int] | str,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    recipe: dict[str, Any] | None = None,
) -> Backbone:
    """A freshly initialised backbone (random weights from ``seed``; the scattering part is fixed).

    Args:
        arch: ``scatter``, ``scatter_cnn``, ``cnn``, ``resnet10`` or ``resnet18``.
        input_shape: ``(H, W, C)`` or ``"HxWxC"``.
        seed: weight-initialisation seed (public, non-secret randomness).
        config: architecture keywords (e.g. ``{"cnn_width": 128}`` for ``scatter_cnn``).
        recipe: provenance to record in the metadata.

    Raises:
        InputError: unknown architecture, bad configuration or unsupported shape.
    """
    shape = parse_shape(input_shape) if isinstance(input_shape, str) else tuple(int(v) for v in input_shape)
    if len(shape) != 3:
        raise InputError(f"input_shape must be (H, W, C), got {input_shape}")
    h, w, c = shape
    cfg = dict(config or {})
    # Construction draws from torch's global RNG (default inits); fork it so global state is left untouched,
    # then overwrite every weight from an explicitly seeded generator.
    with torch.random.fork_rng(devices=[]):
        trunk = build_trunk(arch, input_shape=(h, w, c), config=cfg)
    generator = torch.Generator().manual_seed(int(seed))
    _reinitialise(trunk, generator)
    return Backbone(trunk, arch=arch, input_shape=(h, w, c), config=cfg, recipe=dict(recipe or {}))
