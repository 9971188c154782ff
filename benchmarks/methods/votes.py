"""Private-kNN on synthetic (dead-leaves) queries: every party's Poisson-subsampled records vote by k nearest
neighbours, GNMax labels every query, the library's student learns the labels."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from capc_common.mechanisms import calibrate
from capc_common.mechanisms.central import PartyData, run_private_knn
from capc_common.privacy.analysis import epsilon_from_rdp
from methods.common import DELTA, HYPER, ORDERS, Method, accuracy
from methods.data import query_features


def private_knn(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    queries: np.ndarray,
) -> dict[str, Any]:
    """Private-kNN labels the query stream (σ calibrated so all queries cost ε); the student learns them."""
    from capc_common.learn.student import train_student
    from capc_common.mechanisms import PrivateKNN

    h = HYPER["knn"]

    def eps_of(sigma: float) -> float:
        m = PrivateKNN(classes=10, sigma=sigma, neighbours=h["neighbours"], sampling_rate=h["sampling_rate"])
        return epsilon_from_rdp(ORDERS, len(queries) * m.costs(ORDERS)[1], delta=DELTA)[0]

    sigma = calibrate(eps_of, target=epsilon, low=0.5, high=5000.0)
    knn = PrivateKNN(classes=10, sigma=sigma, neighbours=h["neighbours"], sampling_rate=h["sampling_rate"])
    labels = run_private_knn(parties, queries, mechanism=knn, batch_size=len(queries))
    fit = train_student(queries, labels, classes=10, pseudo_confidence=None, seed=seed)
    return {
        "accuracy": accuracy(fit.predict(ex), ey),
        "epsilon": eps_of(sigma),
        "released": len(queries),
        "noise": f"σ={sigma:.1f} over {len(parties) * h['neighbours']} votes",
    }


def _queries(args: argparse.Namespace) -> dict[str, Any]:
    return {"queries": query_features(args)}


PRIVATE_KNN = Method("private-knn", private_knn, ("knn",), _queries)
