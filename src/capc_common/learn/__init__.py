"""Learning on top of a frozen backbone: SimCLR pretraining, batched teacher heads, the student."""

from capc_common.learn.augment import AugmentConfig, augment
from capc_common.learn.pretrain import (
    PretrainConfig,
    PretrainResult,
    calibrate_training_free,
    nt_xent,
    pretrain,
)

__all__ = [
    "AugmentConfig",
    "PretrainConfig",
    "PretrainResult",
    "augment",
    "calibrate_training_free",
    "nt_xent",
    "pretrain",
]
