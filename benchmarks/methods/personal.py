"""Each party alone and what each party keeps: the joining benchmark's per-party figures.

A party of a layout holds out :func:`~capc_common.learn.personal.holdout_fraction` of its records (by keyed
content hash: :func:`~capc_common.data.holdout_part`, public fraction from the layout's nominal party size);
the federation sees its training part only. Its best model **alone** is
:func:`~capc_common.learn.personal.fit_alone` (the linear heads and the CNN from scratch, chosen on the
holdout, refitted on the whole party) — the strongest per-party baseline, what a hospital really compares
against. Once a federation's student exists, each party **personalises**
(:func:`~capc_common.learn.personal.personalise`) and keeps one of alone, shared, personalised. Every model is
then read once on the test set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from capc_common.data import holdout_part
from capc_common.learn.personal import (
    Alone,
    PersonalRecipe,
    Split,
    fit_alone,
    holdout_fraction,
    personalise,
    predict,
)
from capc_common.mechanisms.central import PartyData

#: The recipe every party uses (the library's default: its grids, its CNN, the keep test's level).
RECIPE = PersonalRecipe()


@dataclass
class Party:
    """One party of a layout: its training part (what the federation sees: ``data``, indices ``rows``) and
    its split for choosing."""

    data: PartyData
    split: Split
    rows: np.ndarray


def split_parties(
    records: list[np.ndarray],
    features: np.ndarray,
    labels: np.ndarray,
    images: np.ndarray,
    *,
    nominal: int,
    seed: int,
) -> tuple[list[Party], float]:
    """Each party's records divided into training part and holdout; the fraction held out."""
    fraction = holdout_fraction(nominal)
    parties = []
    for i, rows in enumerate(records):
        train, held = holdout_part(images[rows], labels[rows], fraction=fraction, seed=seed)
        t, h = rows[train], rows[held]
        if not len(h) or not len(t):  # a tiny party: nothing to choose with; the holdout takes one record
            t, h = rows[1:], rows[:1]
        tx, hx = features[t], features[h]  # one copy each, shared by the federation's view and the split
        split = Split(
            {"per-example": tx, "student": tx, "images": images[t]},
            labels[t],
            {"per-example": hx, "student": hx, "images": images[h]},
            labels[h],
        )
        parties.append(Party(PartyData(f"party-{i}", tx, labels[t], images=images[t]), split, t))
    return parties, fraction


def alone_all(parties: list[Party], *, classes: int, seed: int) -> list[Alone]:
    """Every party's best model alone."""
    return [fit_alone(p.split, classes=classes, recipe=RECIPE, seed=seed) for p in parties]


def test_accuracy(model: Any, ex: np.ndarray, ey: np.ndarray, images: np.ndarray) -> float:
    """A model's accuracy on the test set (features and images)."""
    return float(_correct(model, ex, ey, images).mean())


def _correct(model: Any, ex: np.ndarray, ey: np.ndarray, images: np.ndarray) -> np.ndarray:
    inputs = {"per-example": ex, "student": ex, "images": images}
    return predict(model, inputs) == ey


def mix_accuracy(correct: np.ndarray, ey: np.ndarray, mix: np.ndarray) -> float:
    """Accuracy on the test set reweighted to a party's own class mix (``mix[c]``: the share of class ``c``
    among its records): what the party can expect on examples like its own, the distribution its holdout
    is drawn from. Classes absent from the test set get no weight."""
    per_class = np.asarray([correct[ey == c].mean() if (ey == c).any() else 0.0 for c in range(len(mix))])
    weights = np.where([(ey == c).any() for c in range(len(mix))], mix, 0.0)
    return float((per_class * weights).sum() / weights.sum())


def kept_all(
    parties: list[Party],
    alones: list[Alone],
    head: np.ndarray,
    *,
    classes: int,
    seed: int,
    test: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> list[dict[str, Any]]:
    """For each party against the student ``head``: the test accuracy of alone, shared, personalised and
    kept, on the test set as it is and reweighted to the party's class mix (``_mix``), which it kept, and
    the holdout test behind the choice (gain, wins, losses and the sign test's p-value of each challenger)."""
    ex, ey, images = test
    out = []
    for party, alone in zip(parties, alones, strict=True):
        found = personalise(party.split, classes=classes, shared=head, alone=alone, recipe=RECIPE, seed=seed)
        mix = np.bincount(party.split.labels, minlength=classes) / len(party.split.labels)
        row: dict[str, Any] = {}
        for name in ("alone", "shared", "personalised"):
            correct = _correct(found.model(name), ex, ey, images)
            row[name], row[f"{name}_mix"] = float(correct.mean()), mix_accuracy(correct, ey, mix)
        row.update(kept=row[found.kept], kept_mix=row[f"{found.kept}_mix"], chose=found.kept)
        row["holdout"] = {
            name: {"gain": t["gain"], "wins": t["wins"], "losses": t["losses"], "p": t["p_value"]}
            for name, t in found.detail["keep_test"].items()
        }
        out.append(row)
    return out
