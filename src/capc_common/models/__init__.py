"""Backbones with an explicit BatchNorm statistics mode, checkpoints, shipped weights, feature extraction.

Front door::

    from capc_common.models import load_backbone, default_backbone, extract_features
    backbone = load_backbone(default_backbone(28, 28, 1))
    feats = extract_features(backbone, images_uint8, bn_batch=64, mode="current")

Names load on first use (PEP 562): importing the package costs nothing, so a party that only checks a
checkpoint file (:func:`verify_backbone`, the guardian) never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capc_common._lazy import lazy_getattr

if TYPE_CHECKING:
    from capc_common.models.architectures import ARCHITECTURES
    from capc_common.models.backbone import Backbone, build_backbone
    from capc_common.models.batchnorm import (
        BN_MODES,
        BNMode,
        StatBatchNorm1d,
        StatBatchNorm2d,
        bn_stats,
        recalibrate_running_stats,
    )
    from capc_common.models.checkpoint import (
        backbone_sha256,
        default_backbone,
        load_backbone,
        save_backbone,
        verify_backbone,
    )
    from capc_common.models.features import (
        FixedFront,
        chunk_starts,
        extract_features,
        features_version,
        to_tensor,
    )
    from capc_common.models.files import format_shape, list_backbones, parse_shape
    from capc_common.models.scattering import Scattering2D, scattering_channels

_HOME = {
    "ARCHITECTURES": "architectures",
    "Backbone": "backbone",
    "build_backbone": "backbone",
    "BN_MODES": "batchnorm",
    "BNMode": "batchnorm",
    "StatBatchNorm1d": "batchnorm",
    "StatBatchNorm2d": "batchnorm",
    "bn_stats": "batchnorm",
    "recalibrate_running_stats": "batchnorm",
    "backbone_sha256": "checkpoint",
    "default_backbone": "checkpoint",
    "load_backbone": "checkpoint",
    "save_backbone": "checkpoint",
    "FixedFront": "features",
    "chunk_starts": "features",
    "extract_features": "features",
    "features_version": "features",
    "to_tensor": "features",
    "format_shape": "files",
    "list_backbones": "files",
    "parse_shape": "files",
    "verify_backbone": "checkpoint",
    "Scattering2D": "scattering",
    "scattering_channels": "scattering",
}

__all__ = [
    "ARCHITECTURES",
    "BN_MODES",
    "BNMode",
    "Backbone",
    "FixedFront",
    "Scattering2D",
    "StatBatchNorm1d",
    "StatBatchNorm2d",
    "backbone_sha256",
    "bn_stats",
    "build_backbone",
    "chunk_starts",
    "default_backbone",
    "extract_features",
    "features_version",
    "format_shape",
    "list_backbones",
    "load_backbone",
    "parse_shape",
    "recalibrate_running_stats",
    "save_backbone",
    "scattering_channels",
    "to_tensor",
    "verify_backbone",
]


__getattr__ = lazy_getattr(__name__, _HOME, globals())
