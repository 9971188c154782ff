"""CaPC in plaintext (:mod:`capc_common.mechanisms.capc`): a querying party's own records labelled by the
other parties' heads through Confident-GNMax; fair splits the query budget over all parties, greedy gives
it to one (mean over which)."""

from __future__ import annotations

from typing import Any

import numpy as np

from capc_common.mechanisms.central import PartyData
from methods.common import DELTA, HYPER, ORDERS, Method

_CAPC_TEACHERS: dict[str, Any] = {}


def _capc(
    parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, *, epsilon: float, seed: int, greedy: bool
) -> dict[str, Any]:
    """CaPC in plaintext (:mod:`capc_common.mechanisms.capc`), the querying parties' mean accuracy.

    Greedy is computed for every party as the one greedy querier (ten alternative runs, each costing ε,
    done in one pass so the teachers are trained once) and averaged, like fair.
    """
    from capc_common.learn.heads import HeadRecipe
    from capc_common.mechanisms.capc import capc_epsilon, capc_mechanism, capc_teachers, run_capc

    h = HYPER["capc"]
    recipe = HeadRecipe(**HYPER["local"])
    if _CAPC_TEACHERS.get("parties") is not parties:  # the same parties for every ε and split: train once
        _CAPC_TEACHERS.update(
            parties=parties,
            heads=capc_teachers(
                parties, per_party=h["teachers_per_party"], classes=10, recipe=recipe, seed=seed
            ),
        )
    budget = h["budget_queries"]
    mechanism = capc_mechanism(
        classes=10,
        teachers=(len(parties) - 1) * h["teachers_per_party"],
        budget_queries=budget,
        epsilon=epsilon,
        delta=DELTA,
        orders=ORDERS,
        threshold_share=h["threshold_share"],
        sigma1_ratio=h["sigma1_ratio"],
    )
    result = run_capc(
        parties,
        mechanism=mechanism,
        queriers=range(len(parties)),
        queries_per_querier=budget if greedy else budget // (len(parties) - 1),
        teachers_per_party=h["teachers_per_party"],
        recipe=recipe,
        seed=seed,
        teachers=_CAPC_TEACHERS["heads"],
    )
    per_party = (result.heads.predict(ex) == ey[None, :]).mean(axis=1)
    return {
        "accuracy": float(per_party.mean()),
        "epsilon": capc_epsilon(mechanism, queries=budget, orders=ORDERS, delta=DELTA),
        "released": int(np.mean(result.answered)),
        "noise": f"T={mechanism.threshold:g} σ1={mechanism.sigma1:.1f} σ2={mechanism.sigma2:.1f}, "
        f"{np.mean(result.answered):.0f}/{np.mean(result.queries):.0f} answered per querier, "
        f"label accuracy {np.nanmean(result.label_accuracy):.3f}",
    }


def capc_fair(parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, **kw: Any) -> dict[str, Any]:
    """CaPC, fair: every party queries, the budget split evenly."""
    return _capc(parties, ex, ey, greedy=False, **kw)


def capc_greedy(parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, **kw: Any) -> dict[str, Any]:
    """CaPC, greedy: one party takes the whole budget (the upper bound), averaged over which party."""
    return _capc(parties, ex, ey, greedy=True, **kw)


CAPC_FAIR = Method("capc-fair", capc_fair, ("capc", "local"))
CAPC_GREEDY = Method("capc-greedy", capc_greedy, ("capc", "local"))
