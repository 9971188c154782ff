"""DP-SGD of the linear head on the frozen per-example features: this engine's secure-aggregation DP-SGD
(``secagg-dpsgd``) and the central Opacus baseline on the pooled features (``central-dpsgd``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from _baselines import opacus_fit, predict

from capc_common.mechanisms import SecureDPSGD, calibrate
from capc_common.mechanisms.central import PartyData, run_secure_dpsgd
from capc_common.privacy.analysis import epsilon_from_rdp, rdp_subsampled_discrete_gaussian
from methods.common import DELTA, HYPER, ORDERS, Method, accuracy


def dpsgd_plan(records: int, group: str = "dpsgd") -> tuple[float, int, float]:
    """``(q, rounds, expected batch)`` of a DP-SGD recipe (``HYPER[group]``) for ``records`` records."""
    h = HYPER[group]
    q = min(1.0, h["batch"] / records)
    return q, max(1, round(h["epochs"] / q)), q * records


def secagg_dpsgd(
    parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, *, epsilon: float, seed: int
) -> dict[str, Any]:
    """The engine's secure-aggregation DP-SGD, noise calibrated with its own accountant."""
    h = HYPER["secagg"]
    records = sum(len(p.labels) for p in parties)
    q, rounds = h["sampling_rate"], h["rounds"]
    dim = parties[0].features.shape[1]

    def eps_of(z: float) -> float:  # SecureDPSGD.release_rdp, without building a head for every z
        rdp = rdp_subsampled_discrete_gaussian(ORDERS, sampling_rate=q, noise_multiplier=z)
        return epsilon_from_rdp(ORDERS, rounds * rdp, delta=DELTA)[0]

    z = calibrate(eps_of, target=epsilon)
    mechanism = SecureDPSGD(classes=10, dim=dim, clip=h["clip"], noise_multiplier=z, sampling_rate=q)
    result = run_secure_dpsgd(
        parties,
        mechanism=mechanism,
        rounds=rounds,
        expected_batch=q * records,
        learning_rate=h["learning_rate"],
        momentum=h["momentum"],
    )
    return {
        "accuracy": accuracy(result.predict(ex), ey),
        "epsilon": eps_of(z),
        "released": rounds,
        "noise": f"z={z:.3f} σ={mechanism.sigma:.0f} ({mechanism.fixed_point.bits} bits)",
    }


def central_dpsgd(
    parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, *, epsilon: float, seed: int
) -> dict[str, Any]:
    """Opacus DP-SGD of the same linear head on the pooled features (Poisson sampling, RDP accountant)."""
    import torch

    h = HYPER["dpsgd"]
    x = torch.from_numpy(np.concatenate([p.features for p in parties]).astype(np.float32))
    y = torch.from_numpy(np.concatenate([p.labels for p in parties]))
    q, rounds, _ = dpsgd_plan(len(y))
    model = torch.nn.Linear(x.shape[1], 10)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    z, spent = opacus_fit(
        model, x, y, h, epsilon=epsilon, delta=DELTA, sampling_rate=q, steps=rounds, seed=seed
    )
    return {
        "accuracy": accuracy(predict(model, torch.from_numpy(ex.astype(np.float32))), ey),
        "epsilon": spent,
        "released": rounds,
        "noise": f"z={z:.3f} (continuous)",
    }


SECAGG_DPSGD = Method("secagg-dpsgd", secagg_dpsgd, ("secagg",))
CENTRAL_DPSGD = Method("central-dpsgd", central_dpsgd, ("dpsgd",))
