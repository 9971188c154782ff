"""DP federated averaging of the linear head on Flower: real server and client processes on localhost in
Flower's own virtual environment (``_baselines``, ``_flower_app``), example-level DP from each client's local
DP-SGD steps."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from _baselines import dp_fedavg, flower_python

from capc_common.mechanisms import calibrate
from capc_common.mechanisms.central import PartyData
from capc_common.privacy.analysis import epsilon_from_rdp, rdp_subsampled_gaussian
from methods.common import DELTA, HYPER, ORDERS, Method, accuracy


def fedavg_epsilon(noise_multiplier: float) -> float:
    """Per-record ε of DP-FedAvg: one client's ``rounds × local_steps`` Poisson-subsampled Gaussian steps
    (continuous noise: Mironov et al.'s exact analysis); clients hold disjoint records, the server's
    averaging is post-processing."""
    h = HYPER["fedavg"]
    rdp = rdp_subsampled_gaussian(ORDERS, sampling_rate=h["sampling_rate"], noise_multiplier=noise_multiplier)
    return epsilon_from_rdp(ORDERS, h["rounds"] * h["local_steps"] * rdp, delta=DELTA)[0]


def dp_fedavg_flower(
    parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, *, epsilon: float, seed: int, python: Path
) -> dict[str, Any]:
    """DP-FedAvg of the linear head on Flower (real server and client processes), example-level DP."""
    h = HYPER["fedavg"]
    z = calibrate(fedavg_epsilon, target=epsilon)
    weights, info = dp_fedavg(
        [(p.features, p.labels) for p in parties],
        python=python,
        rounds=h["rounds"],
        local_steps=h["local_steps"],
        sampling_rate=h["sampling_rate"],
        noise_multiplier=z,
        clip=h["clip"],
        learning_rate=h["learning_rate"],
        server_momentum=h["server_momentum"],
    )
    predicted = np.argmax(ex @ weights[:, :-1].T + weights[:, -1], axis=1)
    return {
        "accuracy": accuracy(predicted, ey),
        "epsilon": fedavg_epsilon(z),
        "released": h["rounds"],
        "noise": f"z={z:.3f} per client step (continuous), Flower {info['seconds']} s",
    }


def _flower(args: argparse.Namespace) -> dict[str, Any]:
    return {"python": flower_python(args.cache_dir)}


DP_FEDAVG = Method("dp-fedavg", dp_fedavg_flower, ("fedavg",), _flower)
