"""What every method of ``benchmarks/mechanisms.py`` shares: δ, the Rényi orders, the hyper-parameters
(``HYPER``, the one table ``--set`` overrides and the recorded setting holds), the :class:`Method` record the
script's table is made of, and small helpers.

Hyper-parameters are fixed here; those that were tuned were chosen on a validation split held out of the
training images (``--evaluate-on validation``), never on the test set and without spending the reported
budgets (docs/mechanisms.md lists the candidates). Not tuned: Private-kNN's, Prom-PATE's (teachers, queries,
T/σ ratios taken from DIET-PATE), the CNN's (Tramèr & Boneh's clip and learning rate).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.federation.sizing import DPSGD_RECIPE, DPSGD_ROUNDS
from capc_common.privacy.analysis import DEFAULT_ORDERS

DELTA = 1e-5
#: Rényi orders for calibration (the default grid up to 256: larger orders never win at these budgets).
ORDERS = DEFAULT_ORDERS[DEFAULT_ORDERS <= 256]
#: Chosen on the validation split (see the module docstring and docs/mechanisms.md).
HYPER = {
    "dpsgd": {  # the recipe's, centrally; batch and epochs tuned like the federation's (docs/mechanisms.md)
        "batch": 60_000,  # ≥ the records: full batch, which beat every Poisson batch tried
        "epochs": DPSGD_ROUNDS,
        "momentum": 0.9,
        "adam_eps": 1e-4,
        **DPSGD_RECIPE,
    },
    "secagg": {  # docs/mechanisms.md, "A learning recipe" and "A step that follows the noise"
        "sampling_rate": 1.0,
        "rounds": DPSGD_ROUNDS,
        "statistics": True,
        "projection": 1024,
        "momentum": 0.9,
        "adam_eps": 1e-4,
        "variance_floor": 1.0,
        **DPSGD_RECIPE,  # the planner's: what `capc local up --mechanism secagg-dpsgd` runs
    },
    "dppl": {"count_share": 0.1, "metric": "euclidean"},
    "dppl_public": {  # the pool: the first `queries` images of the generator's stream
        "queries": 2000,
        "generator": "shaders",
        "per_class": 20,
        "rule": "mean",
        "d_min": 0.0,
        "d_max": 2.0,
    },
    "dppl_public_votes": {"per_class": 100},  # the pool: dppl_public's
    "knn": {"queries": 2000, "neighbours": 200, "sampling_rate": 0.2, "generator": "dead_leaves"},
    "prompate": {
        "teachers_per_party": 10,
        "shard": 64,
        "queries": 1024,
        "generator": "dead_leaves",
        "kind": "pad",
        "width": 3,
        "steps": 3,
        "prompt_lr": 0.05,
        "threshold": 0.6,
        "sigma1": 0.7,
        "sigma2": 0.16,
    },
    "local": {"optimizer": "adam", "steps": 100, "lr": 0.1, "l2": 0.0},
    "cnn": {"clip": 0.1, "batch": 512, "epochs": 10, "learning_rate": 4.0, "momentum": 0.9},
    "fedavg": {
        "rounds": 50,
        "local_steps": 2,
        "sampling_rate": 0.1,
        "clip": 1.0,
        "learning_rate": 8.0,
        "server_momentum": 0.9,
    },
    "capc": {"teachers_per_party": 10, "budget_queries": 90, "threshold_share": 0.6, "sigma1_ratio": 2.0},
}


def _nothing(args: argparse.Namespace) -> dict[str, Any]:
    del args
    return {}


@dataclass(frozen=True)
class Method:
    """One method of the table.

    Attributes:
        name: its name in ``--methods``, the CSV and the table.
        run: ``run(parties, eval_x, eval_y, *, epsilon, seed, **needs) → {"accuracy", "epsilon", "released",
            "noise"}``.
        uses: the ``HYPER`` groups it reads: rows merged from another run must agree on these (``--merge``).
        needs: what it needs besides the parties, prepared once per run from the arguments.
    """

    name: str
    run: Callable[..., dict[str, Any]]
    uses: tuple[str, ...]
    needs: Callable[[argparse.Namespace], dict[str, Any]] = field(default=_nothing)


def log(message: str) -> None:
    """Progress on stderr (stdout carries the JSON)."""
    print(message, file=sys.stderr, flush=True)


def accuracy(predicted: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Fraction correct."""
    return float(np.mean(np.asarray(predicted) == np.asarray(labels)))
