"""Flower server and client processes of the DP-FedAvg baseline (run by ``_baselines.dp_fedavg`` with the
Flower virtual environment's interpreter; needs only ``flwr`` and ``numpy``).

    python _flower_app.py server WORKDIR        # plan["rounds"] rounds over plan["clients"] clients
    python _flower_app.py client WORKDIR INDEX  # party INDEX: its shard WORKDIR/x{INDEX}.npy, y{INDEX}.npy

A run is one of two phases (``plan["phase"]``), each its own server and clients:

* ``statistics`` (one round, when the recipe standardises): each client releases the noisy sums of its
  records' features, their squares and its count over a Poisson sample (rate ``q``) — each record adds
  ``(u, u², 1)·C/√3``, clipped to L2 norm ``C`` (for ``‖u‖ ≤ 1`` the clip never binds), Gaussian noise
  ``N(0, (zC)²)`` on each coordinate — the same sensitivity and noise as one DP-SGD step, so it is charged as
  one. The server sums them (``statistics.npy``); the caller turns the sum into the feature map
  (``map.npz``: the centre and scale every client applies to its records before training).
* ``train``: every round each client takes ``local_steps`` DP-SGD steps on its own shard from the global
  head — a Poisson sample (rate ``q``) of its records, per-example gradients clipped to L2 norm ``C``,
  Gaussian noise ``N(0, (zC)²)`` on the sum, divided by the expected batch ``q·n`` — and returns the head.
  The step is ``learning_rate``, or with ``step_noise`` the one that puts noise of that σ on each weight,
  ``min(learning_rate, step_noise·q·n / (zC))`` (the federation's step that follows the noise, per client).
  The server averages the clients' heads (weighted by record count) and applies server momentum (Flower's
  FedAvgM); both are post-processing.

A record lives on one client, so its privacy loss is that client's releases: the statistics and
``rounds × local_steps`` subsampled-Gaussian steps (accounted by the caller). The clients' noise is drawn by
NumPy's PCG64 seeded from the OS CSPRNG: a utility baseline, as Opacus's default (non-secure) mode.

:func:`simulate` runs either phase in one process on the same files with the same client code and FedAvgM's
update: what a validation sweep of many settings runs (a Flower run of ten clients takes minutes of process
start-up and gRPC on a loaded machine); it agrees with the Flower run to rounding when no noise is drawn
(``tests/mechanisms/test_baselines.py``).
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np


def _plan(work: Path) -> dict[str, Any]:
    return dict(json.loads((work / "plan.json").read_text()))


def shard(work: Path, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``index``'s records, on the feature map when training under one (``map.npz``)."""
    x, y = np.load(work / f"x{index}.npy"), np.load(work / f"y{index}.npy")
    if (work / "map.npz").exists() and _plan(work)["phase"] == "train":
        fmap = np.load(work / "map.npz")
        x = (x.astype(np.float64) - fmap["mean"]) / fmap["scale"]
    return x, y


