"""Each party alone: its own (non-private) logistic head, the number a hospital compares against."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from capc_common.mechanisms.central import PartyData
from methods.common import HYPER, Method


def per_party_accuracy(parties: list[PartyData], ex: np.ndarray, ey: np.ndarray) -> np.ndarray:
    """Each party's own (non-private) logistic head's accuracy on ``(ex, ey)``, batched with the library's
    head trainer (one head per party, each fitted on its own records only)."""
    from capc_common.learn.heads import HeadRecipe, train_heads

    x = np.concatenate([p.features for p in parties])
    y = np.concatenate([p.labels for p in parties])
    owners = np.repeat(np.arange(len(parties)), [len(p.labels) for p in parties])
    heads = train_heads(
        x, y, owners=owners, heads=len(parties), classes=10, recipe=HeadRecipe(**HYPER["local"])
    )
    return np.asarray((heads.predict(ex) == ey[None, :]).mean(axis=1))


def local_only(parties: list[PartyData], ex: np.ndarray, ey: np.ndarray, **_: Any) -> dict[str, Any]:
    """Each party's own (non-private) logistic head, the mean over parties."""
    per_party = per_party_accuracy(parties, ex, ey)
    return {"accuracy": float(per_party.mean()), "epsilon": math.inf, "released": 0, "noise": "none"}


LOCAL_ONLY = Method("local-only", local_only, ("local",))
