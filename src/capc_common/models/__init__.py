"""Backbones with an explicit BatchNorm statistics mode, checkpoints, shipped weights, feature extraction.

Front door::

    from capc_common.models import load_backbone, default_backbone, extract_features
    backbone = load_backbone(default_backbone(28, 28, 1))
    feats = extract_features(backbone, images_uint8, bn_batch=64, mode="current")
"""

from capc_common.models.architectures import ARCHITECTURES
from capc_common.models.backbone import Backbone, build_backbone, format_shape, parse_shape
from capc_common.models.batchnorm import (
    BN_MODES,
    BNMode,
    StatBatchNorm1d,
    StatBatchNorm2d,
    bn_stats,
    recalibrate_running_stats,
)
from capc_common.models.checkpoint import default_backbone, list_backbones, load_backbone, save_backbone
from capc_common.models.features import chunk_starts, extract_features, to_tensor
from capc_common.models.scattering import Scattering2D, scattering_channels

__all__ = [
    "ARCHITECTURES",
    "BN_MODES",
    "BNMode",
    "Backbone",
    "Scattering2D",
    "StatBatchNorm1d",
    "StatBatchNorm2d",
    "bn_stats",
    "build_backbone",
    "chunk_starts",
    "default_backbone",
    "extract_features",
    "format_shape",
    "list_backbones",
    "load_backbone",
    "parse_shape",
    "recalibrate_running_stats",
    "save_backbone",
    "scattering_channels",
    "to_tensor",
]
