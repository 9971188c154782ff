"""Library-level objects of a federation: the shared ``federation.yaml`` model and its hash."""

from capc_common.federation.config import (
    Backbone,
    Budget,
    FederationConfig,
    Mechanism,
    Queries,
    Quorum,
    TeacherParty,
    check_party_name,
)

__all__ = [
    "Backbone",
    "Budget",
    "FederationConfig",
    "Mechanism",
    "Queries",
    "Quorum",
    "TeacherParty",
    "check_party_name",
]
