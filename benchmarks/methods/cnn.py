"""A small CNN trained end to end on the pooled images by Opacus DP-SGD (no backbone: the Tramèr & Boneh
end-to-end anchor, ``_baselines``)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from _baselines import opacus_fit, predict, small_cnn

from capc_common.mechanisms.central import PartyData
from methods.common import DELTA, HYPER, Method, accuracy
from methods.data import pooled_images
from methods.dpsgd import dpsgd_plan


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
    q, steps, _ = dpsgd_plan(len(y), "cnn")
    z, spent = opacus_fit(
        model, x, y, h, epsilon=epsilon, delta=DELTA, sampling_rate=q, steps=steps, seed=seed
    )
    return {
        "accuracy": accuracy(predict(model, test_x), test_y.numpy()),
        "epsilon": spent,
        "released": steps,
        "noise": f"z={z:.3f} (continuous), {sum(p.numel() for p in model.parameters())} parameters",
    }


def _images(args: argparse.Namespace) -> dict[str, Any]:
    return {"images": pooled_images(args)}


CNN_DPSGD = Method("cnn-dpsgd", cnn_dpsgd, ("cnn",), _images)
