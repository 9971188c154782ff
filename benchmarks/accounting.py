"""Speed of the privacy package: exact noise samplers, the budget ledger and the accountant.

The guardian draws ``B·(c+1)`` discrete Gaussians per batch (11,264 for B = 1024, c = 10) and makes two ledger
transactions (reserve, settle) per batch, each fsynced; the central runner and ``capc budget`` call the
accountant. Figures are best-of-``--repeats``.

    python benchmarks/accounting.py                  # table
    python benchmarks/accounting.py --format json    # one JSON object:
    # {"noise": {"<name>": {"draws_per_s": x, ...}}, "ledger": {...}, "accountant": {...}}
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capc_common.privacy import BudgetLedger, InsecureNoiseWarning, SeededNoise, SystemNoise, estimate
from capc_common.privacy.analysis import DEFAULT_ORDERS, rdp_screening_exact
from capc_common.privacy.noise import discrete_gaussian_exact, discrete_gaussian_table


def _best(func: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - started)
    return best


def bench_noise(repeats: int) -> dict[str, Any]:
    """Draws per second of the table samplers (CSPRNG and seeded) and of the exact reference sampler.

    ``build_s_first_call`` is the one-off cost of a table (cached per σ for the life of the process).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureNoiseWarning)
        seeded = SeededNoise(b"benchmark")
    system = SystemNoise()
    out: dict[str, Any] = {}
    for sigma in (1.0, 40.0, 120.0):
        started = time.perf_counter()
        table = discrete_gaussian_table(sigma=sigma)
        built = time.perf_counter() - started
        for name, source in (("system", system), ("seeded", seeded)):
            for n in (11_264, 1_000_000):
                seconds = _best(
                    lambda src=source, k=n, s=sigma: src.discrete_gaussian(sigma=s, shape=(k,)), repeats
                )
                out[f"discrete_gaussian_sigma{sigma:g}_{name}_n{n}"] = {
                    "draws_per_s": round(n / seconds),
                    "seconds": seconds,
                }
        out[f"table_sigma{sigma:g}"] = {
            "build_s_first_call": built,
            "entries": 2 * table.radius + 1,
            "distance_bound_log2": round(math.log2(table.distance_bound), 2),
        }
    n = 1_000_000
    seconds = _best(lambda: system.discrete_laplace(scale=20.0, shape=(n,)), repeats)
    out["discrete_laplace_scale20_system_n1000000"] = {"draws_per_s": round(n / seconds), "seconds": seconds}
    n = 2000
    seconds = _best(lambda: discrete_gaussian_exact(sigma=40.0, n=n, source=system), 1)
    out["exact_cks_sigma40_system_n2000"] = {"draws_per_s": round(n / seconds), "seconds": seconds}
    return out


def bench_ledger(batches: int) -> dict[str, Any]:
    """Reserve+settle pairs per second (each a fsynced transaction) and the time to verify the result."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        with BudgetLedger.create(path, epsilon_limit=50.0, delta=1e-5, order=8.0, config={"bench": 1}) as led:
            started = time.perf_counter()
            for i in range(batches):
                led.reserve(
                    f"b{i}", queries=1024, parties=["h1", "h2", "h3"], mechanism="confident-gnmax",
                    params={"count": 1024}, worst_case_rdp=1e-5, actor="student",
                )  # fmt: skip
                led.settle(f"b{i}", answered=300, actual_rdp=5e-6, actor="guardian")
            elapsed = time.perf_counter() - started
            started = time.perf_counter()
            report = led.verify()
            verified = time.perf_counter() - started
        return {
            "batches": batches,
            "batches_per_s": round(batches / elapsed, 1),
            "ms_per_transaction": round(1000 * elapsed / (2 * batches), 3),
            "verify_s": round(verified, 4),
            "verify_ok": report.ok,
            "entries": report.entries,
        }


def bench_accountant(repeats: int) -> dict[str, Any]:
    """Time of the exact screening supremum over the default order grid and of a full estimate()."""
    params = {"teachers": 250, "classes": 10, "threshold": 170.0, "sigma1": 100.0}
    out: dict[str, Any] = {"orders": int(DEFAULT_ORDERS.size)}
    for noise in ("continuous", "discrete"):
        out[f"screening_{noise}_s"] = _best(
            lambda nz=noise: rdp_screening_exact(DEFAULT_ORDERS, noise=nz, **params), repeats
        )
    out["estimate_s"] = _best(
        lambda: estimate(**params, sigma2=40.0, queries=10_000, answered=3000, delta=1e-5), repeats
    )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--repeats", type=int, default=3, help="Timings per figure (best is kept).")
    parser.add_argument("--ledger-batches", type=int, default=300, help="Reserve+settle pairs timed.")
    args = parser.parse_args(argv)
    result = {
        "noise": bench_noise(args.repeats),
        "ledger": bench_ledger(args.ledger_batches),
        "accountant": bench_accountant(args.repeats),
    }
    if args.format == "json":
        print(json.dumps(result))
    else:
        for section, figures in result.items():
            print(section)
            for name, value in figures.items():
                print(f"  {name}: {value}")
    return result


if __name__ == "__main__":
    main()
