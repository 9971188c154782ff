"""DP-SGD of the linear head on the frozen per-example features: this engine's secure-aggregation DP-SGD
(``secagg-dpsgd``) and the central Opacus baseline on the pooled features (``central-dpsgd``)."""

from __future__ import annotations

import argparse
import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from capc_common.mechanisms import SecureDPSGD, calibrate, normalise
from capc_common.mechanisms.central import PartyData, predict_head, run_secure_dpsgd
from capc_common.mechanisms.training import DPSGDTrainer, FeatureMap, Recipe
from capc_common.privacy import SystemNoise
from capc_common.privacy.analysis import (
    epsilon_from_rdp,
    rdp_subsampled_discrete_gaussian,
)
from methods.common import DELTA, HYPER, ORDERS, Method, accuracy, gaussian_noise_for


def dpsgd_plan(records: int, group: str = "dpsgd") -> tuple[float, int, float]:
    """``(q, rounds, expected batch)`` of a DP-SGD recipe (``HYPER[group]``) for ``records`` records: the
    Poisson rate is the group's ``sampling_rate`` (a share of the records, so a setting tuned on one
    consortium means the same passes over the data on another) or its published ``batch`` over the
    records."""
    h = HYPER[group]
    q = min(1.0, h["sampling_rate"] if "sampling_rate" in h else h["batch"] / records)
    return q, max(1, round(h["epochs"] / q)), q * records


def public_basis_for(args: argparse.Namespace, group: str = "secagg") -> dict[str, Any]:
    """What a recipe of ``HYPER[group]`` needs besides the parties: the public basis (its ``projection``
    directions of the benchmark's per-example features on synthetic images; None when 0), computed once and
    cached; raw pixels for the digits proxy."""
    from capc_common.dietpate.cache import FeatureCache
    from capc_common.mechanisms.basis import BasisSpec, public_basis

    if not HYPER[group]["projection"]:
        return {"basis": None}
    spec = BasisSpec(dim=HYPER[group]["projection"])
    side = 8 if args.dataset == "digits" else 28
    if args.dataset == "digits":
        featurize: Any = lambda images: images.reshape(len(images), -1).astype(np.float32)  # noqa: E731
        mapping = "pixels"
    else:
        from capc_common.learn.featurizers import BackboneFeaturizer
        from capc_common.models import default_backbone, load_backbone

        fz = BackboneFeaturizer(load_backbone(default_backbone(28, 28, 1)))
        featurize, mapping = (lambda images: fz.extract(images, bn_batch=64, mode="running")), fz.sha256
    key = {"kind": "public-basis", "map": mapping, "side": side, **spec.describe()}
    cache = FeatureCache(args.cache_dir)
    return {
        "basis": cache.get_or_compute(
            key, lambda: public_basis(spec, featurize=featurize, shape=(side, side, 1))
        )
    }


#: Records already projected, oldest first: ``(id(features), id(basis)) → (features, basis, projected)``.
_PROJECTED: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
#: The most bytes of projected records kept (a full layout's 45,000 records on 1,024 directions: 184 MB).
_PROJECTED_BYTES = 1 << 30


def projected(features: np.ndarray, basis: np.ndarray | None) -> np.ndarray:
    """``features`` L2-normalised and on ``basis`` (``FeatureMap.project``, held in float32, the product's own
    precision: the same values), read-only; only normalised without a basis.

    Computed once per pair of objects and reused while this process holds them (the entry holds both, so
    their ids are never another array's), up to 1 GiB, the oldest dropped first: the projection is a run's
    costliest step (45,000 records of 4,225 features onto 1,024 directions, 390 GFLOP), and a validation sweep
    or the joining benchmark's passes over ε run the same parties many times.
    """
    if basis is None:
        return normalise(features)
    key = (id(features), id(basis))
    hit = _PROJECTED.get(key)
    if hit is None or hit[0] is not features or hit[1] is not basis:
        k = basis.shape[1]
        out = FeatureMap(basis, np.zeros(k), np.ones(k)).project(features).astype(np.float32)
        out.setflags(write=False)
        _PROJECTED[key] = hit = (features, basis, out)
        while sum(v[2].nbytes for v in _PROJECTED.values()) > _PROJECTED_BYTES and len(_PROJECTED) > 1:
            _PROJECTED.popitem(last=False)
    return hit[2]


