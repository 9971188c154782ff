"""Pure privacy analysis: RDP curves over arrays of orders, conversions to (ε, δ), distribution facts.

Every function here is pure and vectorised over an array of Rényi orders, cites its source, and keeps no
state; accountants, the filter and the ledger build on them.
"""

from capc_common.privacy.analysis.composition import lifetime_order, rdp_at_lower_order
from capc_common.privacy.analysis.conversion import (
    delta_from_rdp,
    delta_with_sampler_distance,
    epsilon_at_order,
    epsilon_from_rdp,
    epsilon_from_zcdp,
    epsilon_holding,
    rdp_budget_at_order,
    rdp_budget_curve,
)
from capc_common.privacy.analysis.curves import (
    rdp_gaussian,
    rdp_gnmax_data_independent,
    rdp_pure_dp,
    rdp_threshold_gaussian,
    rdp_zcdp,
)
from capc_common.privacy.analysis.discrete_gaussian import (
    discrete_gaussian_delta,
    discrete_gaussian_log_sf,
    discrete_gaussian_log_sf_difference,
    discrete_gaussian_variance,
    gaussian_delta,
)
from capc_common.privacy.analysis.distributed import (
    distributed_tau,
    rdp_distributed_discrete_gaussian,
    share_sigma,
    zcdp_distributed,
)
from capc_common.privacy.analysis.orders import DEFAULT_ORDERS, as_orders
from capc_common.privacy.analysis.pate import (
    log_pass_probability,
    log_q_gnmax,
    rdp_gnmax_data_dependent,
    rdp_threshold_data_dependent,
)
from capc_common.privacy.analysis.poisson import rdp_poisson_subsampled, rdp_subsampled_discrete_gaussian
from capc_common.privacy.analysis.screening import rdp_bernoulli, rdp_screening_at, rdp_screening_exact
from capc_common.privacy.analysis.subsampled import rdp_subsampled_gaussian

__all__ = [
    "DEFAULT_ORDERS",
    "as_orders",
    "delta_from_rdp",
    "delta_with_sampler_distance",
    "discrete_gaussian_delta",
    "discrete_gaussian_log_sf",
    "discrete_gaussian_log_sf_difference",
    "discrete_gaussian_variance",
    "distributed_tau",
    "epsilon_at_order",
    "epsilon_from_rdp",
    "epsilon_from_zcdp",
    "epsilon_holding",
    "gaussian_delta",
    "lifetime_order",
    "log_pass_probability",
    "log_q_gnmax",
    "rdp_at_lower_order",
    "rdp_bernoulli",
    "rdp_budget_at_order",
    "rdp_budget_curve",
    "rdp_distributed_discrete_gaussian",
    "rdp_gaussian",
    "rdp_gnmax_data_dependent",
    "rdp_gnmax_data_independent",
    "rdp_poisson_subsampled",
    "rdp_pure_dp",
    "rdp_screening_at",
    "rdp_screening_exact",
    "rdp_subsampled_discrete_gaussian",
    "rdp_subsampled_gaussian",
    "rdp_threshold_data_dependent",
    "rdp_threshold_gaussian",
    "rdp_zcdp",
    "share_sigma",
    "zcdp_distributed",
]
