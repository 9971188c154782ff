"""Baselines of ``benchmarks/mechanisms.py`` that are not this engine's mechanisms: central DP-SGD with Opacus
(a linear head on the frozen features, or a small CNN end to end on the pooled images) and DP federated
averaging on Flower (:mod:`_flower_app`). Kept here so the benchmark script stays a table of methods.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _flower_app import simulate

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------- Opacus DP-SGD
def opacus_fit(
    model: Any,
    x: Any,
    y: Any,
    recipe: Mapping[str, float],
    *,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    seed: int,
) -> tuple[float, float]:
    """Train ``model`` in place with Opacus DP-SGD: Poisson sampling at ``sampling_rate`` for ``steps`` steps,
    noise calibrated to ``(epsilon, delta)`` by Opacus's RDP accountant (continuous Gaussian, Mironov et al.),
    clipping at ``recipe["clip"]``, SGD with ``recipe["learning_rate"]`` and ``recipe["momentum"]``.

    The loss is summed and divided by the *expected* batch, as Opacus's noise scale assumes.

    Returns:
        ``(noise multiplier, ε spent by Opacus's accountant)``.
    """
    import torch
    from opacus import PrivacyEngine
    from opacus.accountants.utils import get_noise_multiplier

    torch.manual_seed(seed)
    batch = sampling_rate * len(y)
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe["learning_rate"], momentum=recipe["momentum"])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=round(batch))
    z = get_noise_multiplier(
        target_epsilon=epsilon, target_delta=delta, sample_rate=sampling_rate, steps=steps, accountant="rdp"
    )
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=z,
        max_grad_norm=recipe["clip"],
    )
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    done = 0
    while done < steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            if len(yb):
                (loss_fn(model(xb), yb) / batch).backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    return float(z), float(engine.get_epsilon(delta))


def small_cnn(side: int, channels: int = 1, classes: int = 10) -> Any:
    """A small tanh CNN (two 3×3 convolutions with 2×2 max-pooling, a 32-unit hidden layer).

    tanh and no BatchNorm, as in Tramèr & Boneh's DP-SGD CNNs (bounded activations suit clipping; BatchNorm
    mixes examples and breaks per-example gradients). Not their exact architecture (theirs needs ≥ 28 pixels).
    """
    import torch

    flat = 32 * (side // 4) ** 2
    return torch.nn.Sequential(
        torch.nn.Conv2d(channels, 16, 3, padding=1),
        torch.nn.Tanh(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.Tanh(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(flat, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, classes),
    )


def as_tensor_images(images: npt.NDArray[np.uint8]) -> Any:
    """``(N, H, W, C)`` uint8 → ``(N, C, H, W)`` float32 in [-1, 1]."""
    import torch

    return torch.from_numpy(images.astype(np.float32).transpose(0, 3, 1, 2) / 127.5 - 1.0)


def predict(model: Any, x: Any, *, chunk: int = 2048) -> npt.NDArray[np.int64]:
    """Labels of ``x`` by ``model`` (no gradients, in chunks)."""
    import torch

    with torch.no_grad():
        return np.concatenate(
            [model(x[i : i + chunk]).argmax(dim=1).numpy() for i in range(0, len(x), chunk)]
        )


# ---------------------------------------------------------------------------------- Flower DP-FedAvg
#: Flower lives in its own virtual environment: its pins (protobuf 6, grpcio-health-checking 1.81, fastapi
#: 0.138) conflict with the project's (protobuf 7, ...), so installing it beside them would break the engine.
FLOWER_REQUIREMENT = "flwr==1.42.0"


def flower_python(cache_dir: Path, *, timeout: float = 900) -> Path:
    """The interpreter of the Flower virtual environment under ``cache_dir``, created on first use.

    A marker file is written only after the install succeeded, so an interrupted build is redone rather
    than used half-installed.

    Raises:
        RuntimeError: the install failed or timed out; the message gives the command to run by hand.
    """
    env = cache_dir / "flower-venv"
    python, marker = env / "bin" / "python", env / ".capc-installed"
    if marker.exists():
        return python
    by_hand = f"python3 -m venv {env} && {env}/bin/pip install {FLOWER_REQUIREMENT} numpy && touch {marker}"
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(env)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", FLOWER_REQUIREMENT, "numpy"],
            check=True,
            timeout=timeout,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        raise RuntimeError(
            f"could not build Flower's environment ({exc}); build it by hand: {by_hand}"
        ) from exc
    marker.touch()
    return python


def _wait_all(
    server: subprocess.Popen[bytes], clients: list[subprocess.Popen[bytes]], *, timeout: float
) -> tuple[int | None, list[int | None]]:
    """Wait for the server and every client to exit; stop early when any of them fails (a client that
    crashes at start would otherwise leave the server waiting for it until ``timeout``).

    Returns:
        the exit codes, None for a process still running when the wait ended (the caller kills it).
    """
    deadline = time.monotonic() + timeout
    processes = [server, *clients]
    while time.monotonic() < deadline:
        codes = [p.poll() for p in processes]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.2)
    codes = [p.poll() for p in processes]
    return codes[0], codes[1:]


def _flower_run(work: Path, plan: dict[str, Any], *, python: Path, timeout: float) -> float:
    """One phase of ``plan`` (written to ``work/plan.json``) on Flower: a server process and one client
    process per party over localhost gRPC. Returns its seconds.

    Raises:
        RuntimeError: a process failed or the run exceeded ``timeout`` (its output is in the message).
    """
    from capc_services.local.provision import free_port  # below the ephemeral range (its docstring)

    (work / "plan.json").write_text(json.dumps({**plan, "address": f"127.0.0.1:{free_port()}"}))
    app = str(HERE / "_flower_app.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}
    phase = plan["phase"]
    started = time.perf_counter()
    names = [f"{phase}-server", *(f"{phase}-{i}" for i in range(plan["clients"]))]
    logs = [open(work / f"{n}.log", "w") for n in names]  # noqa: SIM115
    try:
        server = subprocess.Popen(
            [str(python), app, "server", str(work)], stdout=logs[0], stderr=subprocess.STDOUT, env=env
        )
        clients = [
            subprocess.Popen(
                [str(python), app, "client", str(work), str(i)],
                stdout=logs[i + 1],
                stderr=subprocess.STDOUT,
                env=env,
            )
            for i in range(plan["clients"])
        ]
        try:
            code, codes = _wait_all(server, clients, timeout=timeout)
        finally:
            for p in [server, *clients]:
                if p.poll() is None:
                    p.kill()
    finally:
        for handle in logs:
            handle.close()
    out = "statistics.npy" if phase == "statistics" else "weights.npy"
    if code != 0 or any(codes) or not (work / out).exists():
        tails = {n: (work / f"{n}.log").read_text()[-1500:] for n in names}
        raise RuntimeError(
            f"Flower run ({phase}) failed (server {code}, clients {codes}; None: still running after "
            f"{timeout:g} s or stopped because another process failed): {json.dumps(tails)}"
        )
    return time.perf_counter() - started


def dp_fedavg(
    shards: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]],
    *,
    python: Path | None,
    plan: Mapping[str, Any],
    standardise: Callable[[npt.NDArray[np.float64]], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]
    | None = None,
    timeout: float = 3600,
) -> tuple[npt.NDArray[np.float64], dict[str, Any]]:
    """Run DP-FedAvg of a linear head on Flower: a real server process and one client process per party over
    localhost gRPC, each client running ``plan["local_steps"]`` DP-SGD steps per round on its own shard
    (:mod:`_flower_app`). With ``standardise``, a statistics phase first (its own Flower run: each client's
    noisy sums, summed by the server); ``standardise(sum) → (mean, scale)`` makes the feature map every
    client applies in training. ``python`` None: both phases in this process instead
    (:func:`_flower_app.simulate`, for validation sweeps).

    Args:
        plan: ``rounds``, ``local_steps``, ``sampling_rate``, ``noise_multiplier``, ``clip``,
            ``learning_rate``, ``step_noise`` (0: the fixed step), ``server_momentum``.

    Returns:
        ``(weights (classes, dim + 1) over the mapped features, bias last, {"seconds", "rounds", "map"})``;
        ``map`` is ``(mean, scale)`` or None.

    Raises:
        RuntimeError: a process failed or a phase exceeded ``timeout`` (its output is in the message).
    """
    common = {**plan, "clients": len(shards), "dim": int(shards[0][0].shape[1]), "classes": 10}
    phases = [{**common, "phase": "statistics", "rounds": 1}] if standardise else []
    phases.append({**common, "phase": "train"})
    seconds, fmap = 0.0, None
    with tempfile.TemporaryDirectory(prefix="capc-flower-") as tmp:
        work = Path(tmp)
        for i, (x, y) in enumerate(shards):
            np.save(work / f"x{i}.npy", x)
            np.save(work / f"y{i}.npy", y)
        for phase in phases:
            if python is None:
                (work / "plan.json").write_text(json.dumps(phase))
                started = time.perf_counter()
                simulate(work)
                seconds += time.perf_counter() - started
            else:
                seconds += _flower_run(work, phase, python=python, timeout=timeout)
            if phase["phase"] == "statistics" and standardise is not None:
                mean, scale = standardise(np.load(work / "statistics.npy"))
                np.savez(work / "map.npz", mean=mean, scale=scale)
                fmap = (mean, scale)
        weights = np.load(work / "weights.npy")
    return weights, {"seconds": round(seconds, 1), "rounds": plan["rounds"], "map": fmap}


if __name__ == "__main__":  # pragma: no cover - a helper module, not a benchmark
    sys.exit("run benchmarks/mechanisms.py; this module only holds its baselines")
