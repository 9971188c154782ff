"""What a published ε means, said once for every report that publishes one (DESIGN §4, "Guarantee, not
odometer").

Under a Rényi filter the guarantee is the filter's limit: the composition of every charge it admitted is
(λ, B)-RDP however the charges were chosen (Feldman & Zrnic 2021), so (ε, δ)-DP at the limit. The sum the
filter actually admitted depends on the data (how many queries passed the screening): it is an odometer
reading, not a privacy guarantee — publishing it as ε would let the reported figure itself leak, and no
theorem makes it hold (Rogers, Roth, Ullman & Vadhan 2016 on privacy odometers). Where the whole sequence of
charges is fixed before any data is touched (a release federation's rounds), their total *is* the guarantee.

Every published ε (the student's model card and ``/api/v1/progress``, the central runner's report and card)
is the guarantee, under ``epsilon``; the realised figure travels beside it as ``epsilon_spent``, each with
one of the notes below.

**Per coalition.** ``epsilon`` is what an outsider learns: someone who sees what is published and none of the
noise. A federation's parties see more (a teacher party each round's state, the guardian and the student the
part of the noise each drew), so a model card also lists ``coalitions``: for each group of parties DESIGN §2
names — an outsider, the guardian with any one teacher party, the student with any one teacher party — the ε
that still holds against their pooled view (:class:`Coalition`; ``epsilon`` null where nothing bounds it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from capc_common.privacy.analysis import DEFAULT_ORDERS, epsilon_from_rdp

__all__ = [
    "CURRENT_STATISTICS",
    "FILTER_GUARANTEE",
    "FILTER_ODOMETER",
    "GUARDIAN_AND_TEACHER",
    "OUTSIDER",
    "PLAN_GUARANTEE",
    "PLAN_ODOMETER",
    "STUDENT_AND_TEACHER",
    "Accounted",
    "Coalition",
    "accountant",
    "coalition_epsilon",
]

OUTSIDER = ("outsider",)
"""Sees what is published (the model, its card) and nothing of any party's noise."""
GUARDIAN_AND_TEACHER = ("guardian", "any one teacher party")
"""The guardian's view (every mask seed, its own noise) pooled with one teacher party's (its records, each
round's public state)."""
STUDENT_AND_TEACHER = ("student", "any one teacher party")
"""The student's view (every masked share, its own noise, what it decodes) pooled with one teacher party's."""

FILTER_GUARANTEE = (
    "epsilon is the guarantee: the Rényi filter's limit, fixed before any data was touched; whatever the "
    "filter admitted, the release is (epsilon, delta_total)-DP (Feldman & Zrnic 2021)"
)
FILTER_ODOMETER = (
    "epsilon_spent is the realised sum of the charges at the same order and delta: an odometer reading "
    "that depends on the data (how many queries passed the screening), not a DP guarantee; quote epsilon"
)
PLAN_GUARANTEE = (
    "epsilon is the guarantee: the charge of every release the federation planned (rounds x one release's "
    "data-independent RDP), fixed before any data was touched; the guardian's ledger charges each planned "
    "round once and no more"
)
PLAN_ODOMETER = (
    "epsilon_spent is the charge of the releases made so far (data-independent; equal to epsilon once every "
    "planned release is made)"
)

CURRENT_STATISTICS = (
    "predictions use BatchNorm current statistics: each image's prediction depends on the other images of "
    "its batch (query in batches of at least min_batch images, and do not mix images whose owners must not "
    "influence each other's predictions); epsilon protects the teachers' training data, not the images "
    "queried"
)


class Accounted(Protocol):
    """A mechanism object that says how it is charged (every selection and release mechanism).

    Attributes:
        name: registry name.
        accounting: what one query, answer or release costs, with its source.
    """

    name: ClassVar[str]
    accounting: ClassVar[str]


def accountant(mechanism: Accounted) -> str:
    """The model card's ``accountant``: the mechanism that ran, its charge, and how ε is read off."""
    return (
        f"{mechanism.name}: {mechanism.accounting}; Rényi filter at one fixed order, improved RDP→(ε, δ) "
        "conversion (Canonne, Kamath & Steinke 2020; Balle et al. 2020)"
    )


@dataclass(frozen=True)
class Coalition:
    """ε against one coalition's pooled view.

    Attributes:
        members: who pools their views (:data:`OUTSIDER`, :data:`GUARDIAN_AND_TEACHER`,
            :data:`STUDENT_AND_TEACHER`).
        epsilon: the guarantee against them at the card's δ, or None where nothing bounds what they learn.
        note: which noise protects the data against them (or why nothing does).
    """

    members: tuple[str, ...]
    epsilon: float | None
    note: str

    def to_dict(self) -> dict[str, Any]:
        """The model card's form: ``{"members": [...], "epsilon": ε or null, "note": ...}``."""
        return {"members": list(self.members), "epsilon": self.epsilon, "note": self.note}


def coalition_epsilon(
    curve: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
    *,
    delta: float,
    orders: npt.ArrayLike = DEFAULT_ORDERS,
) -> float:
    """ε at ``delta`` of a fixed composition whose RDP at each order is ``curve(orders)``: the smallest over
    the orders, by the improved conversion (Canonne, Kamath & Steinke 2020, Prop. 12; Balle et al. 2020,
    Thm. 21). A plan fixed before any data is touched may be converted at its best order, unlike a filter.
    """
    lam = np.asarray(orders, dtype=np.float64)
    return epsilon_from_rdp(lam, curve(lam), delta=delta)[0]
