"""``capc federation plan``'s answer: a forecast fitted to the joining benchmark's measurements, an interval
measured by leaving each layout out, ``extrapolating`` outside the measured ranges, and an answer that can be
``train-alone`` or ``nothing-to-join``.

The mechanics are tested on a table made here from a known law (so the right answer is known); the shipped
table is checked for what ``benchmarks/joining.py --export`` writes, and the plan's answers on it for the
consortia the product must not mislead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from capc_common.data import holdout_fraction
from capc_common.errors import InputError
from capc_common.federation import forecast as fc
from capc_common.federation import recommend as rec
from capc_common.federation.config import FederationConfig

REPO = Path(__file__).resolve().parents[2]


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def _law(records: float, size: float, epsilon: float, classes: int) -> tuple[float, float, float]:
    """A made-up world of the model's own form, linear in the descriptors on the logit scale (so the fit
    can recover it): alone improves with the party's size, the federation with all records and ε; the best
    party a little above the median; a little noise, fixed per layout, so that leaving a layout out costs
    something."""
    wobble = 0.003 * math.sin(records + size)
    alone = -0.6 + 0.45 * math.log10(size) - 0.05 * math.log2(classes)
    fed = -1.3 + 0.45 * math.log10(records) + 0.35 * math.log10(epsilon) - 0.05 * math.log2(classes)
    return _sigmoid(fed) + wobble, _sigmoid(alone), _sigmoid(alone + 0.15)


def _layout(name: str, parties: int, size: int, classes: int = 10, dataset: str = "toy") -> dict[str, Any]:
    mechanisms = []
    fed = alone = best = 0.0
    for eps in (1.0, 3.0, 6.0):
        fed, alone, best = _law(parties * size, size, eps, classes)
        mechanisms.append({"name": "secagg-dpsgd", "epsilon": eps, "accuracy_mean": fed, "accuracy_std": 0.0})
    return {
        "name": name,
        "dataset": dataset,
        "classes": classes,
        "parties": parties,
        "examples_per_party": size,
        "records": parties * size,
        "party_sizes": {"min": size, "mean": size, "max": size},
        "holdout_fraction": holdout_fraction(size),  # what joining.py records: sizes are whole parties
        "skew": "uniform",
        "alone": {"min": alone - 0.01, "median": alone, "mean": alone, "max": best, "seeds": 3},
        "pooled": 0.97,
        "mechanisms": mechanisms,
    }


TABLE: dict[str, Any] = {
    "source": "benchmarks/joining.py: a test's table",
    "code": "000000000000",
    "layouts": [
        _layout("10x6000", 10, 6000),
        _layout("2x30000", 2, 30000),
        _layout("4x1000", 4, 1000),
        _layout("50x400", 50, 400),
        _layout("200x100", 200, 100),
        _layout("3x100", 3, 100),
        _layout("3x100-2class", 3, 100, classes=2),
        _layout("other-3x480", 3, 480, dataset="other"),
        _layout("other-10x140", 10, 140, dataset="other"),
        # A single party is no consortium: never a measurement of joining.
        {**_layout("1x60000", 1, 60000)},
    ],
}


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(rec, "_table", lambda: TABLE)
    rec.forecaster.cache_clear()
    yield TABLE
    rec.forecaster.cache_clear()


def test_the_forecast_recovers_the_law_and_measures_its_own_error(table):
    model = rec.forecaster()
    assert {p.layout for p in model.points} == {lay["name"] for lay in TABLE["layouts"]} - {"1x60000"}
    for target in fc.TARGETS:
        err = model.errors[target]
        assert 0 <= err["mean_absolute"] <= err["quantile_90"] <= err["largest"]
        # the ridge's shrinkage costs most where a left-out layout is the extreme one (2 x 30,000)
        assert err["quantile_90"] < 0.02 and err["largest"] < 0.04
        assert model.half_width[target] == err["quantile_90"]
    # A consortium between measured ones: the interval contains what the law gives.
    forecast, outside = model.predict(fc.Consortium((2000,) * 5, 10, 3.0))
    fed, alone, _ = _law(10_000, 2000, 3.0, 10)
    assert outside == []
    for target, truth in (("federation", fed), ("alone_median", alone), ("gain_median", fed - alone)):
        f = forecast[target]
        assert f.low <= truth <= f.high and f.low < f.estimate < f.high, (target, f, truth)


def test_leaving_out_is_honest_about_layouts_unlike_the_rest(table):
    """Leave-one-layout-out errors exceed in-sample errors (the model did see those layouts)."""
    model = rec.forecaster()
    points = model.points
    x = fc._design([p.consortium.descriptors() for p in points])
    y = np.asarray([p.values["gain_median"] for p in points])
    in_sample = np.abs(fc._forecast(model.models, x)["gain_median"] - y).mean()
    assert np.abs(fc.leave_one_out(points)["gain_median"]).mean() > in_sample
    across = fc.leave_one_dataset_out(points, train="toy")
    assert {len(errors) for errors in across.values()} == {
        6
    }  # two layouts of the other dataset, three ε each


def test_outside_the_measured_ranges_it_says_so_and_widens(table):
    model = rec.forecaster()
    inside, _ = model.predict(fc.Consortium((1000,) * 4, 10, 6.0))
    far, why = model.predict(fc.Consortium((1000,) * 4, 10, 50.0))
    assert why == ["50 ε is above the largest measured (6)"]
    width = lambda f: f.high - f.low  # noqa: E731
    assert width(far["gain_median"]) == pytest.approx(2 * width(inside["gain_median"]))
    _, why = model.predict(fc.Consortium((30,) * 5, 3, 3.0))
    assert any("median party is below the smallest measured (75)" in w for w in why)


def test_the_answers(table):
    # Many parties, a large budget: the student beats even the best party.
    many = rec.recommend([100] * 200, classes=10, epsilon=6.0)
    assert many["choice"] == "secagg-dpsgd" and many["mechanism"] == "secagg-dpsgd"
    assert many["expected_gain"]["best"]["interval"][0] > 0 and not many["extrapolating"]
    # Twenty parties at ε 3: better than the median party, not clearly than the best: each keeps its best.
    some = rec.recommend([400] * 20, classes=10, epsilon=3.0)
    assert some["choice"] == "join-and-personalise" and some["mechanism"] == "secagg-dpsgd"
    assert some["expected_gain"]["median"]["interval"][0] > 0 >= some["expected_gain"]["best"]["interval"][0]
    # Three parties at ε 1: the law puts the federation below the parties alone.
    few = rec.recommend([1000, 1000, 1000], classes=10, epsilon=1.0)
    assert few["choice"] == "train-alone" and few["mechanism"] is None
    assert rec.refusal([1000, 1000, 1000], classes=10, epsilon=1.0).startswith(
        "the plan forecasts the student"
    )
    assert rec.refusal([100] * 200, classes=10, epsilon=6.0) == ""
    # One party is no consortium.
    alone = rec.recommend([60000], classes=10, epsilon=3.0)
    assert alone["choice"] == "nothing-to-join" and alone["extrapolating"]
    assert "single party" in rec.refusal([60000], classes=10, epsilon=3.0)
    for answer in (many, some, few, alone):
        assert set(answer) >= {"choice", "expected_accuracy", "expected_interval", "expected_alone",
                               "extrapolating", "why"}  # fmt: skip
        low, high = answer["expected_interval"]
        assert low <= answer["expected_accuracy"] <= high
    with pytest.raises(InputError, match="at least one party"):
        rec.recommend([], classes=10, epsilon=3.0)
    with pytest.raises(InputError, match="ε > 0"):
        rec.recommend([100], classes=10, epsilon=math.inf)


def test_too_few_measured_layouts_are_refused(monkeypatch):
    monkeypatch.setattr(rec, "_table", lambda: {**TABLE, "layouts": TABLE["layouts"][:2]})
    rec.forecaster.cache_clear()
    try:
        with pytest.raises(InputError, match="at least 3"):
            rec.recommend([100], classes=10, epsilon=3.0)
    finally:
        rec.forecaster.cache_clear()


def test_the_shipped_table_is_the_joining_benchmarks_export():
    shipped = json.loads(rec.TABLE.read_text())
    assert shipped["source"].startswith("benchmarks/joining.py") and len(shipped["code"]) == 12
    datasets = {lay["dataset"] for lay in shipped["layouts"]}
    assert {"fashion-mnist", "digits-28"} <= datasets  # two real datasets
    for lay in shipped["layouts"]:
        assert lay["examples_per_party"] > 0 and lay["parties"] > 0 and lay["alone"]
        for m in lay["mechanisms"]:
            assert (
                m["name"] in {*shipped["engine"], "kept"} and 0 < m["accuracy_mean"] <= 1 and m["epsilon"] > 0
            )


def _plan(*examples: int, epsilon: float, classes: int = 10) -> dict[str, Any]:
    """``capc federation plan --format json`` in this process (so a test's table is the one read)."""
    from click.testing import CliRunner

    from capc_cli.main import cli

    args = ["federation", "plan", "--classes", str(classes), "--epsilon", f"{epsilon:g}", "--format", "json"]
    result = CliRunner().invoke(cli, [*args, *(x for n in examples for x in ("--examples", str(n)))])
    assert result.exit_code == 0, result.output
    recommendation: dict[str, Any] = json.loads(result.stdout)["recommendation"]
    return recommendation


def test_plan_gives_federation_yamls_entries_only_where_it_says_to_federate(table, tmp_path):
    from capc_common.federation.sizing import dpsgd_mechanism

    got = _plan(*[100] * 200, epsilon=6.0)
    assert got["choice"] == "secagg-dpsgd"
    fields, order = dpsgd_mechanism(epsilon=6.0, delta=1e-5)
    assert got["parameters"] == fields and got["budget"] == {"epsilon": 6.0, "delta": 1e-5, "order": order}
    federation = yaml.safe_load((REPO / "deploy" / "compose" / "federation-secagg-dpsgd.yaml").read_text())
    federation.update(mechanism=got["parameters"], budget=got["budget"])
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(federation))
    assert FederationConfig.load(path).mechanism.noise_multiplier == fields["noise_multiplier"]
    tiny = _plan(1000, 1000, 1000, epsilon=1.0)
    assert tiny["choice"] == "train-alone" and "parameters" not in tiny


