"""BatchNorm with an explicit statistics mode: ``running`` or ``current``.

DIET-PATE teachers label synthetic queries whose statistics differ wildly from their private data; the paper
runs inference with **current statistics** (normalise by the query batch's own mean/variance). PyTorch only
offers that in ``train()`` mode, which also *updates the stored running averages* — a teacher answering
queries would then silently drift its model. :class:`StatBatchNorm1d`/``2d`` add a mode switch that never
touches the buffers:

* ``current``: normalise with the batch's statistics; running buffers are neither read nor written.
* ``running``: normalise with the stored running statistics; buffers are not written.
* no override (the default): ordinary PyTorch behaviour (``train()`` uses and updates batch statistics,
  ``eval()`` uses the running ones), which pretraining relies on.

The override is set by :func:`bn_stats` and lives in a :class:`contextvars.ContextVar`, so it is scoped to
the current thread / asyncio task: two threads may run the same backbone in different modes. (A worker thread
started inside ``with bn_stats(...)`` does not inherit it; :func:`capc_common.models.extract_features` sets
the mode itself, wherever it runs.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from capc_common.errors import InputError

__all__ = [
    "BN_MODES",
    "BNMode",
    "StatBatchNorm1d",
    "StatBatchNorm2d",
    "bn_stats",
    "recalibrate_running_stats",
]

BNMode = Literal["current", "running"]
BN_MODES: tuple[BNMode, ...] = ("current", "running")

_OVERRIDES: ContextVar[Mapping[int, BNMode]] = ContextVar("capc_bn_overrides", default=MappingProxyType({}))


def _mode_forward(bn: nn.modules.batchnorm._BatchNorm, x: torch.Tensor, mode: BNMode) -> torch.Tensor:
    if mode == "current":
        if x.shape[0] < 2 and x.dim() == 2:
            raise InputError(
                "current-statistics BatchNorm needs at least 2 examples per batch (the paper uses >= 16); "
                f"got a batch of {x.shape[0]}"
            )
        return F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
    if bn.running_mean is None or bn.running_var is None:
        raise InputError(f"{type(bn).__name__} keeps no running statistics, so mode 'running' is unavailable")
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)


class StatBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` that honours :func:`bn_stats` (see the module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        mode = _OVERRIDES.get().get(id(self))
        if mode is None:
            return super().forward(input)
        self._check_input_dim(input)
        return _mode_forward(self, input, mode)


class StatBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that honours :func:`bn_stats` (see the module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        mode = _OVERRIDES.get().get(id(self))
        if mode is None:
            return super().forward(input)
        self._check_input_dim(input)
        return _mode_forward(self, input, mode)


@contextmanager
def bn_stats(model: nn.Module, mode: str) -> Iterator[None]:
    """Run every BatchNorm layer of ``model`` with ``mode`` statistics inside the ``with`` block.

    Works in ``train()`` and ``eval()`` alike and never mutates the running buffers, in either mode.

    Args:
        model: a backbone (any module whose BatchNorm layers are :class:`StatBatchNorm1d`/``2d``).
        mode: ``"current"`` (statistics of the batch at hand) or ``"running"`` (stored averages).

    Raises:
        InputError: unknown mode, or a model with plain ``torch.nn`` BatchNorm layers (which cannot honour
            the mode; build models with :func:`capc_common.models.build_backbone`).
    """
    if mode not in BN_MODES:
        raise InputError(f"unknown BatchNorm statistics mode {mode!r}; expected 'current' or 'running'")
    ours = [m for m in model.modules() if isinstance(m, StatBatchNorm1d | StatBatchNorm2d)]
    foreign = [
        type(m).__name__
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        and not isinstance(m, StatBatchNorm1d | StatBatchNorm2d)
    ]
    if foreign:
        raise InputError(
            f"model has plain torch BatchNorm layers ({', '.join(sorted(set(foreign)))}) that cannot switch "
            "statistics mode; use capc_common.models.StatBatchNorm1d/2d"
        )
    checked: BNMode = "current" if mode == "current" else "running"
    merged = dict(_OVERRIDES.get())
    merged.update({id(m): checked for m in ours})
    token = _OVERRIDES.set(MappingProxyType(merged))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def recalibrate_running_stats(model: nn.Module, batches: Iterable[torch.Tensor]) -> int:
    """Set every BatchNorm layer's running statistics to the exact average over ``batches``.

    Running statistics matter in ``running`` mode. After SimCLR they are an exponential average over
    *augmented* views, and layers that SimCLR never ran (a hybrid's output standardisation) keep their
    initial values. This resets them and recomputes them as cumulative averages (momentum ``None``) over
    the given batches — for shipped backbones, fresh un-augmented synthetic images, so no real data is used.

    Args:
        model: the backbone (its own ``forward`` is run, in train mode, without gradients).
        batches: float image tensors ``(N, C, H, W)`` in ``[0, 1]``.

    Returns:
        The number of batches used.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in layers]
    was_training = model.training
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None
    count = 0
    try:
        model.train()
        with torch.no_grad():
            for batch in batches:
                model(batch)
                count += 1
    finally:
        for layer, momentum in zip(layers, momenta, strict=True):
            layer.momentum = momentum
        model.train(was_training)
    if count == 0:
        raise InputError("recalibrate_running_stats needs at least one batch")
    return count
