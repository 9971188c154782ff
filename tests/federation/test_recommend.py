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


def _layout(
    name: str, parties: int, size: int, local_max: float | None, scores: dict[str, dict[float, float]]
) -> dict[str, Any]:
    local = (
        None if local_max is None else {"min": local_max - 0.02, "mean": local_max - 0.01, "max": local_max}
    )
    return {
        "name": name,
        "parties": parties,
        "examples_per_party": size,
        "local_only": local,
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
        # Measured without its parties alone: never read (else its DPPL would win everywhere near 6,000).
        _layout("unbaselined", 10, 6000, None, {"dppl": {1.0: 0.99, 3.0: 0.99, 6.0: 0.99}}),
        # As large parties as "big", but two of them: the party count tells them apart.
        _layout("big-few", 2, 6000, 0.88, {"secagg-dpsgd": {3.0: 0.5}}),
        _layout("big", 10, 6000, 0.88, {"secagg-dpsgd": {1.0: 0.87, 3.0: 0.89}, "diet-capc": {3.0: 0.90}}),
        _layout("mid", 50, 400, 0.70, {"secagg-dpsgd": {3.0: 0.75}, "dppl": {3.0: 0.80}}),
        _layout("small", 200, 100, 0.75, {"secagg-dpsgd": {3.0: 0.86}, "dppl": {3.0: 0.70, 6.0: 0.72}}),
    ],
}


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(rec, "_table", lambda: TABLE)
    return TABLE


def test_the_nearest_layout_and_the_budget_below_are_read(table):
    r = rec.recommend([6500, 5800, 6100, *[6000] * 7], epsilon=4.0)
    # ε 4 reads the ε 3 row (a smaller budget's figure is what ε 4 can at least expect); DIET-CaPC wins there
    # and is named as federation.yaml names it.
    assert (r["mechanism"], r["measured_as"]) == ("confident-gnmax", "diet-capc")
    assert r["measured"] == {"layout": "big", "epsilon": 3.0, "dataset": "toy", "source": table["source"]}
    assert r["expected_accuracy"] == 0.90 and r["expected_gain_over_best_party"] == pytest.approx(0.02)
    assert "against secagg-dpsgd 89.0 %" in r["why"] and "beats every party alone" in r["why"]
    r = rec.recommend([6000] * 10, epsilon=2.0)
    assert (r["mechanism"], r["measured"]["epsilon"], r["expected_accuracy"]) == ("secagg-dpsgd", 1.0, 0.87)
    assert "There no private student beat the best party alone" in r["why"]


def test_the_budget_asked_counts_itself_the_median_party_and_the_party_count_decide(table):
    r = rec.recommend([6000] * 10, epsilon=3.0)  # exactly a measured ε: its rows count
    assert (r["measured"]["layout"], r["measured_as"], r["expected_accuracy"]) == ("big", "diet-capc", 0.90)
    r = rec.recommend([100] * 150 + [6000] * 50, epsilon=3.0)  # the median party, not the largest
    assert r["measured"]["layout"] == "small"
    r = rec.recommend([6000, 6000], epsilon=3.0)  # two parties of 6,000: the two-party measurement
    assert (r["measured"]["layout"], r["expected_accuracy"]) == ("big-few", 0.5)


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
    assert shipped["layouts"] and set(shipped["engine"].values()) <= {
        "secagg-dpsgd", "confident-gnmax", "dppl", "dppl-public", "private-knn"}  # fmt: skip
    for lay in shipped["layouts"]:
        assert lay["examples_per_party"] > 0 and lay["parties"] > 0
        for m in lay["mechanisms"]:
            assert m["name"] in shipped["engine"] and 0 < m["accuracy_mean"] <= 1 and m["epsilon"] > 0


def _plan(*examples: int, epsilon: float) -> dict[str, Any]:
    """``capc federation plan --format json`` in this process (so a test's table is the one read)."""
    from click.testing import CliRunner

    from capc_cli.main import cli

    args = ["federation", "plan", "--classes", "10", "--epsilon", f"{epsilon:g}", "--format", "json"]
    result = CliRunner().invoke(cli, [*args, *(x for n in examples for x in ("--examples", str(n)))])
    assert result.exit_code == 0, result.output
    recommendation: dict[str, Any] = json.loads(result.stdout)["recommendation"]
    return recommendation


def test_plan_gives_federation_yamls_entries_for_the_shipped_recommendation(tmp_path):
    """With the shipped table: what `plan` prints is the lookup's answer, with secagg-dpsgd's parameters and
    budget as `dpsgd_mechanism` plans them, and they load as federation.yaml's entries."""
    from capc_common.federation.sizing import dpsgd_mechanism

    got = _plan(6000, 6000, epsilon=3.0)
    expected = rec.recommend([6000, 6000], epsilon=3.0)
    assert {k: got[k] for k in expected} == json.loads(json.dumps(expected))
    if got["mechanism"] == "secagg-dpsgd":
        fields, order = dpsgd_mechanism(epsilon=3.0, delta=1e-5)
        assert got["parameters"] == fields and got["budget"] == {
            "epsilon": 3.0,
            "delta": 1e-5,
            "order": order,
        }
        federation = yaml.safe_load(
            (REPO / "deploy" / "compose" / "federation-secagg-dpsgd.yaml").read_text()
        )
        federation.update(mechanism=got["parameters"], budget=got["budget"])
        path = tmp_path / "federation.yaml"
        path.write_text(yaml.safe_dump(federation))
        assert FederationConfig.load(path).mechanism.noise_multiplier == fields["noise_multiplier"]


def test_plan_sizes_diet_capc_when_it_wins_and_names_what_it_does_not_size(table):
    from capc_common.federation import propose

    got = _plan(*[6000] * 10, epsilon=4.0)
    sized = propose([6000] * 10, classes=10, epsilon=4.0)
    assert got["mechanism"] == "confident-gnmax" and got["parameters"] == json.loads(
        json.dumps(sized["mechanism"])
    )
    assert got["budget"] == {"epsilon": 4.0, "delta": 1e-5, "order": sized["budget"]["order"]}
    got = _plan(*[400] * 50, epsilon=3.0)
    assert (got["mechanism"], got["parameters"]) == ("dppl", {"name": "dppl"})
    assert got["budget"] == {"epsilon": 3.0, "delta": 1e-5}


def test_plan_text_says_what_it_recommends_and_where_it_was_measured(capc):
    text = capc(
        "federation", "plan", "--examples", "100", "--examples", "120", "--classes", "10", "--epsilon", "3",
        check=True,
    ).stdout  # fmt: skip
    assert text.startswith("recommendation: ") and "measured, not promised: fashion-mnist" in text
    assert "budget: epsilon 3, delta 1e-05" in text
