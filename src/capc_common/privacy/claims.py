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
"""

from __future__ import annotations

from typing import ClassVar, Protocol

__all__ = [
    "CURRENT_STATISTICS",
    "FILTER_GUARANTEE",
    "FILTER_ODOMETER",
    "PLAN_GUARANTEE",
    "PLAN_ODOMETER",
    "Accounted",
    "accountant",
]

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
    "data-independent RDP), fixed before any data was touched; the ledger's filter caps it at epsilon_limit "
    "even if a release were paid twice"
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