def basis_need(group: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """A method's ``needs``: the public basis of ``HYPER[group]``'s recipe (:func:`public_basis_for`)."""
    return functools.partial(public_basis_for, group=group)


def recipe_trainer(
    dim: int,
    basis: np.ndarray | None,
    *,
    epsilon: float,
    group: str = "secagg",
    noiseless: bool = False,
    classes: int = 10,
) -> tuple[DPSGDTrainer, float]:
    """The recipe of ``HYPER[group]`` over ``dim``-dimensional features, its noise calibrated so all its
    releases (statistics and gradient rounds, full batch) cost ``epsilon``; and the ε they cost.
    ``noiseless``: for sums released without noise, whose step is the cap (no noise for it to follow)."""
    h = HYPER[group]
    recipe = Recipe(
        rounds=h["rounds"],
        statistics=h["statistics"],
        optimizer=h["optimizer"],
        learning_rate=h["learning_rate"],
        momentum=h["momentum"],
        adam_eps=h["adam_eps"],
        variance_floor=h["variance_floor"],
        expected_batch=h.get("expected_batch"),
        step_noise=None if noiseless else h.get("step_noise"),
        unit_variance=h.get("unit_variance", False),
    )
    q = h["sampling_rate"]

    def eps_of(z: float) -> float:  # SecureDPSGD.release_rdp, without building a head for every z
        rdp = rdp_subsampled_discrete_gaussian(ORDERS, sampling_rate=q, noise_multiplier=z)
        return epsilon_from_rdp(ORDERS, recipe.releases * rdp, delta=DELTA)[0]

    z = calibrate(eps_of, target=epsilon)
    k = dim if basis is None else basis.shape[1]
    mechanism = SecureDPSGD(classes=classes, dim=k, clip=h["clip"], noise_multiplier=z, sampling_rate=q)
    return DPSGDTrainer(mechanism, recipe, basis=basis), eps_of(z)


def secagg_dpsgd(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    basis: np.ndarray | None = None,
    classes: int = 10,
) -> dict[str, Any]:
    """The engine's secure-aggregation DP-SGD by its recipe, noise calibrated with its own accountant; the
    published head is returned too (``head``: ``(classes, dim + 1)`` over normalised features)."""
    use = basis if HYPER["secagg"]["projection"] else None
    trainer, spent = recipe_trainer(parties[0].features.shape[1], use, epsilon=epsilon, classes=classes)
    result = run_secure_dpsgd(parties, trainer=trainer)
    m = trainer.mechanism
    return {
        "head": result.weights,
        "accuracy": accuracy(result.predict(ex), ey),
        "epsilon": spent,
        "released": result.rounds,
        "noise": f"z={m.noise_multiplier:.3f} σ={m.sigma:.0f} ({m.fixed_point.bits} bits)",
    }


def central_dpsgd(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    basis: np.ndarray | None = None,
) -> dict[str, Any]:
    """Central DP-SGD on the pooled features with the federation's recipe pieces — the public basis, a
    statistics release, the step that follows the noise — tuned on its own (``HYPER["dpsgd"]``,
    docs/mechanisms.md), with what only a trusted curator can do: Poisson sampling (rate
    ``HYPER["dpsgd"]["sampling_rate"]``) of continuous Gaussian noise, accounted by Mironov et al.'s exact
    subsampled-Gaussian RDP (every release, statistics included)."""
    import secrets

    h = HYPER["dpsgd"]
    y = np.concatenate([p.labels for p in parties])
    q, steps, _ = dpsgd_plan(len(y))
    recipe = Recipe(
        rounds=steps,
        statistics=h["statistics"],
        optimizer=h["optimizer"],
        learning_rate=h["learning_rate"],
        momentum=h["momentum"],
        adam_eps=h["adam_eps"],
        variance_floor=h["variance_floor"],
        expected_batch=q * len(y),
        step_noise=h.get("step_noise"),
        unit_variance=h.get("unit_variance", False),
    )

    z, spent = gaussian_noise_for(q, recipe.releases, epsilon)
    use = basis if h["projection"] else None
    k = parties[0].features.shape[1] if use is None else use.shape[1]
    mechanism = SecureDPSGD(classes=10, dim=k, clip=h["clip"], noise_multiplier=z, sampling_rate=q)
    trainer = DPSGDTrainer(mechanism, recipe, basis=use)
    prepared = np.concatenate([projected(p.features, use) for p in parties]).astype(np.float64)  # prepare()'s
    prepared.setflags(write=False)
    rng = np.random.default_rng(secrets.randbits(128))  # simulation of a curator's noise, not a service's
    sampler = SystemNoise()
    for _ in range(trainer.rounds):
        total = trainer.contribute(trainer.state(), prepared, y, sampler)
        noise = np.rint(rng.normal(0.0, mechanism.sigma, size=total.shape)).astype(np.int64)
        trainer.absorb(
            total + noise
        )  # rounding continuous noise is post-processing of the Gaussian mechanism
    return {
        "accuracy": accuracy(predict_head(trainer.head(), ex), ey),
        "epsilon": spent,
        "released": trainer.rounds,
        "noise": f"z={z:.3f} q={q:.4f} (continuous)",
    }


SECAGG_DPSGD = Method("secagg-dpsgd", secagg_dpsgd, ("secagg",), basis_need("secagg"))
CENTRAL_DPSGD = Method("central-dpsgd", central_dpsgd, ("dpsgd",), basis_need("dpsgd"))
