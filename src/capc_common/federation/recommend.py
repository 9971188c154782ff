"""Whether to federate at all, and with what: the plan's answer, from measurements, with its uncertainty.

A consortium asks one question before it spends any privacy: will the shared student be worth it — for the
median member, and for the best-placed one? The answer comes from :mod:`.forecast` (a model fitted to the
joining benchmark's measurements on two real datasets, with an interval measured by leaving each layout out)
and is one of:

* ``secagg-dpsgd`` — the federation's student beats even the best party alone, beyond the forecast's
  uncertainty: run it;
* ``join-and-personalise`` — it beats the median party beyond the uncertainty but not clearly the best one:
  run it, and every party keeps the best of alone, shared and fine-tuned (``capc teacher personalise``), so
  nobody ends worse off;
* ``train-alone`` — the student is forecast below the median party alone, or the gain is within the
  forecast's uncertainty: joining would spend privacy for a gain the measurements cannot promise;
* ``nothing-to-join`` — a single party: there is no consortium.

A mechanism is never headlined when its forecast gain is within its uncertainty or negative. Outside the
measured ranges the answer says ``extrapolating`` and why. The mechanism forecast is secure-aggregation
DP-SGD: in every layout the benchmark measured the other mechanisms (DIET-CaPC, DP prototypes,
Private-kNN) scored below it (docs/results.md, "Worth joining").

The measurements ship with the package (``joining_table.json``, written by ``benchmarks/joining.py
--export``), with the code hash of the run that made them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from capc_common.errors import InputError
from capc_common.federation.forecast import MECHANISM, Consortium, Forecaster

__all__ = ["CHOICES", "TABLE", "forecaster", "recommend", "refusal"]

#: The measured table (the joining benchmark's ``layouts``, plus where they come from).
TABLE = Path(__file__).with_name("joining_table.json")
#: Every answer the plan can give.
CHOICES = (MECHANISM, "join-and-personalise", "train-alone", "nothing-to-join")


@cache
def _table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(TABLE.read_text())
    return table


@cache
def forecaster() -> Forecaster:
    """The model fitted to the shipped table (once per process)."""
    return Forecaster.from_table(_table())


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _points(value: float) -> str:
    return f"{100 * value:+.1f}"


def training_parts(examples: Sequence[int]) -> list[int]:
    """What parties of ``examples`` labelled images each train on once each keeps its holdout at home
    (:func:`capc_common.data.holdout_fraction` of its planned size): the units the forecast counts in."""
    from capc_common.data import holdout_fraction

    return [max(1, round(n * (1 - holdout_fraction(n)))) if n >= 1 else n for n in examples]


def recommend(
    examples: Sequence[int],
    *,
    classes: int,
    epsilon: float,
    skewed: bool = False,
    training: bool = False,
) -> dict[str, Any]:
    """The plan's answer for parties of ``examples`` labelled images each, ``classes`` classes, budget
    ``epsilon``. ``examples`` counts each party's whole labelled set (its holdout included), or with
    ``training`` its training part (federation.yaml's ``teachers[].examples``): the forecast counts training
    parts, as the federation sees them.

    Returns:
        ``{"choice"`` (one of :data:`CHOICES`), ``"mechanism"`` (federation.yaml's ``mechanism.name`` to run,
        or None), ``"expected_accuracy"`` and ``"expected_interval"`` (the student's), ``"expected_alone"``
        (``{"median", "best"}``, each ``{"estimate", "interval"}``), ``"expected_gain"`` (over the median and
        the best party, likewise), ``"extrapolating"``, ``"extrapolating_why"``, ``"why"``, ``"measured"``
        (``{"source", "code", "layouts", "datasets", "error"}``: where the forecast comes from and its
        leave-one-layout-out error)}``.

    Raises:
        InputError: no party, fewer than two classes, a non-positive ε, or an empty table.
    """
    consortium = Consortium(
        tuple(examples if training else training_parts(examples)), classes, epsilon, skewed
    )
    model = forecaster()
    table = _table()
    forecast, outside = model.predict(consortium)
    fed, median, best = forecast["federation"], forecast["alone_median"], forecast["alone_best"]
    gain_median, gain_best = forecast["gain_median"], forecast["gain_best"]
    parties = len(consortium.examples)
    if parties < 2:
        choice = "nothing-to-join"
        why = (
            "a single party is no consortium: a federation of one only adds noise to what the party trains "
            "alone (train it alone, with its own tuning)"
        )
    elif gain_best.low > 0:
        choice = MECHANISM
        why = (
            f"the student is forecast at {_pct(fed.estimate)} ({_pct(fed.low)}–{_pct(fed.high)}), "
            f"{_points(gain_best.estimate)} points over the best party alone even at the low end of the "
            "forecast's uncertainty"
        )
    elif gain_median.low > 0:
        choice = "join-and-personalise"
        why = (
            f"the student is forecast {_points(gain_median.estimate)} points over the median party alone "
            f"(interval {_points(gain_median.low)} to {_points(gain_median.high)}) but not clearly over the "
            f"best one ({_points(gain_best.low)} to {_points(gain_best.high)}): federate, and let every "
            "party keep the best of alone, shared and fine-tuned (capc teacher personalise), so nobody ends "
            "worse off"
        )
    elif gain_median.high < 0:
        choice = "train-alone"
        why = (
            f"the student is forecast below the median party alone ({_points(gain_median.estimate)} points, "
            f"interval {_points(gain_median.low)} to {_points(gain_median.high)}): joining would spend "
            "privacy for a worse model"
        )
    else:
        choice = "train-alone"
        why = (
            f"the forecast gain over the median party ({_points(gain_median.estimate)} points, interval "
            f"{_points(gain_median.low)} to {_points(gain_median.high)}) is within the forecast's "
            "uncertainty: the measurements cannot promise that joining pays"
        )
    if outside:
        why += "; extrapolating: " + "; ".join(outside)
    return {
        "choice": choice,
        "mechanism": MECHANISM if choice in (MECHANISM, "join-and-personalise") else None,
        "expected_accuracy": fed.estimate,
        "expected_interval": [fed.low, fed.high],
        "expected_alone": {"median": median.as_dict(), "best": best.as_dict()},
        "expected_gain": {"median": gain_median.as_dict(), "best": gain_best.as_dict()},
        "extrapolating": bool(outside),
        "extrapolating_why": outside,
        "why": why,
        "measured": {
            "source": table.get("source", ""),
            "code": table.get("code", ""),
            "layouts": len({p.layout for p in model.points}),
            "datasets": sorted({p.dataset for p in model.points}),
            "error": model.errors,
        },
    }


def refusal(examples: Sequence[int], *, classes: int, epsilon: float, skewed: bool = False) -> str:
    """Why a federation of these parties should not spend privacy ('' when it may): the plan forecasts its
    student below the median party alone (:func:`recommend`'s ``gain.median`` estimate is negative), or
    there is no consortium. What ``capc local up`` and preflight refuse on, unless forced: ``examples`` are
    each party's training part as federation.yaml declares it. Where the plan cannot forecast at all (no
    measured table), it does not refuse: a refusal must come from what was measured."""
    try:
        answer = recommend(examples, classes=classes, epsilon=epsilon, skewed=skewed, training=True)
    except InputError:
        return ""
    gain = answer["expected_gain"]["median"]["estimate"]
    if answer["choice"] == "nothing-to-join":
        return answer["why"]
    if gain < 0:
        return (
            f"the plan forecasts the student {100 * -gain:.1f} points below the median party alone at ε "
            f"{epsilon:g} ({answer['why']})"
        )
    return ""
