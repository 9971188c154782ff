"""Flower server and client processes of the DP-FedAvg baseline (run by ``_baselines.dp_fedavg`` with the
Flower virtual environment's interpreter; needs only ``flwr`` and ``numpy``).

    python _flower_app.py server WORKDIR        # FedAvgM over plan["clients"] clients, plan["rounds"] rounds
    python _flower_app.py client WORKDIR INDEX  # party INDEX: its shard WORKDIR/x{INDEX}.npy, y{INDEX}.npy

Example-level DP: every round each client takes ``local_steps`` DP-SGD steps on its own shard from the
global head — a Poisson sample (rate ``q``) of its records, per-example gradients clipped to L2 norm ``C``,
Gaussian noise ``N(0, (zC)²)`` on the sum, divided by the expected batch ``q·n`` — and returns the head.
The server averages the clients' heads (weighted by record count) and applies server momentum (FedAvgM);
both are post-processing. A record lives on one client, so its privacy loss is that client's
``rounds × local_steps`` subsampled-Gaussian steps (accounted by the caller). The clients' noise is drawn by
NumPy's PCG64 seeded from the OS CSPRNG: a utility baseline, as Opacus's default (non-secure) mode.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _plan(work: Path) -> dict[str, Any]:
    return dict(json.loads((work / "plan.json").read_text()))


def dp_sgd_steps(
    w: np.ndarray, x: np.ndarray, y: np.ndarray, plan: dict[str, Any], rng: np.random.Generator
) -> np.ndarray:
    """``local_steps`` DP-SGD steps of the linear head ``w`` (``(classes, dim + 1)``, bias last)."""
    q, clip, z = plan["sampling_rate"], plan["clip"], plan["noise_multiplier"]
    classes = w.shape[0]
    for _ in range(plan["local_steps"]):
        rows = np.flatnonzero(rng.random(len(y)) < q)
        xb = np.hstack([x[rows], np.ones((len(rows), 1), x.dtype)]).astype(np.float64)
        logits = xb @ w.T
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        err = p - np.eye(classes)[y[rows]]
        # per-example gradient err_i ⊗ x_i has norm |err_i|·|x_i|
        norms = np.linalg.norm(err, axis=1) * np.linalg.norm(xb, axis=1)
        scale = np.minimum(1.0, clip / np.maximum(norms, 1e-12))
        grad = (err * scale[:, None]).T @ xb + rng.normal(0.0, z * clip, size=w.shape)
        w = w - plan["learning_rate"] * grad / (q * len(y))
    return w


def client(work: Path, index: int) -> None:
    """One party: connects to the server and answers its fit requests with its DP-SGD steps."""
    import flwr as fl

    plan = _plan(work)
    x, y = np.load(work / f"x{index}.npy"), np.load(work / f"y{index}.npy")
    rng = np.random.default_rng(secrets.randbits(128))

    class Party(fl.client.NumPyClient):  # type: ignore[misc]
        def fit(
            self, parameters: list[np.ndarray], config: dict[str, Any]
        ) -> tuple[list[np.ndarray], int, dict]:
            return [dp_sgd_steps(parameters[0], x, y, plan, rng)], len(y), {}

    fl.client.start_client(server_address=plan["address"], client=Party().to_client(), insecure=True)


def server(work: Path) -> None:
    """FedAvgM over every client each round; writes the final head to ``weights.npy``."""
    import flwr as fl
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    plan = _plan(work)
    start = np.zeros((plan["classes"], plan["dim"] + 1))

    class Saving(fl.server.strategy.FedAvgM):  # type: ignore[misc]
        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            if failures:
                raise RuntimeError(f"round {server_round}: {len(failures)} client(s) failed")
            params, metrics = super().aggregate_fit(server_round, results, failures)
            np.save(work / "weights.npy", parameters_to_ndarrays(params)[0])
            print(f"round {server_round}: {len(results)} clients", flush=True)
            return params, metrics

    clients = plan["clients"]
    strategy = Saving(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=clients,
        min_available_clients=clients,
        initial_parameters=ndarrays_to_parameters([start]),
        server_learning_rate=1.0,
        server_momentum=plan["server_momentum"],
    )
    fl.server.start_server(
        server_address=plan["address"],
        config=fl.server.ServerConfig(num_rounds=plan["rounds"]),
        strategy=strategy,
    )


if __name__ == "__main__":
    role, workdir = sys.argv[1], Path(sys.argv[2])
    if role == "server":
        server(workdir)
    else:
        client(workdir, int(sys.argv[3]))