def test_plan_text_says_what_it_knows(capc):
    text = capc(
        "federation", "plan", "--examples", "1000", "--examples", "1000", "--examples", "1000",
        "--examples", "1000", "--classes", "10", "--epsilon", "3", check=True,
    ).stdout  # fmt: skip
    assert text.startswith("recommendation: ")
    assert "expected: the student" in text and "the median party alone" in text
    assert "left out in turn, 90 % of the layouts' student accuracies came within" in text
    far = capc(
        "federation", "plan", "--examples", "1000", "--examples", "1000", "--classes", "10", "--epsilon",
        "50", check=True,
    ).stdout  # fmt: skip
    assert "(extrapolating)" in far.splitlines()[0] and "ε is above the largest measured" in far


def _federation(examples: list[int], epsilon: float) -> FederationConfig:
    """The shipped secure-aggregation compose federation with ``examples`` declared per party and budget ε."""
    data = yaml.safe_load((REPO / "deploy" / "compose" / "federation-secagg-dpsgd.yaml").read_text())
    data["teachers"] = [
        {**data["teachers"][0], "name": f"hospital-{i + 1}", "examples": n} for i, n in enumerate(examples)
    ]
    data["quorum"]["min_parties"] = len(examples)
    data["budget"]["epsilon"] = epsilon
    return FederationConfig.from_dict(data)


