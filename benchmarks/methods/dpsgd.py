"""DP-SGD of the linear head on the frozen per-example features: this engine's secure-aggregation DP-SGD
(``secagg-dpsgd``) and the central Opacus baseline on the pooled features (``central-dpsgd``)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from capc_common.mechanisms import SecureDPSGD, calibrate
from capc_common.mechanisms.central import PartyData, predict_head, run_secure_dpsgd
from capc_common.mechanisms.training import DPSGDTrainer, Recipe
from capc_common.privacy import SystemNoise
from capc_common.privacy.analysis import (
    epsilon_from_rdp,
    rdp_subsampled_discrete_gaussian,
    rdp_subsampled_gaussian,
)
from methods.common import DELTA, HYPER, ORDERS, Method, accuracy


def dpsgd_plan(records: int, group: str = "dpsgd") -> tuple[float, int, float]:
    """``(q, rounds, expected batch)`` of a DP-SGD recipe (``HYPER[group]``) for ``records`` records."""
    h = HYPER[group]
    q = min(1.0, h["batch"] / records)
    return q, max(1, round(h["epochs"] / q)), q * records


def public_basis_for(args: argparse.Namespace) -> dict[str, Any]:
    """What the recipe needs besides the parties: the public basis (``HYPER["secagg"]["projection"]``
    directions of the benchmark's per-example features on synthetic images), computed once and cached; raw
    pixels for the digits proxy."""
    from capc_common.dietpate.cache import FeatureCache
    from capc_common.mechanisms.basis import BasisSpec, public_basis

    spec = BasisSpec(dim=HYPER["secagg"]["projection"])
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
    """Central DP-SGD on the pooled features, given the same recipe and tuning as the federation's (the
    reference, not a straw man): the public basis, a statistics release, the same step — with what only a
    trusted curator can do, Poisson sampling (batch ``HYPER["dpsgd"]["batch"]``) of continuous Gaussian noise,
    accounted by Mironov et al.'s exact subsampled-Gaussian RDP (every release, statistics included)."""
    import secrets

    h = HYPER["dpsgd"]
    x = np.concatenate([p.features for p in parties])
    y = np.concatenate([p.labels for p in parties])
    q, steps, _ = dpsgd_plan(len(y))
    recipe = Recipe(
        rounds=steps,
        optimizer=h["optimizer"],
        learning_rate=h["learning_rate"],
        momentum=h["momentum"],
        adam_eps=h["adam_eps"],
        variance_floor=HYPER["secagg"]["variance_floor"],
        step_noise=h.get("step_noise"),
        unit_variance=h.get("unit_variance", False),
    )

    def eps_of(z: float) -> float:
        rdp = rdp_subsampled_gaussian(ORDERS, sampling_rate=q, noise_multiplier=z)
        return epsilon_from_rdp(ORDERS, recipe.releases * rdp, delta=DELTA)[0]

    z = calibrate(eps_of, target=epsilon, low=0.3)
    use = basis if HYPER["secagg"]["projection"] else None
    k = x.shape[1] if use is None else use.shape[1]
    mechanism = SecureDPSGD(classes=10, dim=k, clip=h["clip"], noise_multiplier=z, sampling_rate=q)
    trainer = DPSGDTrainer(mechanism, recipe, basis=use)
    prepared = trainer.prepare(x)
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
        "epsilon": eps_of(z),
        "released": trainer.rounds,
        "noise": f"z={z:.3f} q={q:.4f} (continuous)",
    }


SECAGG_DPSGD = Method("secagg-dpsgd", secagg_dpsgd, ("secagg",), public_basis_for)
CENTRAL_DPSGD = Method("central-dpsgd", central_dpsgd, ("dpsgd", "secagg"), public_basis_for)
