"""Every mechanism object says how it is charged, so a model card's ``accountant`` names the mechanism that
ran (never a fixed string: issue 25 found Confident-GNMax's on GNMax, Private-kNN and Prom-PATE cards)."""

from __future__ import annotations

import inspect

from capc_common import mechanisms
from capc_common.mechanisms import ReleaseMechanism, SelectionMechanism
from capc_common.privacy.claims import accountant


def test_every_mechanism_names_itself_and_its_charge_in_the_accountant() -> None:
    concrete: list[type[SelectionMechanism] | type[ReleaseMechanism]] = [
        cls
        for cls in vars(mechanisms).values()
        if inspect.isclass(cls)
        and issubclass(cls, SelectionMechanism | ReleaseMechanism)
        and not inspect.isabstract(cls)
    ]
    assert {cls.name for cls in concrete} >= {
        "confident-gnmax", "gnmax", "lnmax", "private-knn", "prom-pate",
        "dp-prototypes", "dppl-public", "secagg-dpsgd",
    }  # fmt: skip
    texts = {cls.name: accountant(cls) for cls in concrete}
    for name, text in texts.items():
        assert text.startswith(f"{name}: ") and "Rényi filter" in text, text
    # Prom-PATE inherits Confident-GNMax's charge but names itself; GNMax's has no screening.
    assert texts["prom-pate"].removeprefix("prom-pate") == texts["confident-gnmax"].removeprefix(
        "confident-gnmax"
    )
    assert "screening" not in texts["gnmax"] and "screening" in texts["confident-gnmax"]
