"""The mechanisms and the baselines side by side: test accuracy against ε on the same parties' data.

Every method sees the same parties (``--parties`` disjoint shards of the first ``--train-limit`` training
images, partitioned ``iid`` or ``imbalanced``), the same per-example features (the shared backbone with
BatchNorm running statistics, each image alone, L2-normalised), the same test images, the same δ, and is
accounted rigorously:

* ``local-only`` — each party's own logistic head (non-private; the number a hospital compares against),
  the mean over parties; one value, shown at every ε;
* ``secagg-dpsgd`` — this engine's secure-aggregation DP-SGD (:class:`~capc_common.mechanisms.SecureDPSGD`):
  clipped per-example gradient sums secret-shared in the ring, exact discrete Gaussian noise. Full batch
  (``sampling_rate`` 1: DP gradient descent), so each round is the discrete Gaussian's own RDP, exactly the
  continuous Gaussian's — no subsampling bound, and none of the floor the general Poisson bound has at
  small ε (docs/mechanisms.md);
* ``central-dpsgd`` — the central baseline on the pooled features: Opacus with Poisson sampling (batch
  1,024) and its RDP accountant (continuous Gaussian, Mironov et al.'s exact subsampled analysis);
* ``dppl`` — DP prototypes (:class:`~capc_common.mechanisms.DPPrototypes`): one noisy release of per-class
  sums and counts, nearest prototype by cosine, zCDP accounting;
* ``dppl-public`` — DPPL-Public (:class:`~capc_common.mechanisms.PublicPrototypes`): no public data, so the
  candidate pool is the first ``queries`` synthetic images (per-example features); per class the exact
  exponential mechanism selects ``per_class`` of them (peeling) by the summed clipped similarity to the
  class's records, the student is the nearest class mean of its selections; ε from the bounded-range bound
  (trusted curator: central only);
* ``dppl-public-votes`` — the same pool and student, selected the way the federation runs it
  (:class:`~capc_common.mechanisms.PublicPrototypeVotes`): every record votes for its nearest candidate,
  one release of the noisy per-class vote counts (discrete Gaussian through real additive sharing, zCDP),
  each class's prototype is its ``per_class`` most-voted candidates weighted by their noisy counts;
* ``prom-pate`` — Prom-PATE (:mod:`capc_common.learn.prompts`, :mod:`capc_common.mechanisms.prompate`):
  each party's first ``teachers_per_party × shard`` records become that many teachers, each a visual prompt
  plus a linear label map trained on its shard alone through the frozen backbone (current statistics);
  they vote on dead-leaves queries, Confident-GNMax (T, σ1, σ2 as fractions of the teacher count)
  answers them within the budget, and the library's student learns the answers (on current-statistics
  features, as ``capc dietpate run``'s student: the regime the teachers vote in);
* ``private-knn`` — Private-kNN (:class:`~capc_common.mechanisms.PrivateKNN`) on synthetic (dead-leaves)
  queries, no public data: every party's Poisson-subsampled records vote by k nearest neighbours, GNMax
  labels every query, the student is a linear head on the labelled queries (the library's student);
* ``capc-fair`` / ``capc-greedy`` — CaPC in plaintext (:mod:`capc_common.mechanisms.capc`): a querying
  party's own records are labelled by the other parties' heads through Confident-GNMax and it retrains its
  head on its records plus the answered ones; fair splits the query budget over all parties, greedy gives it
  to one (mean over which); the accounting is the Confident-GNMax object's, all queries charged as answered;
* ``cnn-dpsgd`` — a small CNN end to end on the pooled images (no backbone), Opacus DP-SGD (``_baselines``);
* ``dp-fedavg`` — DP federated averaging of the linear head on Flower, real server and client processes on
  localhost in Flower's own virtual environment (built on first use under ``--cache-dir``: its pins conflict
  with the project's); example-level DP from each client's local DP-SGD steps (``_flower_app``).

Hyper-parameters are fixed below (``HYPER``); those that were tuned were chosen on a validation split held
out of the training images (``--evaluate-on validation``), never on the test set (docs/mechanisms.md lists
the candidates). That choice is a release of the protected training images that the reported budgets do not
account for (Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential Privacy"): each row's ε
covers one run at fixed settings, not the tuning. Not tuned: Private-kNN's, Prom-PATE's (teachers,
queries, T/σ ratios taken from DIET-PATE), the CNN's (Tramèr & Boneh's clip and learning rate). The test set
is read once per reported figure. Every run records its setting next to its CSV and refuses to resume a CSV
of another setting. Noise multipliers are calibrated to each ε from the
methods' own accountants (δ = 1e-5).

    python benchmarks/mechanisms.py --format json                     # the grid (resumable)
    python benchmarks/mechanisms.py --epsilons 3 --seeds 0 --methods dppl secagg-dpsgd
    python benchmarks/mechanisms.py --dataset digits --train-limit 1400   # seconds: the test's short run

Outputs (``--out``, default benchmarks/results): ``mechanisms.csv`` (one row per method, partition, ε,
seed), ``mechanisms.md`` (mean ± std over seeds), ``mechanisms.png`` (accuracy against ε, one line per
method, one panel per partition). Features are cached in ``--cache-dir``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _baselines import as_tensor_images, dp_fedavg, flower_python, opacus_fit, predict, small_cnn

from capc_common.data import partition
from capc_common.dietpate.cache import FeatureCache
from capc_common.mechanisms import DPPrototypes, SecureDPSGD, calibrate, nearest_prototype, normalise
from capc_common.mechanisms.central import (
    PartyData,
    per_example_features,
    run_private_knn,
    run_prototypes,
    run_secure_dpsgd,
)
from capc_common.privacy.analysis import (
    DEFAULT_ORDERS,
    epsilon_from_rdp,
    epsilon_from_zcdp,
    rdp_subsampled_discrete_gaussian,
    rdp_subsampled_gaussian,
)

ROOT = Path(__file__).resolve().parents[1]
METHODS = (
    "local-only",
    "secagg-dpsgd",
    "central-dpsgd",
    "dppl",
    "dppl-public",
    "dppl-public-votes",
    "private-knn",
    "capc-fair",
    "capc-greedy",
    "cnn-dpsgd",
    "dp-fedavg",
    "prom-pate",
)
#: The HYPER groups each method reads: rows merged from another run must agree on these (``--merge``).
USES = {
    "local-only": ("local",),
    "secagg-dpsgd": ("secagg",),
    "central-dpsgd": ("dpsgd",),
    "dppl": ("dppl",),
    "dppl-public": ("dppl_public",),
    "dppl-public-votes": ("dppl_public", "dppl_public_votes"),
    "private-knn": ("knn",),
    "capc-fair": ("capc", "local"),
    "capc-greedy": ("capc", "local"),
    "cnn-dpsgd": ("cnn",),
    "dp-fedavg": ("fedavg",),
    "prom-pate": ("prompate",),
}
EPSILONS = (0.5, 1.0, 2.0, 3.0, 6.0, 10.0)
DELTA = 1e-5
#: Rényi orders for calibration (the default grid up to 256: larger orders never win at these budgets).
ORDERS = DEFAULT_ORDERS[DEFAULT_ORDERS <= 256]
#: Chosen on the validation split (see the module docstring and docs/mechanisms.md).
HYPER = {
    "dpsgd": {"clip": 1.0, "batch": 1024, "epochs": 10, "learning_rate": 8.0, "momentum": 0.9},
    "secagg": {"clip": 1.0, "sampling_rate": 1.0, "rounds": 100, "learning_rate": 8.0, "momentum": 0.9},
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
FIELDS = (
    "method",
    "partition",
    "epsilon_target",
    "epsilon",
    "seed",
    "accuracy",
    "released",
    "noise",
    "seconds",
)


def log(message: str) -> None:
    """Progress on stderr (stdout carries the JSON)."""
    print(message, file=sys.stderr, flush=True)


def load_features(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(train_x, train_y, eval_x, eval_y)``: per-example features, L2-normalised."""
    if args.dataset == "digits":
        from capc_common.data import load_dataset

        train, test = load_dataset("digits", split="train"), load_dataset("digits", split="test")
        tx = train.images.reshape(len(train.labels), -1)[: args.train_limit].astype(np.float32)
        ty = train.labels[: args.train_limit].astype(np.int64)
        ex, ey = test.images.reshape(len(test.labels), -1).astype(np.float32), test.labels.astype(np.int64)
    else:
        from capc_common.learn.featurizers import BackboneFeaturizer
        from capc_common.models import default_backbone, load_backbone

        fz = BackboneFeaturizer(load_backbone(default_backbone(28, 28, 1)))
        cache = FeatureCache(args.cache_dir)
        tx, ty = per_example_features(
            fz, dataset=args.dataset, split="train", limit=args.train_limit, cache=cache, log=log
        )
        ex, ey = per_example_features(
            fz, dataset=args.dataset, split="test", limit=args.test_limit, cache=cache, log=log
        )
    if args.evaluate_on == "validation":
        cut = len(ty) - args.validation
        tx, ty, ex, ey = tx[:cut], ty[:cut], tx[cut:], ty[cut:]
    return normalise(tx), ty, normalise(ex), ey


