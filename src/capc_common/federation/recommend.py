"""Which mechanism to run, from measurements: the joining benchmark's table (``benchmarks/joining.py``).

A consortium asks one question before it starts: which student will be worth joining for at our budget? The
answer here is a lookup, not a model: the measured layout nearest to the parties' sizes (examples per party,
then the number of parties, on a log scale), every measured budget up to the requested ε (a smaller budget's
figure is what the requested one can at least expect), and the mechanism that scored best there.
It is labelled for what it is: a measurement on Fashion-MNIST with the shipped backbone, not a promise for
another dataset.

The table ships with the package (``joining_table.json``, written by ``benchmarks/joining.py --export``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from capc_common.errors import InputError

__all__ = ["TABLE", "recommend"]

#: The measured table (the joining benchmark's ``layouts``, plus where they come from).
TABLE = Path(__file__).with_name("joining_table.json")


@cache
def _table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(TABLE.read_text())
    return table


def recommend(examples: Sequence[int], *, epsilon: float) -> dict[str, Any]:
    """The mechanism the measurements favour for parties of ``examples`` images each at budget ``epsilon``.

    Returns:
        ``{"mechanism"`` (its ``mechanism.name`` in federation.yaml), ``"measured_as"`` (its name in the
        benchmark), ``"expected_accuracy", "expected_gain_over_best_party", "local_only",
        "pooled", "why", "measured": {"layout", "epsilon", "dataset", "source"}}``.

    Raises:
        InputError: no party, or no measurement at all (an empty table).
    """
    if not examples or min(examples) < 1:
        raise InputError("need the number of examples of at least one party (each at least 1)")
    table = _table()
    layouts = [lay for lay in table["layouts"] if lay["mechanisms"] and lay["local_only"]]
    if not layouts:
        raise InputError(f"{TABLE} holds no measurement; run benchmarks/joining.py --export")
    size = sorted(examples)[len(examples) // 2]
    layout = min(
        layouts,
        key=lambda lay: (
            abs(math.log(lay["examples_per_party"] / size)),
            abs(math.log(lay["parties"] / len(examples))),
        ),
    )
    # Every measured budget up to the requested one counts (a larger budget can run a smaller one's
    # settings): each mechanism at its best there; below every measurement, the smallest one measured.
    below = [m for m in layout["mechanisms"] if m["epsilon"] <= epsilon * (1 + 1e-9)]
    smallest = min(m["epsilon"] for m in layout["mechanisms"])
    candidates = below or [m for m in layout["mechanisms"] if m["epsilon"] == smallest]
    per_mechanism: dict[str, dict[str, Any]] = {}
    for m in candidates:
        if m["name"] not in per_mechanism or m["accuracy_mean"] > per_mechanism[m["name"]]["accuracy_mean"]:
            per_mechanism[m["name"]] = m
    rows = list(per_mechanism.values())
    best = max(rows, key=lambda m: m["accuracy_mean"])
    at = best["epsilon"]
    local = layout["local_only"]
    gain = best["accuracy_mean"] - local["max"]
    runner_up = sorted(rows, key=lambda m: -m["accuracy_mean"])[1:2]
    why = (
        f"measured on {table['dataset']} in the layout {layout['name']!r} ({layout['parties']} parties of "
        f"about {layout['examples_per_party']} examples, the nearest to yours) at ε {at:g}"
        + ("" if below else f" (the smallest measured; you asked for {epsilon:g})")
        + f": {best['name']} {100 * best['accuracy_mean']:.1f} %"
        + (
            f" against {runner_up[0]['name']} {100 * runner_up[0]['accuracy_mean']:.1f} %"
            f" (at ε {runner_up[0]['epsilon']:g})"
            if runner_up
            else ""
        )
        + f"; the best party alone {100 * local['max']:.1f} %"
        + (
            ""
            if layout["pooled"] is None
            else f", all data pooled without privacy {100 * layout['pooled']:.1f} %"
        )
        + ". "
        + (
            "The federation's student beats every party alone there."
            if gain > 0
            else "There no private student beat the best party alone: joining buys less than that party has."
        )
    )
    return {
        "mechanism": table["engine"][best["name"]],
        "measured_as": best["name"],
        "expected_accuracy": best["accuracy_mean"],
        "expected_gain_over_best_party": gain,
        "local_only": local,
        "pooled": layout["pooled"],
        "why": why,
        "measured": {
            "layout": layout["name"],
            "epsilon": at,
            "dataset": table["dataset"],
            "source": table["source"],
        },
    }
