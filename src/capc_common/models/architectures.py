"""Backbone architectures (trunks): scattering, scattering + CNN hybrid, a small CPU CNN, ResNet-10/18.

Every trunk maps images in ``[0, 1]`` ``(N, C, H, W)`` to a flat feature vector, normalises its input itself
and uses :class:`~capc_common.models.batchnorm.StatBatchNorm2d`/``1d`` for every BatchNorm, so the statistics
mode of :func:`~capc_common.models.bn_stats` applies to all of them.

* ``scatter``: scattering (J, L) then per-channel BatchNorm without affine parameters — the per-batch
  standardisation of Tramèr & Boneh's ScatterNet features. Training-free.
* ``scatter_cnn``: the ``scatter`` features concatenated with a small CNN on top of them (conv-BN-ReLU
  blocks, average-pooled to a small grid, standardised). Only the CNN learns (SimCLR, on its globally
  pooled maps: :meth:`Trunk.ssl_features`).
* ``cnn``: a small, fast all-convolutional network for CPUs.
* ``resnet10`` / ``resnet18``: ResNets with the CIFAR stem (3×3 conv, stride 1, no max-pool), BasicBlocks
  ``[1,1,1,1]`` / ``[2,2,2,2]``, widths 64–512, global average pooling: 512 features.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from capc_common.errors import InputError
from capc_common.models.batchnorm import StatBatchNorm1d, StatBatchNorm2d
from capc_common.models.scattering import Scattering2D

__all__ = ["ARCHITECTURES", "Trunk", "build_trunk"]


class Trunk(nn.Module):
    """Base of all trunks: ``forward`` gives the features, ``ssl_features`` what SimCLR trains.

    ``learned_dim`` is how many of the features (the last ones) come from learned layers.
    """

    feature_dim: int
    ssl_dim: int
    learned_dim: int
    #: Whether the trunk starts with a fixed per-image transform (no weights, no statistics: the scattering)
    #: that :meth:`fixed` computes on its own, so a party can compute it once for all its records.
    has_fixed: bool = False

    def ssl_features(self, x: torch.Tensor) -> torch.Tensor:
        """Features the self-supervised objective acts on (the learnable part); default: all features."""
        out: torch.Tensor = self(x)
        return out

    def fixed(self, x: torch.Tensor) -> torch.Tensor:
        """The fixed per-image front end of the trunk (the identity for a trunk without one)."""
        return x

    def from_fixed(self, f: torch.Tensor) -> torch.Tensor:
        """The features from :meth:`fixed`'s output: ``self(x)`` is ``self.from_fixed(self.fixed(x))``."""
        out: torch.Tensor = self(f)
        return out