def noisy_statistics(x: np.ndarray, plan: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """A client's statistics release: the noisy sums of ``(u, u², 1)·C/√3`` (each clipped to ``C``) over a
    Poisson sample of its records, ``2·dim + 1`` values."""
    q, clip, z = plan["sampling_rate"], plan["clip"], plan["noise_multiplier"]
    u = x[np.flatnonzero(rng.random(len(x)) < q)].astype(np.float64)
    rows = np.hstack([u, u * u, np.ones((len(u), 1))]) * (clip / math.sqrt(3))
    norms = np.linalg.norm(rows, axis=1)
    rows *= np.minimum(1.0, clip / np.maximum(norms, 1e-300))[:, None]
    return rows.sum(axis=0) + rng.normal(0.0, z * clip, size=rows.shape[1])


def dp_sgd_steps(
    w: np.ndarray, x: np.ndarray, y: np.ndarray, plan: dict[str, Any], rng: np.random.Generator
) -> np.ndarray:
    """``local_steps`` DP-SGD steps of the linear head ``w`` (``(classes, dim + 1)``, bias last) on the
    records ``x`` with a constant 1 appended (the bias's input); a full sample is used in place, not
    copied."""
    q, clip, z = plan["sampling_rate"], plan["clip"], plan["noise_multiplier"]
    step = plan["learning_rate"]
    if plan[
        "step_noise"
    ]:  # the step that puts noise of σ step_noise on each weight (the record count public)
        step = min(step, plan["step_noise"] * q * len(y) / (z * clip))
    classes = w.shape[0]
    onehot = np.eye(classes)[y]
    squares = np.einsum("ij,ij->i", x, x, dtype=np.float64) + 1.0  # ‖(x, 1)‖²
    for _ in range(plan["local_steps"]):
        take = rng.random(len(y)) < q
        xs, hs, ss = (x, onehot, squares) if take.all() else (x[take], onehot[take], squares[take])
        xs = xs.astype(np.float64, copy=False)
        logits = xs @ w[:, :-1].T + w[:, -1]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        err = p - hs
        # per-example gradient err_i ⊗ (x_i, 1) has norm |err_i|·|(x_i, 1)|
        norms = np.linalg.norm(err, axis=1) * np.sqrt(ss)
        err *= np.minimum(1.0, clip / np.maximum(norms, 1e-12))[:, None]
        grad = np.concatenate([err.T @ xs, err.sum(axis=0)[:, None]], axis=1)
        grad += rng.normal(0.0, z * clip, size=w.shape)
        w = w - step * grad / (q * len(y))
    return w


def _answer(
    parameters: np.ndarray, x: np.ndarray, y: np.ndarray, plan: dict[str, Any], rng: np.random.Generator
) -> np.ndarray:
    """A client's answer to one fit request of the plan's phase."""
    if plan["phase"] == "statistics":
        return noisy_statistics(x, plan, rng)
    return dp_sgd_steps(parameters, x, y, plan, rng)


def _start(plan: dict[str, Any]) -> np.ndarray:
    """The server's initial parameters: the zero head (the statistics phase's are never read)."""
    return np.zeros((plan["classes"], plan["dim"] + 1))


def client(work: Path, index: int) -> None:
    """One party: connects to the server and answers its fit requests."""
    import flwr as fl

    plan = _plan(work)
    x, y = shard(work, index)
    rng = np.random.default_rng(secrets.randbits(128))

    class Party(fl.client.NumPyClient):  # type: ignore[misc]
        def fit(
            self, parameters: list[np.ndarray], config: dict[str, Any]
        ) -> tuple[list[np.ndarray], int, dict]:
            return [_answer(parameters[0], x, y, plan, rng)], len(y), {}

    fl.client.start_client(server_address=plan["address"], client=Party().to_client(), insecure=True)


def server(work: Path) -> None:
    """Every client each round; FedAvgM in training (the head to ``weights.npy`` after each round), the sum of
    the releases in the statistics phase (``statistics.npy``)."""
    import flwr as fl
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    plan = _plan(work)

    class Saving(fl.server.strategy.FedAvgM):  # type: ignore[misc]
        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            if failures:
                raise RuntimeError(f"round {server_round}: {len(failures)} client(s) failed")
            if plan["phase"] == "statistics":
                total = sum(parameters_to_ndarrays(r.parameters)[0] for _, r in results)
                np.save(work / "statistics.npy", total)
                print(f"statistics: {len(results)} clients", flush=True)
                return ndarrays_to_parameters([total]), {}
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
        initial_parameters=ndarrays_to_parameters([_start(plan)]),
        server_learning_rate=1.0,
        server_momentum=plan["server_momentum"],
    )
    fl.server.start_server(
        server_address=plan["address"],
        config=fl.server.ServerConfig(num_rounds=plan["rounds"]),
        strategy=strategy,
    )


def simulate(work: Path) -> None:
    """The run's phase in this process, as :func:`server` and :func:`client` compute it: each client's answer
    from its own generator (seeded from the OS CSPRNG), the statistics summed, or FedAvgM's update — Flower's
    record-weighted average (``flwr.server.strategy.aggregate.aggregate``), then momentum on the
    pseudo-gradient ``w − average`` at server learning rate 1 — written to the same files."""
    plan = _plan(work)
    shards = [shard(work, i) for i in range(plan["clients"])]
    rngs = [np.random.default_rng(secrets.randbits(128)) for _ in shards]
    w = _start(plan)
    if plan["phase"] == "statistics":
        answers = [_answer(w, x, y, plan, g) for (x, y), g in zip(shards, rngs, strict=True)]
        np.save(work / "statistics.npy", sum(answers))
        return
    total = sum(len(y) for _, y in shards)
    momentum = np.zeros_like(w)
    for r in range(plan["rounds"]):
        heads = [_answer(w, x, y, plan, g) * len(y) for (x, y), g in zip(shards, rngs, strict=True)]
        pseudo = w - reduce(np.add, heads) / total
        momentum = pseudo if r == 0 else plan["server_momentum"] * momentum + pseudo
        w = w - momentum
    np.save(work / "weights.npy", w)


if __name__ == "__main__":
    role, workdir = sys.argv[1], Path(sys.argv[2])
    if role == "server":
        server(workdir)
    else:
        client(workdir, int(sys.argv[3]))