def test_a_federation_forecast_below_its_median_party_is_refused_before_spending(table):
    """The pre-spend check every front end runs (local up, preflight, the guardian): below the median party
    alone, refused as a judgement, with the budget that would reach it; above, or with a party's examples
    undeclared, not judged."""
    from capc_common.federation.refusals import SpendPlan, below_alone, enforce

    few = below_alone(SpendPlan.declared(_federation([400] * 20, 1.0)))
    assert few is not None and few.check == "below-alone" and not few.certain
    assert "below the median party alone" in few.reason
    (change,) = few.changes
    assert change.field == "budget.epsilon" and change.verb == "raise" and change.value > 1.0
    assert rec.refusal([400] * 20, classes=10, epsilon=change.value) == ""  # the change suffices
    hopeless = below_alone(SpendPlan.declared(_federation([1000, 1000, 1000], 1.0)))
    assert hopeless is not None and hopeless.changes == ()  # no measured budget reaches the median party
    assert below_alone(SpendPlan.declared(_federation([100] * 200, 6.0))) is None
    undeclared = _federation([1000, 1000, 1000], 1.0).model_dump(mode="json")
    undeclared["teachers"][0].pop("examples")
    assert below_alone(SpendPlan.declared(FederationConfig.from_dict(undeclared))) is None
    assert enforce([few], force="a pilot, to measure") == (few,)  # a judgement: --force overrides
    # Without a measured table the plan cannot forecast, so it does not refuse.
    rec.forecaster.cache_clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rec, "_table", lambda: {"layouts": []})
        assert below_alone(SpendPlan.declared(_federation([1000, 1000, 1000], 1.0))) is None
    rec.forecaster.cache_clear()


