"""DP-SGD of the linear head on the frozen per-example features: this engine's secure-aggregation DP-SGD
(``secagg-dpsgd``) and the central Opacus baseline on the pooled features (``central-dpsgd``)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from _baselines import opacus_fit, predict

from capc_common.mechanisms import SecureDPSGD, calibrate
from capc_common.mechanisms.central import PartyData, run_secure_dpsgd
from capc_common.mechanisms.training import DPSGDTrainer, Recipe
from capc_common.privacy.analysis import epsilon_from_rdp, rdp_subsampled_discrete_gaussian
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
    dim: int, basis: np.ndarray | None, *, epsilon: float, group: str = "secagg"
) -> tuple[DPSGDTrainer, float]:
    """The recipe of ``HYPER[group]`` over ``dim``-dimensional features, its noise calibrated so all its
    releases (statistics and gradient rounds, full batch) cost ``epsilon``; and the ε they cost."""
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
    )
    q = h["sampling_rate"]

    def eps_of(z: float) -> float:  # SecureDPSGD.release_rdp, without building a head for every z
        rdp = rdp_subsampled_discrete_gaussian(ORDERS, sampling_rate=q, noise_multiplier=z)
        return epsilon_from_rdp(ORDERS, recipe.releases * rdp, delta=DELTA)[0]

    z = calibrate(eps_of, target=epsilon)
    k = dim if basis is None else basis.shape[1]
    mechanism = SecureDPSGD(classes=10, dim=k, clip=h["clip"], noise_multiplier=z, sampling_rate=q)
    return DPSGDTrainer(mechanism, recipe, basis=basis), eps_of(z)


def secagg_dpsgd(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    basis: np.ndarray | None = None,
) -> dict[str, Any]:
    """The engine's secure-aggregation DP-SGD by its recipe, noise calibrated with its own accountant."""
    use = basis if HYPER["secagg"]["projection"] else None
    trainer, spent = recipe_trainer(parties[0].features.shape[1], use, epsilon=epsilon)
    result = run_secure_dpsgd(parties, trainer=trainer)
    m = trainer.mechanism
    return {
        "accuracy": accuracy(result.predict(ex), ey),
        "epsilon": spent,
        "released": result.rounds,
        "noise": f"z={m.noise_multiplier:.3f} σ={m.sigma:.0f} ({m.fixed_point.bits} bits)",
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


SECAGG_DPSGD = Method("secagg-dpsgd", secagg_dpsgd, ("secagg",), public_basis_for)
CENTRAL_DPSGD = Method("central-dpsgd", central_dpsgd, ("dpsgd",))
