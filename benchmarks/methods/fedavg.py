"""DP federated averaging of the linear head on Flower: real server and client processes on localhost in
Flower's own virtual environment (``_baselines``, ``_flower_app``), example-level DP from each client's local
DP-SGD steps, given the recipe pieces the federation's secure-aggregation DP-SGD has
(:mod:`capc_common.mechanisms.training`):

1. **the public basis** (free): every record is L2-normalised and projected on the same
   ``HYPER["fedavg"]["projection"]`` public directions (a public per-record map, applied for the clients);
2. **standardised by a DP release** (charged): a statistics phase before training, each client's noisy sums
   of ``(u, u², 1)`` over a Poisson sample (sensitivity ``C``, noise ``zC``: charged as one more step), summed
   by the server and turned into the centre and scale by the federation's own
   :func:`~capc_common.mechanisms.training.standardiser` (its noise argument the sum's: ``√clients`` clients'
   noise); the clients train on the standardised records and the published head folds the map back
   (:meth:`~capc_common.mechanisms.training.FeatureMap.head`);
3. **server momentum** (post-processing): Flower's FedAvgM;
4. optionally **the step that follows the noise** (``step_noise`` > 0, post-processing of public numbers):
   each client's step puts noise of σ ``step_noise`` on each weight, so one setting carries across budgets.

What it cannot have is the federation's secure sum: each client adds its own noise, so the server's average
carries ``√clients`` times the noise of one sum (the price of no secure aggregation, which this baseline
measures).

**Assumed public: each client's record count.** The clients' step, their ``q·N`` normaliser, Flower's
``num_examples`` and FedAvg's weights use the exact count, as Opacus and Flower do; under add/remove-one
neighbours it is not public and no ε here covers it (the federation and central DP-SGD normalise by the noisy
count their statistics release pays for). At the tuned full batch the count cancels from the step, so only
the averaging weights read it.
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path
from typing import Any

import numpy as np
from _baselines import dp_fedavg, flower_python

from capc_common.mechanisms.central import PartyData, predict_head
from capc_common.mechanisms.training import FeatureMap, standardiser
from methods.common import HYPER, Method, accuracy, gaussian_noise_for
from methods.dpsgd import basis_need, projected

#: ``HYPER["fedavg"]``'s keys the Flower plan carries (the rest are the feature map's).
PLAN = ("rounds", "local_steps", "sampling_rate", "clip", "learning_rate", "step_noise", "server_momentum")


def fedavg_releases() -> int:
    """Releases of one client's records, what a record's ε is charged for: ``rounds × local_steps`` DP-SGD
    steps, plus the statistics release when the recipe standardises (each a Poisson-subsampled Gaussian
    mechanism of sensitivity ``C`` and noise ``zC``: continuous noise, Mironov et al.'s exact analysis)."""
    h = HYPER["fedavg"]
    return h["rounds"] * h["local_steps"] + int(h["statistics"])


def statistics_map(
    total: np.ndarray, *, dim: int, noise_multiplier: float, clients: int
) -> tuple[np.ndarray, np.ndarray]:
    """The feature map ``(mean, scale)`` from the statistics phase's sum — every client's noisy sums of its
    records' ``(u, u², 1)·C/√3`` (:func:`_flower_app.noisy_statistics`) — by the federation's standardiser,
    told the sum's noise: ``clients`` independent draws of ``zC``, ``√(3·clients)·z`` once decoded."""
    h = HYPER["fedavg"]
    values = total * (math.sqrt(3) / h["clip"])
    return standardiser(
        values[:dim], values[dim : 2 * dim], float(values[2 * dim]), floor=h["variance_floor"],
        noise=math.sqrt(3 * clients) * noise_multiplier, unit_variance=h["unit_variance"],
    )  # fmt: skip


def dp_fedavg_flower(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    basis: np.ndarray | None,
    python: Path | None,
) -> dict[str, Any]:
    """DP-FedAvg of the linear head on Flower (real server and client processes), example-level DP, by the
    recipe of ``HYPER["fedavg"]``; ``python`` None runs the same code in this process (validation sweeps)."""
    h = HYPER["fedavg"]
    # one client's releases, each a Poisson-subsampled Gaussian mechanism of sensitivity C and noise zC, are
    # what a record costs: clients hold disjoint records, the server's sums and averages are post-processing
    z, spent = gaussian_noise_for(h["sampling_rate"], fedavg_releases(), epsilon)
    use = basis if h["projection"] else None
    k = parties[0].features.shape[1] if use is None else use.shape[1]
    shards = [(projected(p.features, use), p.labels) for p in parties]
    standardise = functools.partial(statistics_map, dim=k, noise_multiplier=z, clients=len(parties))
    weights, info = dp_fedavg(
        shards,
        python=python,
        plan={**{key: h[key] for key in PLAN}, "noise_multiplier": z},
        standardise=standardise if h["statistics"] else None,
    )
    mean, scale = info["map"] or (np.zeros(k), np.ones(k))
    head = FeatureMap(use, mean, scale).head(weights)
    where = "in process" if python is None else "Flower"
    return {
        "head": head,
        "accuracy": accuracy(predict_head(head, ex), ey),
        "epsilon": spent,
        "released": h["rounds"] + int(h["statistics"]),
        "noise_multiplier": z,
        "releases": fedavg_releases(),
        "noise": f"z={z:.3f} per client step (continuous), {fedavg_releases()} steps at q "
        f"{h['sampling_rate']:g}, {where} {info['seconds']} s",
    }


def _needs(args: argparse.Namespace) -> dict[str, Any]:
    return {**basis_need("fedavg")(args), "python": flower_python(args.cache_dir)}


DP_FEDAVG = Method("dp-fedavg", dp_fedavg_flower, ("fedavg",), _needs)
