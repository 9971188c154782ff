"""What every party derives alike from ``federation.yaml``: the MPC parameters and the shared backbone."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from capc_common.federation.config import FederationConfig
from capc_common.mpc import MpcConfig, noise_bound, ring_width

if TYPE_CHECKING:
    from capc_common.models import Backbone


def mpc_config(config: FederationConfig) -> MpcConfig:
    """The 2PC parameters: the smallest ring holding every noisy count (all heads, ±12σ), Confident-GNMax.

    The student's part of the threshold noise is bounded by ±12σ1 like the guardian's. Both the guardian and
    the student call this, and the MPC handshake checks that they agree.
    """
    mechanism = config.mechanism
    width = ring_width(
        teachers=config.total_heads,
        sigma2=mechanism.sigma2,
        sigma1=mechanism.sigma1,
        threshold=math.ceil(mechanism.threshold),
    )
    return MpcConfig(
        classes=config.classes,
        width=width,
        teachers=config.total_heads,
        mode="confident",
        student_noise=noise_bound(mechanism.sigma1),
    )


def load_shared_backbone(config: FederationConfig) -> Backbone:
    """The federation's backbone, refused unless its SHA-256 is the one pinned in federation.yaml.

    Raises:
        InputError: unknown backbone or a different hash.
    """
    from capc_common.models import load_backbone  # torch: only the parties that run models pay for it

    return load_backbone(config.backbone.name, sha256=config.backbone.sha256)
