"""Prototypes: DP prototypes (``dppl``: one noisy release of per-class sums and counts) and DPPL-Public,
selected from a synthetic candidate pool by the exponential mechanism (``dppl-public``, central only) or by
noisy nearest-candidate votes as the federation runs it (``dppl-public-votes``)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from capc_common.mechanisms import DPPrototypes, calibrate, nearest_prototype
from capc_common.mechanisms.central import PartyData, run_prototypes
from capc_common.privacy.analysis import epsilon_from_rdp, epsilon_from_zcdp
from methods.common import DELTA, HYPER, ORDERS, Method, accuracy
from methods.data import query_features


def rho_for(epsilon: float) -> float:
    """The largest zCDP ρ (to 0.1 %) of one release whose (ε, δ) stays within ``epsilon``."""
    return 1.0 / calibrate(
        lambda s: epsilon_from_zcdp(1.0 / s, delta=DELTA)[0], target=epsilon, low=1e-3, high=1e6
    )


def dppl(
    parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, *, epsilon: float, seed: int
) -> dict[str, Any]:
    """DP prototypes: ρ calibrated to ε by the zCDP conversion, one release, nearest prototype."""
    h = HYPER["dppl"]
    rho = rho_for(epsilon)
    mechanism = DPPrototypes(
        classes=10, dim=parties[0].features.shape[1], rho=rho, count_share=h["count_share"]
    )
    sums, counts = run_prototypes(parties, mechanism=mechanism)
    return {
        "accuracy": accuracy(nearest_prototype(ex, sums, counts, metric=h["metric"]), ey),
        "epsilon": epsilon_from_zcdp(mechanism.zcdp, delta=DELTA)[0],
        "released": 1,
        "noise": f"ρ={mechanism.zcdp:.4g} σ={mechanism.sigma_sum:.0f} ({mechanism.fixed_point.bits} bits)",
    }


def dppl_public(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    candidates: np.ndarray,
) -> dict[str, Any]:
    """DPPL-Public: each selection's ε calibrated so the ``per_class`` peeled selections cost ε in all."""
    from capc_common.mechanisms import PublicPrototypes
    from capc_common.mechanisms.central import run_public_prototypes
    from capc_common.privacy.analysis import rdp_pure_dp

    h = HYPER["dppl_public"]

    def eps_of(inverse: float) -> float:
        rdp = h["per_class"] * rdp_pure_dp(ORDERS, epsilon=1.0 / inverse, bounded_range=True)
        return epsilon_from_rdp(ORDERS, rdp, delta=DELTA)[0]

    per_selection = 1.0 / calibrate(eps_of, target=epsilon, low=1e-3, high=1e4)
    mechanism = PublicPrototypes(
        classes=10,
        candidates=candidates,
        epsilon=per_selection,
        per_class=h["per_class"],
        similarity_range=(h["d_min"], h["d_max"]),
    )
    chosen = run_public_prototypes(parties, mechanism=mechanism)
    return {
        "accuracy": accuracy(mechanism.predict(ex, chosen, rule=h["rule"]), ey),
        "epsilon": epsilon_from_rdp(ORDERS, mechanism.release_rdp(ORDERS), delta=DELTA)[0],
        "released": int(chosen.size),
        "noise": f"ε per selection {per_selection:.4g} × {h['per_class']} per class, {len(candidates)} "
        f"{h['generator']} candidates",
    }


def dppl_public_votes(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    candidates: np.ndarray,
) -> dict[str, Any]:
    """DPPL-Public by noisy votes: ρ calibrated to ε by the zCDP conversion, one release, top-K per class."""
    from capc_common.mechanisms import PublicPrototypeVotes
    from capc_common.mechanisms.central import run_public_prototype_votes

    h = HYPER["dppl_public"]
    rho = rho_for(epsilon)
    mechanism = PublicPrototypeVotes(
        classes=10, candidates=candidates, rho=rho, per_class=HYPER["dppl_public_votes"]["per_class"]
    )
    total = run_public_prototype_votes(parties, mechanism=mechanism)
    return {
        "accuracy": accuracy(mechanism.predict(ex, total), ey),
        "epsilon": epsilon_from_zcdp(mechanism.zcdp, delta=DELTA)[0],
        "released": 1,
        "noise": f"ρ={mechanism.zcdp:.4g} σ={mechanism.sigma:.3g}, top {mechanism.per_class} of "
        f"{len(candidates)} {h['generator']} candidates per class, count-weighted",
    }


def candidates(args: argparse.Namespace) -> dict[str, Any]:
    """DPPL-Public's candidate pool: per-example features of the first ``queries`` synthetic images."""
    return {"candidates": query_features(args, "dppl_public")}


DPPL = Method("dppl", dppl, ("dppl",))
DPPL_PUBLIC = Method("dppl-public", dppl_public, ("dppl_public",), candidates)
DPPL_PUBLIC_VOTES = Method(
    "dppl-public-votes", dppl_public_votes, ("dppl_public", "dppl_public_votes"), candidates
)