def _conv_bn(cin: int, cout: int, *, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        StatBatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def _center(x: torch.Tensor) -> torch.Tensor:
    """Map ``[0, 1]`` pixels to ``[-1, 1]``: a fixed, data-independent input normalisation."""
    return x * 2.0 - 1.0


class ScatterTrunk(Trunk):
    """Scattering coefficients standardised per channel (BatchNorm without affine parameters)."""

    def __init__(self, *, height: int, width: int, channels: int, J: int = 2, L: int = 8) -> None:
        super().__init__()
        self.scattering = Scattering2D(height=height, width=width, J=J, L=L)
        self.out_channels = channels * self.scattering.channels
        # momentum=None: running statistics are the cumulative average, for calibration on synthetic data.
        self.norm = StatBatchNorm2d(self.out_channels, affine=False, momentum=None)
        self.grid = (height // 2**J, width // 2**J)
        self.feature_dim = self.ssl_dim = self.out_channels * self.grid[0] * self.grid[1]
        self.learned_dim = 0
        self.has_fixed = True

    def fixed(self, x: torch.Tensor) -> torch.Tensor:
        """Scattering coefficients ``(N, C·K, H/2^J, W/2^J)``: per image, no statistics."""
        out: torch.Tensor = self.scattering(x)
        return out

    def maps(self, x: torch.Tensor) -> torch.Tensor:
        """Standardised scattering maps ``(N, C·K, H/2^J, W/2^J)``."""
        out: torch.Tensor = self.norm(self.fixed(x))
        return out

    def from_fixed(self, f: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(f)
        return out.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_fixed(self.fixed(x))


class HybridTrunk(Trunk):
    """Scattering features plus a learned CNN on top of the scattering maps (both in the output).

    SimCLR trains the CNN on its globally average-pooled maps (:meth:`ssl_features`, the usual SimCLR
    representation). The features keep more of the layout: the CNN maps are average-pooled to a
    ``pool × pool`` grid and standardised (BatchNorm without affine parameters, so under current statistics
    they are normalised per query batch like the scattering part).
    """

    def __init__(
        self,
        *,
        height: int,
        width: int,
        channels: int,
        J: int = 2,
        L: int = 8,
        cnn_width: int = 128,
        cnn_blocks: int = 2,
        pool: int = 2,
    ) -> None:
        super().__init__()
        self.front = ScatterTrunk(height=height, width=width, channels=channels, J=J, L=L)
        layers: list[nn.Module] = []
        cin = self.front.out_channels
        for _ in range(cnn_blocks):
            layers.append(_conv_bn(cin, cnn_width))
            cin = cnn_width
        self.cnn = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(pool)
        self.ssl_dim = cnn_width
        self.learned_dim = cnn_width * pool * pool
        self.learned_norm = StatBatchNorm1d(self.learned_dim, affine=False, momentum=None)
        self.feature_dim = self.front.feature_dim + self.learned_dim
        self.has_fixed = True

    def ssl_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.cnn(self.front.maps(x)).mean(dim=(2, 3))

    def fixed(self, x: torch.Tensor) -> torch.Tensor:
        """The scattering front's coefficients (:meth:`ScatterTrunk.fixed`)."""
        return self.front.fixed(x)

    def from_fixed(self, f: torch.Tensor) -> torch.Tensor:
        maps = self.front.norm(f)
        learned = self.learned_norm(self.pool(self.cnn(maps)).flatten(1))
        return torch.cat([maps.flatten(1), learned], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_fixed(self.fixed(x))


class SmallCNN(Trunk):
    """Five 3×3 conv-BN-ReLU layers with two max-pools and global average pooling (``4·width`` features)."""

    def __init__(self, *, channels: int, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv_bn(channels, width),
            _conv_bn(width, width),
            nn.MaxPool2d(2),
            _conv_bn(width, 2 * width),
            _conv_bn(2 * width, 2 * width),
            nn.MaxPool2d(2),
            _conv_bn(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.feature_dim = self.ssl_dim = self.learned_dim = 4 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(_center(x))
        return out


class BasicBlock(nn.Module):
    """ResNet basic block: two 3×3 conv-BN layers and an identity (or 1×1 conv-BN) shortcut."""

    def __init__(self, cin: int, cout: int, *, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = StatBatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = StatBatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), StatBatchNorm2d(cout)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        result: torch.Tensor = self.relu(out + self.shortcut(x))
        return result


class ResNet(Trunk):
    """CIFAR-style ResNet (He et al. 2016): 3×3 stem, four stages of BasicBlocks, global average pooling."""

    def __init__(self, *, channels: int, blocks: tuple[int, int, int, int]) -> None:
        super().__init__()
        widths = (64, 128, 256, 512)
        self.stem = _conv_bn(channels, widths[0])
        stages: list[nn.Module] = []
        cin = widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            for b in range(count):
                stages.append(BasicBlock(cin, width, stride=2 if (i > 0 and b == 0) else 1))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.feature_dim = self.ssl_dim = self.learned_dim = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.stages(self.stem(_center(x)))).flatten(1)


ARCHITECTURES = ("scatter", "scatter_cnn", "cnn", "resnet10", "resnet18")


def build_trunk(arch: str, *, input_shape: tuple[int, int, int], config: dict[str, Any]) -> Trunk:
    """Instantiate the trunk ``arch`` for ``input_shape`` ``(H, W, C)`` with keyword ``config``.

    Raises:
        InputError: unknown architecture or configuration key, or an unsupported input shape.
    """
    height, width, channels = input_shape
    if channels not in (1, 3):
        raise InputError(f"backbones take 1- or 3-channel images, got {channels} channels")
    try:
        if arch == "scatter":
            return ScatterTrunk(height=height, width=width, channels=channels, **config)
        if arch == "scatter_cnn":
            return HybridTrunk(height=height, width=width, channels=channels, **config)
        if arch == "cnn":
            return SmallCNN(channels=channels, **config)
        if arch in ("resnet10", "resnet18"):
            if config:
                raise TypeError(f"unexpected keyword arguments {sorted(config)}")
            blocks = (1, 1, 1, 1) if arch == "resnet10" else (2, 2, 2, 2)
            return ResNet(channels=channels, blocks=blocks)
    except TypeError as exc:
        raise InputError(f"bad configuration {config} for architecture {arch!r}: {exc}") from exc
    raise InputError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHITECTURES)}")