@pytest.mark.parametrize("name", ["4x1000", "3x100", "5x30", "3x100-2class"])
def test_the_shipped_plan_holds_what_was_measured_for_small_consortia(name):
    """For the consortia a plan must not mislead, on the shipped measurements: the student's measured
    accuracy and its measured gain over the median party lie in the plan's intervals (or the plan says it is
    extrapolating), and where the measured gain is not positive the plan does not say to federate."""
    shipped = json.loads(rec.TABLE.read_text())
    rec.forecaster.cache_clear()
    lay = next(lay for lay in shipped["layouts"] if lay["name"] == name)
    measured = next(m for m in lay["mechanisms"] if m["name"] == "secagg-dpsgd" and m["epsilon"] == 3.0)
    gain = measured["accuracy_mean"] - lay["alone"]["median"]
    answer = rec.recommend([lay["examples_per_party"]] * lay["parties"], classes=lay["classes"], epsilon=3.0)
    low, high = answer["expected_interval"]
    glow, ghigh = answer["expected_gain"]["median"]["interval"]
    assert answer["extrapolating"] or (low <= measured["accuracy_mean"] <= high and glow <= gain <= ghigh)
    if gain <= 0:
        assert answer["choice"] in ("train-alone", "nothing-to-join"), answer["why"]


def test_leaving_a_layout_out_leaves_out_its_every_epsilon(table):
    """The interval's errors come from refits without the whole left-out layout: leaving out only one of its
    ε (its other ε still in the fit) would make the errors look smaller than they are."""
    points = rec.forecaster().points
    errors = fc.leave_one_out(points)
    held = [i for i, p in enumerate(points) if p.layout == "2x30000"]
    x = fc._design([points[i].consortium.descriptors() for i in held])
    measured = np.asarray([points[i].values["federation"] for i in held])
    without = fc._fit([p for p in points if p.layout != "2x30000"], fc.RIDGE)
    np.testing.assert_allclose(errors["federation"][held], fc._forecast(without, x)["federation"] - measured)
    one = held[0]
    leaky = fc._fit([p for i, p in enumerate(points) if i != one], fc.RIDGE)
    leaky_error = fc._forecast(leaky, x[:1])["federation"][0] - measured[0]
    assert abs(leaky_error) < abs(errors["federation"][one])
