"""Library-level objects of a federation: the shared ``federation.yaml``, its hash, and what every party
derives from it alike (privacy costs, MPC parameters, the shared backbone, the batch plan)."""

from capc_common.federation.config import (
    Backbone,
    Budget,
    DPPLMechanism,
    FederationConfig,
    GNMaxMechanism,
    Mechanism,
    MechanismConfig,
    PrivateKNNMechanism,
    Queries,
    Quorum,
    ReleaseMember,
    Revocation,
    SecAggDPSGDMechanism,
    TeacherParty,
    check_party_name,
    serial_hex,
)
from capc_common.federation.costs import (
    BatchCosts,
    batch_costs,
    check_batch_fits,
    mechanism_of,
    sampler_delta,
    selection_config,
    smallest_quorum_heads,
)
from capc_common.federation.plan import BatchPlan, batch_plan, usable_queries
from capc_common.federation.runtime import check_runnable, load_shared_backbone, mpc_config
from capc_common.federation.sizing import MECHANISM_RATIOS, propose, scaled_mechanism

__all__ = [
    "MECHANISM_RATIOS",
    "Backbone",
    "BatchCosts",
    "BatchPlan",
    "Budget",
    "DPPLMechanism",
    "FederationConfig",
    "GNMaxMechanism",
    "Mechanism",
    "MechanismConfig",
    "PrivateKNNMechanism",
    "Queries",
    "Quorum",
    "ReleaseMember",
    "Revocation",
    "SecAggDPSGDMechanism",
    "TeacherParty",
    "batch_costs",
    "batch_plan",
    "check_batch_fits",
    "check_party_name",
    "check_runnable",
    "load_shared_backbone",
    "mechanism_of",
    "mpc_config",
    "propose",
    "sampler_delta",
    "scaled_mechanism",
    "selection_config",
    "serial_hex",
    "smallest_quorum_heads",
    "usable_queries",
]
