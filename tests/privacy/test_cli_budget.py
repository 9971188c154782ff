"""``capc budget estimate|plan|show|verify``: the documented JSON contract, text output and exit codes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from capc_cli.main import cli, main
from capc_common.privacy import BudgetLedger, estimate

MECH = ["--teachers", "250", "--classes", "10", "--sigma1", "100", "--sigma2", "40", "--threshold", "170"]


def _exit_code(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the real entry point in-process (exit-code mapping included) and capture its output."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_estimate_json_contract_from_a_real_process(capc_json) -> None:
    out = capc_json("budget", "estimate", *MECH, "--queries", "1000", "--answered", "300", "--delta", "1e-5")
    for key in ("epsilon", "epsilon_classic", "order", "delta", "breakdown"):
        assert key in out
    assert set(out["breakdown"]) == {"screening", "gnmax"}
    expected = estimate(
        teachers=250, classes=10, sigma1=100, sigma2=40, threshold=170, queries=1000, answered=300, delta=1e-5
    )
    assert out["epsilon"] == pytest.approx(expected["epsilon"], rel=1e-12)
    assert out["epsilon"] < out["epsilon_classic"]
    assert out["delta"] == 1e-5


def test_estimate_defaults_to_all_answered_and_prints_text() -> None:
    data = json.loads(
        _invoke("budget", "estimate", *MECH, "--queries", "100", "--delta", "1e-5", "--format", "json")
    )
    assert data["answered"] == 100
    text = _invoke(
        "budget", "estimate", *MECH, "--queries", "100", "--delta", "1e-5", "--noise", "continuous"
    )
    assert "improved conversion" in text and "screening" in text and "GNMax" in text


def test_plan_json_text_and_plot(tmp_path: Path) -> None:
    args = ["budget", "plan", *MECH, "--epsilon", "10", "--delta", "1e-5", "--answer-rate", "0.3"]
    data = json.loads(_invoke(*args, "--format", "json"))
    assert data["queries"] > data["queries_all_answered"] > 0
    assert data["epsilon_used"] <= 10
    png = tmp_path / "plan.png"
    text = _invoke(*args, "--plot", str(png))
    assert "create the ledger at order" in text and png.read_bytes()[:4] == b"\x89PNG"


def test_bad_parameters_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _exit_code(
        capsys, "budget", "estimate", *MECH, "--queries", "10", "--answered", "11", "--delta", "1e-5"
    )
    assert code == 2 and "answered" in err
    code, _, err = _exit_code(capsys, "budget", "plan", *MECH, "--epsilon", "10", "--delta", "2")
    assert code == 2 and "delta" in err


def _ledger(path: Path) -> None:
    with BudgetLedger.create(path, epsilon_limit=3.0, delta=1e-5, order=8.0, config={"f": 1}) as led:
        led.reserve("b1", queries=4, parties=["p"], mechanism="m", params={}, worst_case_rdp=0.02, actor="s")
        led.settle("b1", answered=2, actual_rdp=0.01, actor="g")
        led.reserve("b2", queries=4, parties=["p"], mechanism="m", params={}, worst_case_rdp=0.02, actor="s")


def test_show_and_verify(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _ledger(path)
    data = json.loads(_invoke("budget", "show", "--ledger", str(path), "--format", "json"))
    assert data["summary"]["open_batches"] == 1 and data["summary"]["batches"] == 1
    assert [e["kind"] for e in data["recent"]] == ["reserve", "settle", "reserve"]
    text = _invoke("budget", "show", "--ledger", str(path), "--entries", "1")
    rows = [line.split() for line in text.splitlines() if line.split()[1:2] in (["reserve"], ["settle"])]
    assert "ε spent" in text and rows == [["3", "reserve", "b2", "4", "0", "0.02", "s"]]
    # Settled ε (never falls) and the open reservation's part are shown apart, not only their sum.
    summary = data["summary"]
    assert summary["epsilon_settled"] > 0 and summary["epsilon_reserved"] > 0
    assert f"settled {summary['epsilon_settled']:.4f} + reserved {summary['epsilon_reserved']:.4f}" in text
    report = json.loads(_invoke("budget", "verify", "--ledger", str(path), "--format", "json"))
    assert report["ok"] and report["entries"] == 3


def _tampered(path: Path, trigger: str, edit: str) -> None:
    """A real ledger at ``path``, then edited as someone with file access would: drop a guard, edit."""
    _ledger(path)
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute(f"DROP TRIGGER {trigger}")
    raw.execute(edit)
    raw.close()


def test_verify_of_a_tampered_ledger_exits_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l.db"
    _tampered(path, "entries_no_update", "UPDATE entries SET answered = 0 WHERE seq = 2")
    code, out, err = _exit_code(capsys, "budget", "verify", "--ledger", str(path), "--format", "json")
    assert code == 5
    assert json.loads(out)["ok"] is False
    assert "failed verification" in err
    code, _, err = _exit_code(capsys, "budget", "show", "--ledger", str(tmp_path / "none.db"))
    assert code == 2 and "no budget ledger" in err


def test_show_refuses_a_ledger_whose_budget_was_edited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25.5: `capc budget show` of a ledger whose meta row was edited to a 100× budget exits 5."""
    path = tmp_path / "l.db"
    _tampered(path, "meta_no_update", "UPDATE meta SET epsilon_limit = 300.0, budget_rdp = budget_rdp * 100")
    for command in ("show", "verify"):
        code, out, err = _exit_code(capsys, "budget", command, "--ledger", str(path), "--format", "json")
        assert code == 5 and out == ""
        assert "parameters were edited" in err and "Traceback" not in err
