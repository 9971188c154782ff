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
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.federation.sizing import DPSGD_RECIPE, DPSGD_ROUNDS
from capc_common.mechanisms import calibrate
from capc_common.privacy.analysis import DEFAULT_ORDERS, epsilon_from_rdp, rdp_subsampled_gaussian

DELTA = 1e-5
#: Rényi orders for calibration (the default grid up to 256: larger orders never win at these budgets).
ORDERS = DEFAULT_ORDERS[DEFAULT_ORDERS <= 256]
#: Chosen on the validation split (see the module docstring and docs/mechanisms.md).
HYPER = {
    "dpsgd": {  # central DP-SGD: the federation's recipe pieces, its own tuning (TUNING["central-dpsgd"])
        **DPSGD_RECIPE,  # the federation's recipe was the search's start; what the search changed follows
        "sampling_rate": 0.1,  # Poisson batches of a tenth of the records
        "epochs": 40,  # passes over the records: 400 steps
        "projection": 1024,
        "statistics": True,
        "momentum": 0.9,
        "adam_eps": 1e-4,
        "variance_floor": 1.0,
        "clip": 0.3,
        "learning_rate": 250.0 / 3,  # the step's cap, scaled with the clip (lr × C moves the head)
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
    "fedavg": {  # DP-FedAvg: the federation's recipe pieces, its own tuning (TUNING["dp-fedavg"])
        "rounds": 100,
        "local_steps": 1,
        "sampling_rate": 1.0,
        "clip": 0.1,
        "learning_rate": 7500.0,  # the step's cap
        "step_noise": 0.12,  # 0: the fixed step learning_rate; else the step that follows the noise
        "server_momentum": 0.0,
        "projection": 1024,
        "statistics": True,
        "unit_variance": True,
        "variance_floor": 0.3,
    },
    "capc": {"teachers_per_party": 10, "budget_queries": 90, "threshold_share": 0.6, "sigma1_ratio": 2.0},
}


#: The two validation splits the settings were compared on (never the test set, never the reported budgets).
_BASELINES_SPLIT = (
    "tune_baselines.py (joining.py --evaluate-on validation): Fashion-MNIST's last 10,000 training images "
    "held out, 4x1000's share of the first 50,000 in 4 parties (3,010 training records), holdouts at home"
)
_MECHANISMS_SPLIT = (
    "mechanisms.py --evaluate-on validation: the last 2,000 of the first 20,000 training images held out"
)
_RECIPE_SPLIT = (
    "Fashion-MNIST's first 50,000 training images pooled (full batch: the parties' union), the last 10,000 "
    "held out"
)
#: What tuning each method's settings got: the split its candidates were compared on, how many settings
#: were compared, over what, what was chosen, and where the comparison is written down. Recorded beside
#: ``HYPER`` in every run's setting and JSON (each row of ``joining.py`` and ``mechanisms.py`` names it), so a
#: table says which of its rows were tuned and how much — a baseline with a fraction of the federation's
#: tuning is not an equal comparison.
TUNING: dict[str, dict[str, Any]] = {
    "secagg-dpsgd": {
        "split": _RECIPE_SPLIT,
        "candidates": 100,
        "over": "subspace size and synthetic images, standardisation, optimiser, learning rate, clip, "
        "rounds, batch, step_noise, Adam's β and ε, encoding; most at ε 3, about 20 at ε 1",
        "chosen": "capc_common.federation.sizing.DPSGD_RECIPE, DPSGD_ROUNDS (HYPER['secagg'])",
        "where": "docs/mechanisms.md, 'A learning recipe' to 'Where ε = 1 stopped'",
    },
    "pooled": {
        "split": _RECIPE_SPLIT,
        "candidates": 0,
        "over": "none of its own: secagg-dpsgd's recipe with the noise off",
        "chosen": "HYPER['secagg']",
        "where": "docs/mechanisms.md, 'A learning recipe'",
    },
    "central-dpsgd": {
        "split": _BASELINES_SPLIT,
        "candidates": 25,
        "over": "from the federation's recipe: Poisson rate × epochs (9), step, clip, momentum, length, "
        "variance floor, step again; twice through, 3 finalists × 3 draws; ε 3 (ε 1 recorded, not used)",
        "chosen": "HYPER['dpsgd'] (validation 82.9 %, the federation's recipe 82.5 %: within selection "
        "noise)",
        "where": "docs/mechanisms.md, 'Tuning the reference baselines'; benchmarks/results/tune_baselines.* "
        "(run at code a383cccc3c1a: rates spelled as batches of the 3,010 records)",
    },
    "dp-fedavg": {
        "split": _BASELINES_SPLIT,
        "candidates": 58,
        "over": "the recipe pieces (public basis, DP statistics, unit variance, the step that follows the "
        "noise), step, clip, Poisson rate × rounds × local steps (7), step again, server momentum, length, "
        "variance floor; twice through, 3 finalists × 3 draws; ε 3 (ε 1 recorded, not used)",
        "chosen": "HYPER['fedavg'] (validation 80.7 %, raw features and a fixed step 69.9 %)",
        "where": "docs/mechanisms.md, 'Tuning the reference baselines'; benchmarks/results/tune_baselines.*",
    },
    "alone": {
        "split": "each party's own holdout (its records only)",
        "candidates": None,
        "over": "per party: the linear heads' L2 grid and the CNN from scratch (methods/personal.py RECIPE)",
        "chosen": "per party, on its holdout, then refitted on the whole party",
        "where": "docs/planning.md, 'What each hospital keeps'",
    },
    "local-only": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 4,
        "over": "Adam lr 0.01 / 0.1 × 100 / 300 steps",
        "chosen": "HYPER['local']",
        "where": "docs/mechanisms.md, 'Baselines'",
    },
    "dppl": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 2,
        "over": "distance: cosine, Euclidean (ε 1)",
        "chosen": "HYPER['dppl']",
        "where": "docs/mechanisms.md, 'Benchmark'",
    },
    "dppl-public": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 7,
        "over": "pool generator × K × rule (ε 1, one draw each)",
        "chosen": "HYPER['dppl_public']",
        "where": "docs/mechanisms.md, 'DP prototypes from a public pool'",
    },
    "dppl-public-votes": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 4,
        "over": "K 20 / 50 / 100 / 200 (ε 0.5, 1, 10; two seeds)",
        "chosen": "HYPER['dppl_public_votes']",
        "where": "docs/mechanisms.md, 'DP prototypes from a public pool'",
    },
    "private-knn": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 18,
        "over": "queries × neighbours × sampling rate (ε 3)",
        "chosen": "HYPER['knn']",
        "where": "docs/mechanisms.md, 'Benchmark'",
    },
    "capc-fair": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 1,
        "over": "query budget 90 (900 not run)",
        "chosen": "HYPER['capc']",
        "where": "docs/mechanisms.md, 'Baselines'",
    },
    "capc-greedy": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 1,
        "over": "query budget 90 (900 not run)",
        "chosen": "HYPER['capc']",
        "where": "docs/mechanisms.md, 'Baselines'",
    },
    "cnn-dpsgd": {
        "split": "none",
        "candidates": 0,
        "over": "not tuned: Tramèr & Boneh's published Fashion-MNIST settings, 10 epochs",
        "chosen": "HYPER['cnn']",
        "where": "docs/mechanisms.md, 'Baselines'",
    },
    "prom-pate": {
        "split": _MECHANISMS_SPLIT,
        "candidates": 3,
        "over": "prompt steps (the teachers' hold-out accuracy); teachers, queries, T and σ not tuned",
        "chosen": "HYPER['prompate']",
        "where": "docs/mechanisms.md, 'Benchmark'",
    },
    "diet-capc": {
        "split": "capc dietpate run's validation split (10,000 then 5,000 training images held out)",
        "candidates": 500,
        "over": "teacher recipes, teacher counts, (T, σ1, σ2) grids at ε 3 and 6, generators, students",
        "chosen": "configs/fashion-mnist-diet-pate.yaml; federation.sizing.MECHANISM_RATIOS",
        "where": "docs/dietpate.md §6; benchmarks/results/recipe_sweep/",
    },
    "pate-scratch": {
        "split": "capc dietpate run's validation split (10,000 then 5,000 training images held out)",
        "candidates": 90,
        "over": "the same (T, σ1, σ2) grid for pixel-MLP teachers",
        "chosen": "configs/fashion-mnist-diet-pate.yaml (method pate-scratch)",
        "where": "docs/dietpate.md §6; benchmarks/results/recipe_sweep/",
    },
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


@functools.cache
def gaussian_noise_for(sampling_rate: float, releases: int, epsilon: float) -> tuple[float, float]:
    """``(z, ε)``: the smallest noise multiplier (to 0.1 %) for which ``releases`` Poisson-subsampled Gaussian
    releases (rate ``sampling_rate``, continuous noise) cost at most ``epsilon`` at :data:`DELTA` by Mironov
    et al.'s exact analysis, and the ε they cost. Cached: below ``q = 1`` the fractional orders' series make
    one calibration about 25 s, and a validation sweep asks for the same few many times."""

    def spent(z: float) -> float:
        rdp = rdp_subsampled_gaussian(ORDERS, sampling_rate=sampling_rate, noise_multiplier=z)
        return float(epsilon_from_rdp(ORDERS, releases * rdp, delta=DELTA)[0])

    z = calibrate(spent, target=epsilon)
    return z, spent(z)


def log(message: str) -> None:
    """Progress on stderr (stdout carries the JSON)."""
    print(message, file=sys.stderr, flush=True)


def accuracy(predicted: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Fraction correct."""
    return float(np.mean(np.asarray(predicted) == np.asarray(labels)))
