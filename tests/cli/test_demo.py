"""``capc demo`` (the README's `make demo`) as a user runs it: a local federation to a published student."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capc_common.federation.recommend import CHOICES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_demo_spends_the_budget_and_publishes_a_student(capc, capc_json, tmp_path: Path) -> None:
    state = tmp_path / "demo"
    # --quick: the same code on 3 x 2,000 images (the full `make demo` takes about 5 minutes here and is
    # measured in the README); the accuracy bar is the quick federation's, not the demo's 75 %.
    result = capc_json("demo", "--quick", "--state-dir", str(state), timeout=1400)
    budget, student = result["budget"], result["student"]
    assert 0 < budget["epsilon_spent"] <= budget["epsilon_limit"], budget
    assert 0 < budget["answered"] <= budget["queries"], budget
    assert "budget" in result["stopped_reason"], result["stopped_reason"]
    card = json.loads(Path(student["model_card"]).read_text())
    # The card's ε is the guarantee (the filter's limit); the realised spend, the odometer, sits beside it.
    assert card["privacy"]["epsilon"] == budget["epsilon_limit"] == student["epsilon"]
    assert (
        card["privacy"]["epsilon_spent"] == pytest.approx(budget["epsilon_spent"]) == student["epsilon_spent"]
    )
    assert card["queries"]["answered"] == budget["answered"] == student["answered"]
    assert Path(student["model"]).stat().st_size > 0
    assert student["accuracy"] > 0.2, student  # 10 classes: chance is 0.1
    # The demo stops its parties and leaves their state: the guardian's ledger verifies and agrees.
    status = capc("local", "status", "--state-dir", str(state), "--format", "json")
    assert status.returncode != 0 or '"running": true' not in status.stdout, status.stdout
    ledger = state / "parties" / "guardian" / "ledger.sqlite"
    verified = capc_json("budget", "verify", "--ledger", str(ledger))
    assert verified["ok"] and verified["totals"]["epsilon_spent"] == pytest.approx(budget["epsilon_spent"])
    # Side by side (issue 24): the same hospitals and budget through secure-aggregation DP-SGD, each hospital
    # alone, and which to use — each figure read back from what the runs left on disk.
    other, alone, rec = result["compared"], result["local_only"], result["recommendation"]
    other_card = json.loads(Path(other["model_card"]).read_text())
    assert other_card["privacy"]["epsilon"] == other["epsilon"] <= budget["epsilon_limit"]
    assert other_card["evaluation"]["accuracy"] == other["accuracy"] > 0.5, other  # 6,000 records at ε 8
    assert other["releases"] == other_card["privacy"]["releases"] == 21  # the quick demo's 20 rounds + 1
    assert sorted(alone) == ["hospital-1", "hospital-2", "hospital-3"]
    assert all(0.5 < acc < 1 for acc in alone.values()), alone
    # What each hospital keeps: its best alone, the secagg-dpsgd student and the student fine-tuned on its
    # own data, on the test images; the choice made on its own holdout.
    hospitals = result["hospitals"]
    assert sorted(hospitals) == sorted(alone)
    for party, figures in hospitals.items():
        assert figures["alone"] == alone[party]
        assert figures["kept"] in ("alone", "shared", "personalised")
        assert figures["kept_accuracy"] == figures[figures["kept"]]
        assert set(figures["holdout"]) == {"alone", "shared", "personalised"}
        # the published student itself, read as its card was scored (one image apart at most: float32 here)
        assert figures["shared"] == pytest.approx(other["accuracy"], abs=1.01 / 2000), figures
    best = max(("diet-capc", student["accuracy"]), ("secagg-dpsgd", other["accuracy"]), key=lambda m: m[1])
    assert rec["mechanism"] == best[0] and rec["gain_over_best_hospital"] == pytest.approx(
        best[1] - max(alone.values())
    )
    # and what the joining benchmark's measurements forecast for hospitals of these sizes
    assert result["plan"]["choice"] in CHOICES, result["plan"]
    assert "benchmarks/joining.py" in result["plan"]["measured"]["source"]
    other_ledger = Path(other["state_dir"]) / "parties" / "guardian" / "ledger.sqlite"
    assert capc_json("budget", "verify", "--ledger", str(other_ledger))["ok"]
