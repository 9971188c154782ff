"""What every party derives alike from ``federation.yaml``: the MPC parameters and the shared backbone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capc_common.federation.config import FederationConfig
from capc_common.federation.costs import mechanism_of
from capc_common.mpc import MpcConfig

if TYPE_CHECKING:
    from capc_common.models import Backbone


def mpc_config(config: FederationConfig) -> MpcConfig:
    """The 2PC parameters of the federation's mechanism for all its heads (the smallest ring holding every
    noisy count). Both the guardian and the student call this, and the MPC handshake checks that they agree.
    """
    return mechanism_of(config).mpc_config(teachers=config.total_heads)


def load_shared_backbone(config: FederationConfig) -> Backbone:
    """The federation's backbone, refused unless its SHA-256 is the one pinned in federation.yaml.

    Raises:
        InputError: unknown backbone or a different hash.
    """
    from capc_common.models import load_backbone  # torch: only the parties that run models pay for it

    return load_backbone(config.backbone.name, sha256=config.backbone.sha256)