def parties_of(x: np.ndarray, y: np.ndarray, *, scheme: str, parties: int, seed: int) -> list[PartyData]:
    """The parties' disjoint shards (public, seeded assignment)."""
    extra = {"imbalance_ratio": 10.0} if scheme == "imbalanced" else {}
    shards = partition(y, shards=parties, scheme=scheme, seed=seed, **extra)
    return [PartyData(f"party-{i}", x[s], y[s], index=np.asarray(s)) for i, s in enumerate(shards)]


def accuracy(predicted: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Fraction correct."""
    return float(np.mean(np.asarray(predicted) == np.asarray(labels)))


# ---------------------------------------------------------------------------------------------- methods
def local_only(parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, **_: Any) -> dict[str, Any]:
    """Each party's own (non-private) logistic head, batched with the library's head trainer."""
    from capc_common.learn.heads import HeadRecipe, train_heads

    x = np.concatenate([p.features for p in parties])
    y = np.concatenate([p.labels for p in parties])
    owners = np.repeat(np.arange(len(parties)), [len(p.labels) for p in parties])
    heads = train_heads(
        x, y, owners=owners, heads=len(parties), classes=10, recipe=HeadRecipe(**HYPER["local"])
    )
    per_party = (heads.predict(ex) == ey[None, :]).mean(axis=1)
    return {"accuracy": float(per_party.mean()), "epsilon": math.inf, "released": 0, "noise": "none"}


def _dpsgd_plan(records: int, group: str = "dpsgd") -> tuple[float, int, float]:
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
    q, rounds, _ = _dpsgd_plan(len(y))
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


def rho_for(epsilon: float) -> float:
    """The largest zCDP ρ (to 0.1 %) of one release whose (ε, δ) stays within ``epsilon``."""
    return 1.0 / calibrate(
        lambda s: epsilon_from_zcdp(1.0 / s, delta=DELTA)[0], target=epsilon, low=1e-3, high=1e6
    )


def dppl(
    parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, *, epsilon: float, seed: int
) -> dict[str, Any]:
    """DP prototypes: ρ calibrated to ε by the zCDP conversion, one release, nearest prototype."""
    h = HYPER["dppl"]
    rho = rho_for(epsilon)
    mechanism = DPPrototypes(
        classes=10, dim=parties[0].features.shape[1], rho=rho, count_share=h["count_share"]
    )
    sums, counts = run_prototypes(parties, mechanism=mechanism)
    return {
        "accuracy": accuracy(nearest_prototype(ex, sums, counts, metric=h["metric"]), ey),
        "epsilon": epsilon_from_zcdp(mechanism.zcdp, delta=DELTA)[0],
        "released": 1,
        "noise": f"ρ={mechanism.zcdp:.4g} σ={mechanism.sigma_sum:.0f} ({mechanism.fixed_point.bits} bits)",
    }


def _query_images(args: argparse.Namespace, h: dict[str, Any]) -> np.ndarray:
    """The synthetic query stream of a method (uint8, the dataset's image size)."""
    from capc_common.synth import generate

    side = 8 if args.dataset == "digits" else 28
    return generate(h["generator"], seed=1, start=0, count=h["queries"], height=side, width=side, channels=1)


def _query_features(args: argparse.Namespace, group: str = "knn") -> np.ndarray:
    """Features of a method's synthetic image stream (per example, like the parties'), cached; raw pixels
    for the digits proxy."""
    h = HYPER[group]
    if args.dataset == "digits":
        return normalise(_query_images(args, h).reshape(h["queries"], -1).astype(np.float32))
    from capc_common.learn.featurizers import BackboneFeaturizer
    from capc_common.models import default_backbone, load_backbone

    fz = BackboneFeaturizer(load_backbone(default_backbone(28, 28, 1)))
    key = {
        "kind": "per-example-queries",
        "map": fz.sha256,
        "generator": h["generator"],
        "count": h["queries"],
    }
    cache = FeatureCache(args.cache_dir)
    return normalise(
        cache.get_or_compute(key, lambda: fz.extract(_query_images(args, h), bn_batch=64, mode="running"))
    )


def dppl_public(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    candidates: np.ndarray,
) -> dict[str, Any]:
    """DPPL-Public: each selection's ε calibrated so the ``per_class`` peeled selections cost ε in all."""
    from capc_common.mechanisms import PublicPrototypes
    from capc_common.mechanisms.central import run_public_prototypes
    from capc_common.privacy.analysis import rdp_pure_dp

    h = HYPER["dppl_public"]

    def eps_of(inverse: float) -> float:
        rdp = h["per_class"] * rdp_pure_dp(ORDERS, epsilon=1.0 / inverse, bounded_range=True)
        return epsilon_from_rdp(ORDERS, rdp, delta=DELTA)[0]

    per_selection = 1.0 / calibrate(eps_of, target=epsilon, low=1e-3, high=1e4)
    mechanism = PublicPrototypes(
        classes=10,
        candidates=candidates,
        epsilon=per_selection,
        per_class=h["per_class"],
        similarity_range=(h["d_min"], h["d_max"]),
    )
    chosen = run_public_prototypes(parties, mechanism=mechanism)
    return {
        "accuracy": accuracy(mechanism.predict(ex, chosen, rule=h["rule"]), ey),
        "epsilon": epsilon_from_rdp(ORDERS, mechanism.release_rdp(ORDERS), delta=DELTA)[0],
        "released": int(chosen.size),
        "noise": f"ε per selection {per_selection:.4g} × {h['per_class']} per class, {len(candidates)} "
        f"{h['generator']} candidates",
    }


def dppl_public_votes(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    candidates: np.ndarray,
) -> dict[str, Any]:
    """DPPL-Public by noisy votes: ρ calibrated to ε by the zCDP conversion, one release, top-K per class."""
    from capc_common.mechanisms import PublicPrototypeVotes
    from capc_common.mechanisms.central import run_public_prototype_votes

    h = HYPER["dppl_public"]
    rho = rho_for(epsilon)
    mechanism = PublicPrototypeVotes(
        classes=10, candidates=candidates, rho=rho, per_class=HYPER["dppl_public_votes"]["per_class"]
    )
    total = run_public_prototype_votes(parties, mechanism=mechanism)
    return {
        "accuracy": accuracy(mechanism.predict(ex, total), ey),
        "epsilon": epsilon_from_zcdp(mechanism.zcdp, delta=DELTA)[0],
        "released": 1,
        "noise": f"ρ={mechanism.zcdp:.4g} σ={mechanism.sigma:.3g}, top {mechanism.per_class} of "
        f"{len(candidates)} {h['generator']} candidates per class, count-weighted",
    }


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


_CAPC_TEACHERS: dict[str, Any] = {}


def _capc(
    parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, *, epsilon: float, seed: int, greedy: bool
) -> dict[str, Any]:
    """CaPC in plaintext (:mod:`capc_common.mechanisms.capc`), the querying parties' mean accuracy.

    Greedy is computed for every party as the one greedy querier (ten alternative runs, each costing ε,
    done in one pass so the teachers are trained once) and averaged, like fair.
    """
    from capc_common.learn.heads import HeadRecipe
    from capc_common.mechanisms.capc import capc_epsilon, capc_mechanism, capc_teachers, run_capc

    h = HYPER["capc"]
    recipe = HeadRecipe(**HYPER["local"])
    if _CAPC_TEACHERS.get("parties") is not parties:  # the same parties for every ε and split: train once
        _CAPC_TEACHERS.update(
            parties=parties,
            heads=capc_teachers(parties, per_party=h["teachers_per_party"], classes=10, recipe=recipe),
        )
    budget = h["budget_queries"]
    mechanism = capc_mechanism(
        classes=10,
        teachers=(len(parties) - 1) * h["teachers_per_party"],
        budget_queries=budget,
        epsilon=epsilon,
        delta=DELTA,
        orders=ORDERS,
        threshold_share=h["threshold_share"],
        sigma1_ratio=h["sigma1_ratio"],
    )
    result = run_capc(
        parties,
        mechanism=mechanism,
        queriers=range(len(parties)),
        queries_per_querier=budget if greedy else budget // (len(parties) - 1),
        teachers_per_party=h["teachers_per_party"],
        recipe=recipe,
        seed=seed,
        teachers=_CAPC_TEACHERS["heads"],
    )
    per_party = (result.heads.predict(ex) == ey[None, :]).mean(axis=1)
    return {
        "accuracy": float(per_party.mean()),
        "epsilon": capc_epsilon(mechanism, queries=budget, orders=ORDERS, delta=DELTA),
        "released": int(np.mean(result.answered)),
        "noise": f"T={mechanism.threshold:g} σ1={mechanism.sigma1:.1f} σ2={mechanism.sigma2:.1f}, "
        f"{np.mean(result.answered):.0f}/{np.mean(result.queries):.0f} answered per querier, "
        f"label accuracy {np.nanmean(result.label_accuracy):.3f}",
    }


def capc_fair(parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, **kw: Any) -> dict[str, Any]:
    """CaPC, fair: every party queries, the budget split evenly."""
    return _capc(parties, ex, ey, greedy=False, **kw)


def capc_greedy(parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, **kw: Any) -> dict[str, Any]:
    """CaPC, greedy: one party takes the whole budget (the upper bound), averaged over which party."""
    return _capc(parties, ex, ey, greedy=True, **kw)


def _pooled_images(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The raw images behind :func:`load_features`' rows, same order and split: ``(train images, labels,
    evaluation images, labels)`` as tensors for the end-to-end CNN."""
    import torch

    from capc_common.data import load_dataset

    train, test = load_dataset(args.dataset, split="train"), load_dataset(args.dataset, split="test")
    tx, ty = train.images[: args.train_limit], train.labels[: args.train_limit]
    ex, ey = test.images[: args.test_limit], test.labels[: args.test_limit]
    if args.evaluate_on == "validation":
        cut = len(ty) - args.validation
        tx, ty, ex, ey = tx[:cut], ty[:cut], tx[cut:], ty[cut:]
    as_labels = lambda v: torch.from_numpy(np.array(v, dtype=np.int64))  # noqa: E731  (a writable copy)
    return as_tensor_images(tx), as_labels(ty), as_tensor_images(ex), as_labels(ey)


def cnn_dpsgd(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    images: tuple[Any, Any, Any, Any],
) -> dict[str, Any]:
    """A small CNN trained end to end on the pooled images by Opacus DP-SGD (no backbone: the Tramèr & Boneh
    end-to-end anchor). The parties' union is the whole pooled set, so the partition cannot matter."""
    import torch

    h = HYPER["cnn"]
    x, y, test_x, test_y = images
    if len(y) != sum(len(p.labels) for p in parties):
        raise ValueError("the pooled images must be exactly the parties' records")
    torch.manual_seed(seed)
    model = small_cnn(x.shape[2], x.shape[1])
    q, steps, _ = _dpsgd_plan(len(y), "cnn")
    z, spent = opacus_fit(
        model, x, y, h, epsilon=epsilon, delta=DELTA, sampling_rate=q, steps=steps, seed=seed
    )
    return {
        "accuracy": accuracy(predict(model, test_x), test_y.numpy()),
        "epsilon": spent,
        "released": steps,
        "noise": f"z={z:.3f} (continuous), {sum(p.numel() for p in model.parameters())} parameters",
    }


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


def _prompate_data(args: argparse.Namespace) -> dict[str, Any]:
    """What Prom-PATE needs besides the parties: the training images (row for row with the parties'
    features), the query images, and the student's features of the queries and of the evaluation images.

    The student is the library's student as ``capc dietpate run`` uses it: a head on the shared backbone
    with BatchNorm *current statistics* (chunks of 64), the regime the teachers vote in. This choice was
    made after a first test-set run with the other methods' running-statistics features, not on
    validation; docs/mechanisms.md reports both runs (neither is useful: 10–26 %).
    """
    from capc_common.data import load_dataset
    from capc_common.models import default_backbone, extract_features, load_backbone

    h = HYPER["prompate"]
    images = load_dataset(args.dataset, split="train").images[: args.train_limit]
    if args.evaluate_on == "validation":
        cut = len(images) - args.validation
        images, evaluation = images[:cut], images[cut:]
    else:
        evaluation = load_dataset(args.dataset, split="test").images[: args.test_limit]
    side = images.shape[1]
    backbone = load_backbone(default_backbone(side, side, 1))
    queries = _query_images(args, h)
    return {
        "images": images,
        "queries": (extract_features(backbone, queries, bn_batch=64), queries),
        "evaluation": extract_features(backbone, evaluation, bn_batch=64),
        "cache": FeatureCache(args.cache_dir),
    }


def prom_pate(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    images: np.ndarray,
    queries: tuple[np.ndarray, np.ndarray],
    evaluation: np.ndarray,
    cache: FeatureCache,
) -> dict[str, Any]:
    """Prompted teachers on every party's shards, Confident-GNMax within the budget, the library's student.

    The teachers' votes are a deterministic function of the shards, the recipe and the queries: they are
    cached (``--cache-dir``) and answered afresh (new noise) at every ε.
    """
    import hashlib

    from capc_common.dietpate.cache import digest_indices
    from capc_common.learn.prompts import PromptRecipe, train_prompted_teachers
    from capc_common.mechanisms import ConfidentGNMax
    from capc_common.mechanisms.prompate import release_and_learn
    from capc_common.models import default_backbone, load_backbone

    h = HYPER["prompate"]
    k, size = h["teachers_per_party"], h["shard"]
    shards, labels = [], np.full(len(images), -1, np.int64)
    for p in parties:
        if p.index is None or len(p.index) < k * size:
            raise SystemExit(f"{p.name} holds fewer than {k}×{size} records; lower prompate.shard")
        shards += [p.index[i * size : (i + 1) * size] for i in range(k)]
        labels[p.index] = p.labels
    query_features, query_images = queries
    side = images.shape[1]
    backbone = load_backbone(default_backbone(side, side, 1))
    recipe = PromptRecipe(kind=h["kind"], width=h["width"], steps=h["steps"], prompt_lr=h["prompt_lr"])
    n = len(shards)
    timing = {"per_teacher": math.nan, "votes": math.nan}

    def votes() -> np.ndarray:
        t0 = time.perf_counter()
        teachers = train_prompted_teachers(backbone, images, labels, shards, classes=10, recipe=recipe)
        timing["per_teacher"] = (time.perf_counter() - t0) / n
        t1 = time.perf_counter()
        hist = teachers.histograms(query_images)
        timing["votes"] = time.perf_counter() - t1
        log(f"prom-pate: {n} teachers, {timing['per_teacher']:.2f} s each, votes {timing['votes']:.0f} s")
        return hist

    key = {
        "kind": "prompate-votes",
        "map": backbone.sha256,
        "data": hashlib.sha256(images[np.concatenate(shards)].tobytes() + labels.tobytes()).hexdigest(),
        "shards": digest_indices(np.concatenate([*shards, [n]])),
        "recipe": recipe.describe(),
        "queries": {"generator": h["generator"], "count": h["queries"]},
    }
    hist = cache.get_or_compute(key, votes)
    mechanism = ConfidentGNMax(
        classes=10, teachers=n, threshold=h["threshold"] * n, sigma1=h["sigma1"] * n, sigma2=h["sigma2"] * n
    )
    result = release_and_learn(
        hist, student_features=query_features, mechanism=mechanism, epsilon=epsilon, delta=DELTA, seed=seed
    )
    a = result.answers
    return {
        "accuracy": 0.0 if result.student is None else accuracy(result.student.predict(evaluation), ey),
        "epsilon": a.epsilon,
        "released": a.answered,
        "noise": f"T={mechanism.threshold:g} σ1={mechanism.sigma1:g} σ2={mechanism.sigma2:g}, {n} teachers "
        f"({timing['per_teacher']:.2f} s each, votes {timing['votes']:.0f} s; nan: cached) {a.queries} asked",
    }


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "local-only": local_only,
    "secagg-dpsgd": secagg_dpsgd,
    "central-dpsgd": central_dpsgd,
    "dppl": dppl,
    "dppl-public": dppl_public,
    "dppl-public-votes": dppl_public_votes,
    "private-knn": private_knn,
    "prom-pate": prom_pate,
    "capc-fair": capc_fair,
    "capc-greedy": capc_greedy,
    "cnn-dpsgd": cnn_dpsgd,
    "dp-fedavg": dp_fedavg_flower,
}


# ---------------------------------------------------------------------------------------------- outputs
def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± std of accuracy over seeds for each (method, partition, ε target)."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["partition"], float(r["epsilon_target"])), []).append(r)
    table = []
    for (method, part, eps), rs in sorted(
        groups.items(), key=lambda kv: (kv[0][1], METHODS.index(kv[0][0]), kv[0][2])
    ):
        acc = np.array([float(r["accuracy"]) for r in rs])
        table.append(
            {
                "method": method,
                "partition": part,
                "epsilon_target": eps,
                "seeds": len(rs),
                "accuracy_mean": float(acc.mean()),
                "accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "released": int(rs[0]["released"]),
                "seconds_mean": float(np.mean([float(r["seconds"]) for r in rs])),
            }
        )
    return table


def write_markdown(table: list[dict[str, Any]], path: Path, epsilons: list[float]) -> None:
    """One table per partition: methods × ε, accuracy mean ± std (%)."""
    lines = []
    for part in sorted({t["partition"] for t in table}):
        lines += [
            f"**{part}**",
            "",
            "| method | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " | releases | s/run |",
        ]
        lines.append("|---" * (len(epsilons) + 3) + "|")
        for method in METHODS:
            cells = {
                t["epsilon_target"]: t for t in table if t["method"] == method and t["partition"] == part
            }
            if not cells:
                continue
            row = [
                f"{100 * cells[e]['accuracy_mean']:.1f} ± {100 * cells[e]['accuracy_std']:.1f}"
                if e in cells
                else "–"
                for e in epsilons
            ]
            any_cell = next(iter(cells.values()))
            lines.append(
                f"| {method} | "
                + " | ".join(row)
                + f" | {any_cell['released']} | {any_cell['seconds_mean']:.0f} |"
            )
        lines.append("")
    path.write_text("\n".join(lines))


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """Accuracy against ε, one line per method (mean ± std over seeds), one panel per partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = sorted({t["partition"] for t in table})
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.2), squeeze=False, sharey=True)
    for ax, part in zip(axes[0], parts, strict=True):
        for method in METHODS:
            pts = sorted(
                (t for t in table if t["method"] == method and t["partition"] == part),
                key=lambda t: t["epsilon_target"],
            )
            if not pts:
                continue
            e = [t["epsilon_target"] for t in pts]
            m = np.array([100 * t["accuracy_mean"] for t in pts])
            s = np.array([100 * t["accuracy_std"] for t in pts])
            style = "--" if method == "local-only" else "-o"
            colour = plt.get_cmap("tab20")(METHODS.index(method) % 20)  # one colour per method (>10 methods)
            ax.plot(e, m, style, label=method, color=colour)
            ax.fill_between(e, m - s, m + s, alpha=0.2, color=colour)
        ax.set_xscale("log")
        ax.set_xlabel("ε (δ = 1e-5)")
        ax.set_title(f"partition: {part}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def setting_of(args: argparse.Namespace) -> dict[str, Any]:
    """Everything besides (method, partition, ε, seed) that a row's figure depends on."""
    keys = ("dataset", "train_limit", "test_limit", "evaluate_on", "validation", "parties")
    return {**{k: getattr(args, k) for k in keys}, "hyper": HYPER}


def setting_differences(recorded: dict[str, Any], current: dict[str, Any], methods: set[str]) -> list[str]:
    """What differs between two recorded settings that rows of ``methods`` depend on: every key but the
    hyper-parameters, and the hyper-parameter groups those methods read (:data:`USES`)."""
    unknown = sorted(methods - USES.keys())
    if unknown:
        raise SystemExit(f"rows of unknown methods {unknown}: this benchmark runs {sorted(USES)}")
    groups = {g for m in methods for g in USES[m]}
    return sorted(
        [k for k in current.keys() | recorded.keys() if k != "hyper" and recorded.get(k) != current.get(k)]
        + [f"hyper.{g}" for g in groups if recorded.get("hyper", {}).get(g) != current["hyper"][g]]
    )


def check_setting(args: argparse.Namespace, csv_path: Path) -> None:
    """Refuse to resume a CSV written under another setting (rows are keyed by method, partition, ε and seed
    only, so a validation run or a ``--set`` sweep would otherwise be skipped as done, or its rows mixed with
    the test figures); record the setting next to the CSV. Hyper-parameters of methods the CSV holds no row of
    may differ: no row depends on them.

    Raises:
        SystemExit: the CSV's recorded setting differs from this run's in what its rows depend on.
    """
    path = csv_path.with_suffix(".setting.json")
    current = json.loads(json.dumps(setting_of(args)))
    if path.exists():
        methods: set[str] = set()
        if csv_path.exists():
            with csv_path.open() as handle:
                methods = {r["method"] for r in csv.DictReader(handle)}
        changed = setting_differences(json.loads(path.read_text()), current, methods)
        if changed:
            raise SystemExit(
                f"{csv_path} holds rows of another setting (differs in {changed}; recorded in {path}): "
                "give this run its own --out or --name"
            )
    elif csv_path.exists() and csv_path.stat().st_size:
        log(f"note: {csv_path} has no recorded setting; recording this run's in {path}")
    path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")


def merge_rows(args: argparse.Namespace, rows: list[dict[str, Any]], sources: list[Path]) -> int:
    """Append the rows of other runs' CSVs (cells not in ``rows`` yet), refusing a run whose recorded setting
    differs from this one in anything its methods depend on: the table gathers runs made at different times
    (one method or seed per command), never rows of another setting.

    Returns:
        How many rows were added to ``rows`` (and to the CSV at ``--out``/``--name``).

    Raises:
        SystemExit: a source has no recorded setting, or one that differs.
    """
    current = json.loads(json.dumps(setting_of(args)))
    done = {(r["method"], r["partition"], float(r["epsilon_target"]), int(r["seed"])) for r in rows}
    added = []
    for source in sources:
        recorded_path = source.with_suffix(".setting.json")
        if not recorded_path.exists():
            raise SystemExit(f"{source} has no recorded setting ({recorded_path}): cannot check what it ran")
        recorded = json.loads(recorded_path.read_text())
        with source.open() as handle:
            incoming = list(csv.DictReader(handle))
        differs = setting_differences(recorded, current, {r["method"] for r in incoming})
        if differs:
            raise SystemExit(f"{source} was run under another setting (differs in {differs}): not merged")
        for r in incoming:
            key = (r["method"], r["partition"], float(r["epsilon_target"]), int(r["seed"]))
            if key not in done:
                done.add(key)
                added.append({k: r[k] for k in FIELDS})
    csv_path = args.out / f"{args.name}.csv"
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(added)
    rows.extend(added)
    return len(added)


def report(
    args: argparse.Namespace, rows: list[dict[str, Any]], started: float, *, images: tuple[int, int]
) -> dict[str, Any]:
    """Write the table (MD) and plot (PNG) of every row and return the JSON result; ``images`` are the
    training and evaluation set sizes."""
    # local-only is not private: show its one value at every ε.
    expanded = []
    for r in rows:
        if r["method"] == "local-only":
            expanded += [{**r, "epsilon_target": e} for e in args.epsilons]
        else:
            expanded.append(r)
    table = summarise(expanded)
    write_markdown(table, args.out / f"{args.name}.md", sorted(args.epsilons))
    plot(table, args.out / f"{args.name}.png")
    result = {
        "setting": {
            "dataset": args.dataset,
            "train_images": images[0],
            "evaluation_images": images[1],
            "evaluate_on": args.evaluate_on,
            "parties": args.parties,
            "delta": DELTA,
            "hyper": HYPER,
        },
        "rows": len(rows),
        "table": table,
        "seconds": round(time.perf_counter() - started, 1),
        "outputs": [str(args.out / f"{args.name}.{ext}") for ext in ("csv", "md", "png")],
    }
    if args.format == "json":
        print(json.dumps(result, default=float))
    else:
        print((args.out / f"{args.name}.md").read_text())
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the grid (skipping rows already in the CSV) and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--partitions", nargs="+", choices=("iid", "imbalanced"), default=["iid", "imbalanced"]
    )
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--dataset", choices=("fashion-mnist", "digits"), default="fashion-mnist")
    parser.add_argument("--train-limit", type=int, default=20_000)
    parser.add_argument("--test-limit", type=int, default=4_000)
    parser.add_argument("--evaluate-on", choices=("test", "validation"), default="test")
    parser.add_argument("--validation", type=int, default=2_000)
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "runs" / "cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="mechanisms", help="output file stem")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="GROUP.KEY=VALUE",
        help="override a hyper-parameter (validation sweeps only), e.g. dpsgd.learning_rate=0.5",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=[],
        metavar="CSV",
        help="run nothing: add these runs' rows (same setting) to --out/--name and redraw its table and plot",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    for item in args.set:
        name, _, value = item.partition("=")
        group, _, key = name.partition(".")
        if group not in HYPER or key not in HYPER[group]:
            parser.error(f"unknown hyper-parameter {name!r}; known: {sorted(HYPER)} with their keys")
        HYPER[group][key] = type(HYPER[group][key])(value)

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{args.name}.csv"
    check_setting(args, csv_path)
    rows: list[dict[str, Any]] = []
    if csv_path.exists():
        with csv_path.open() as handle:
            rows = list(csv.DictReader(handle))
    started = time.perf_counter()
    if args.merge:
        log(f"merged {merge_rows(args, rows, args.merge)} rows into {csv_path}")
        validation = args.evaluate_on == "validation"
        images = (
            args.train_limit - (args.validation if validation else 0),
            args.validation if validation else args.test_limit,
        )
        return report(args, rows, started, images=images)
    done = {(r["method"], r["partition"], float(r["epsilon_target"]), int(r["seed"])) for r in rows}
    tx, ty, ex, ey = load_features(args)
    log(f"features: train {tx.shape}, evaluation {ex.shape} ({args.evaluate_on})")
    extra: dict[str, dict[str, Any]] = {m: {} for m in METHODS}
    if "private-knn" in args.methods:
        extra["private-knn"]["queries"] = _query_features(args)
    for method in ("dppl-public", "dppl-public-votes"):
        if method in args.methods:
            extra[method]["candidates"] = _query_features(args, "dppl_public")
    if "prom-pate" in args.methods:
        extra["prom-pate"] = _prompate_data(args)
    if "cnn-dpsgd" in args.methods:
        extra["cnn-dpsgd"]["images"] = _pooled_images(args)
    if "dp-fedavg" in args.methods:
        extra["dp-fedavg"]["python"] = flower_python(args.cache_dir)
    for part in args.partitions:
        for seed in args.seeds:
            parties = parties_of(tx, ty, scheme=part, parties=args.parties, seed=seed)
            for method in args.methods:
                targets = [max(args.epsilons)] if method == "local-only" else args.epsilons
                for eps in targets:
                    key = (method, part, float(eps), seed)
                    if key in done:
                        continue
                    t0 = time.perf_counter()
                    out = RUNNERS[method](parties, ex, ey, epsilon=eps, seed=seed, **extra[method])
                    row = {
                        "method": method,
                        "partition": part,
                        "epsilon_target": eps,
                        "seed": seed,
                        **out,
                        "seconds": round(time.perf_counter() - t0, 2),
                    }
                    log(
                        f"{method:14s} {part:10s} ε {eps:<5g} seed {seed}: accuracy {out['accuracy']:.4f} "
                        f"({row['seconds']} s, {out['noise']})"
                    )
                    rows.append(row)
                    new = not csv_path.exists()
                    with csv_path.open("a", newline="") as handle:
                        writer = csv.DictWriter(handle, fieldnames=FIELDS)
                        if new:
                            writer.writeheader()
                        writer.writerow({k: row[k] for k in FIELDS})
    return report(args, rows, started, images=(len(ty), len(ey)))


if __name__ == "__main__":
    main()
