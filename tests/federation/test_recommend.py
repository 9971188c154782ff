"""``capc federation plan``'s recommendation: a lookup in the joining benchmark's measured table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from capc_common.errors import InputError
from capc_common.federation import recommend as rec
from capc_common.federation.config import FederationConfig

REPO = Path(__file__).resolve().parents[2]


def _layout(name: str, parties: int, size: int, local_max: float, scores: dict[str, dict[float, float]]):
    return {
        "name": name,
        "parties": parties,
        "examples_per_party": size,
        "local_only": {"min": local_max - 0.02, "mean": local_max - 0.01, "max": local_max, "seeds": 3},
        "pooled": 0.91,
        "mechanisms": [
            {"name": method, "epsilon": eps, "accuracy_mean": acc, "accuracy_std": 0.001}
            for method, by_eps in scores.items()
            for eps, acc in by_eps.items()
        ],
    }


TABLE: dict[str, Any] = {
    "dataset": "toy",
    "source": "benchmarks/joining.py: a test's table",
    "engine": {"secagg-dpsgd": "secagg-dpsgd", "diet-capc": "confident-gnmax", "dppl": "dppl"},
    "layouts": [
        _layout("big", 10, 6000, 0.88, {"secagg-dpsgd": {1.0: 0.87, 3.0: 0.89}, "diet-capc": {3.0: 0.90}}),
        _layout("small", 200, 100, 0.75, {"secagg-dpsgd": {3.0: 0.86}, "dppl": {3.0: 0.70, 6.0: 0.72}}),
    ],
}


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(rec, "_table", lambda: TABLE)
    return TABLE


def test_the_nearest_layout_and_the_budget_below_are_read(table):
    r = rec.recommend([6500, 5800, 6100], epsilon=4.0)
    # ε 4 reads the ε 3 row (a smaller budget's figure is what ε 4 can at least expect); DIET-CaPC wins there
    # and is named as federation.yaml names it.
    assert (r["mechanism"], r["measured_as"]) == ("confident-gnmax", "diet-capc")
    assert r["measured"] == {"layout": "big", "epsilon": 3.0, "dataset": "toy", "source": table["source"]}
    assert r["expected_accuracy"] == 0.90 and r["expected_gain_over_best_party"] == pytest.approx(0.02)
    assert "against secagg-dpsgd 89.0 %" in r["why"] and "beats every party alone" in r["why"]
    r = rec.recommend([6000] * 10, epsilon=2.0)
    assert (r["mechanism"], r["measured"]["epsilon"], r["expected_accuracy"]) == ("secagg-dpsgd", 1.0, 0.87)
    assert "There no private student beat the best party alone" in r["why"]


def test_a_larger_budget_keeps_what_a_smaller_one_measured(table):
    """At ε 10 the secagg row at ε 3 still counts, though only DPPL was measured at ε 6."""
    r = rec.recommend([100] * 200, epsilon=10.0)
    assert (r["mechanism"], r["measured"]["epsilon"], r["expected_accuracy"]) == ("secagg-dpsgd", 3.0, 0.86)
    assert "against dppl 72.0 % (at ε 6)" in r["why"]


def test_small_parties_read_the_small_layout_and_a_budget_below_every_row_says_so(table):
    r = rec.recommend([90, 120, 100], epsilon=0.5)
    assert r["measured"]["layout"] == "small" and r["mechanism"] == "secagg-dpsgd"
    assert "the smallest measured; you asked for 0.5" in r["why"]


def test_no_party_or_an_empty_table_is_a_clear_error(monkeypatch):
    with pytest.raises(InputError, match="at least one party"):
        rec.recommend([], epsilon=3.0)
    with pytest.raises(InputError, match="at least one party"):
        rec.recommend([100, 0], epsilon=3.0)
    monkeypatch.setattr(rec, "_table", lambda: {**TABLE, "layouts": []})
    with pytest.raises(InputError, match="holds no measurement"):
        rec.recommend([100], epsilon=3.0)


def test_the_shipped_table_is_the_joining_benchmarks_fashion_mnist_export():
    shipped = json.loads(rec.TABLE.read_text())
    assert shipped["dataset"] == "fashion-mnist" and shipped["source"].startswith("benchmarks/joining.py")
    names = {lay["name"] for lay in shipped["layouts"]}
    assert "10x6000-iid" in names
    for lay in shipped["layouts"]:
        for m in lay["mechanisms"]:
            assert m["name"] in shipped["engine"] and 0 < m["accuracy_mean"] <= 1


def test_plan_recommends_with_parameters_it_can_run(capc_json, capc, tmp_path):
    """The recommendation's ``parameters`` and ``budget`` are federation.yaml's entries as they are: a file
    with them loads, and the ledger's order plans the budget."""
    r = capc_json(
        "federation", "plan", "--examples", "6000", "--examples", "6000", "--classes", "10", "--epsilon", "3"
    )
    got = r["recommendation"]
    assert got["mechanism"] == got["parameters"]["name"] == "secagg-dpsgd"  # measured: 89 % vs 78 %
    assert 0.85 < got["expected_accuracy"] <= 1 and got["why"]
    assert got["budget"]["epsilon"] == 3 and got["budget"]["order"] > 1
    federation = yaml.safe_load((REPO / "deploy" / "compose" / "federation-secagg-dpsgd.yaml").read_text())
    federation.update(mechanism=got["parameters"], budget=got["budget"])
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(federation))
    loaded = FederationConfig.load(path)
    assert loaded.mechanism.noise_multiplier == got["parameters"]["noise_multiplier"]
    text = capc(
        "federation", "plan", "--examples", "100", "--examples", "120", "--classes", "10", "--epsilon", "3",
        check=True,
    ).stdout  # fmt: skip
    assert text.startswith("recommendation: ") and "measured, not promised: fashion-mnist" in text
    assert "budget: epsilon 3, delta 1e-05, order" in text
