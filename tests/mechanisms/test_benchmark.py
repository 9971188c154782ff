"""``benchmarks/mechanisms.py`` keeps its interface: one JSON object with the mean ± std table, and its CSV,
Markdown and PNG outputs; a second run resumes from the CSV instead of recomputing."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mechanisms.py"


def _run(out: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    args = "--dataset digits --train-limit 1400 --parties 3 --methods local-only dppl secagg-dpsgd "
    args += "--epsilons 1 4 --seeds 0 1 --partitions imbalanced --format json"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args.split(), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        check=check,
    )


@pytest.mark.slow
def test_json_table_outputs_and_resume(tmp_path: Path) -> None:
    result = json.loads(_run(tmp_path).stdout)
    assert result["setting"]["train_images"] == 1400 and result["setting"]["delta"] == 1e-5
    cells = {(t["method"], t["epsilon_target"]): t for t in result["table"]}
    # local-only is one non-private value shown at every ε; the DP methods have one cell per ε, 2 seeds each.
    assert cells[("local-only", 1.0)]["accuracy_mean"] == cells[("local-only", 4.0)]["accuracy_mean"]
    for method in ("dppl", "secagg-dpsgd"):
        for eps in (1.0, 4.0):
            cell = cells[(method, eps)]
            assert cell["seeds"] == 2 and 0.5 < cell["accuracy_mean"] <= 1.0
    assert cells[("dppl", 1.0)]["released"] == 1
    with (tmp_path / "mechanisms.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 + 2 * 2 * 2
    # Every DP row spent at most its target ε (rigorous accounting, calibrated noise).
    assert all(
        float(r["epsilon"]) <= float(r["epsilon_target"]) * (1 + 1e-9) for r in rows if r["released"] != "0"
    )
    table = (tmp_path / "mechanisms.md").read_text()
    assert table.count("| dppl |") == 1
    assert table.startswith("Neighbouring datasets: add/remove one example (parties and each party")
    assert result["setting"]["split"] == "keyed-hash" and "add/remove" in result["setting"]["neighbouring"]
    assert (tmp_path / "mechanisms.png").stat().st_size > 10_000
    # Resumed: nothing new is computed.
    again = json.loads(_run(tmp_path).stdout)
    assert again["rows"] == len(rows)
    # Another setting (a validation run, a --set sweep) must not resume these rows as if they were its own.
    for other in (["--evaluate-on", "validation", "--validation", "400"], ["--set", "dppl.metric=cosine"]):
        refused = _run(tmp_path, *other, check=False)
        assert refused.returncode != 0 and "holds rows of another setting" in refused.stderr
    # A hyper-parameter of a method the CSV holds no row of does not matter to its rows.
    assert json.loads(_run(tmp_path, "--set", "knn.neighbours=7").stdout)["rows"] == len(rows)
    # A boolean setting is read as written (bool("False") is True), anything else refused.
    off = json.loads(_run(tmp_path, "--set", "fedavg.statistics=False").stdout)
    assert off["rows"] == len(rows) and off["setting"]["hyper"]["fedavg"]["statistics"] is False
    bad = _run(tmp_path, "--set", "fedavg.statistics=no", check=False)
    assert bad.returncode == 2 and "fedavg.statistics is true or false, not 'no'" in bad.stderr


def _merge(out: Path, *sources: Path, setting: list[str] = ()) -> subprocess.CompletedProcess[str]:
    args = "--dataset digits --train-limit 1400 --parties 3 --epsilons 1 4 --format json"
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *args.split(),
            *setting,
            "--out",
            str(out),
            "--merge",
            *map(str, sources),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_merge_gathers_runs_of_the_same_setting_and_refuses_another(tmp_path: Path) -> None:
    """``--merge`` builds the published table from runs made one method at a time, never from a run whose
    recorded setting differs in anything its rows depend on."""
    run = tmp_path / "run"
    run.mkdir()
    header = "method,partition,epsilon_target,epsilon,seed,accuracy,released,noise,seconds\n"
    (run / "a.csv").write_text(header + "dppl,iid,1.0,0.99,0,0.9,1,x,1\ndppl,iid,4.0,3.9,0,0.92,1,x,1\n")
    # Refused without a recorded setting; the target records the merge's own setting first, which is what a
    # run under the same setting would have recorded.
    probe = _merge(tmp_path / "probe", run / "a.csv")
    assert probe.returncode != 0 and "no recorded setting" in probe.stderr
    recorded = json.loads((tmp_path / "probe" / "mechanisms.setting.json").read_text())
    (run / "a.setting.json").write_text(json.dumps(recorded))
    merged = _merge(tmp_path / "out", run / "a.csv")
    assert merged.returncode == 0, merged.stderr
    result = json.loads(merged.stdout)
    assert result["rows"] == 2
    assert {(t["method"], t["epsilon_target"]) for t in result["table"]} == {("dppl", 1.0), ("dppl", 4.0)}
    again = json.loads(_merge(tmp_path / "out", run / "a.csv").stdout)
    assert again["rows"] == 2  # nothing merged twice
    # A run whose dppl hyper-parameters differ is refused; one differing only in another method's is not.
    other = dict(recorded, hyper={**recorded["hyper"], "dppl": {**recorded["hyper"]["dppl"], "metric": "x"}})
    (run / "a.setting.json").write_text(json.dumps(other))
    refused = _merge(tmp_path / "out2", run / "a.csv")
    assert refused.returncode != 0 and "hyper.dppl" in refused.stderr
    other = dict(recorded, hyper={**recorded["hyper"], "knn": {**recorded["hyper"]["knn"], "neighbours": 3}})
    (run / "a.setting.json").write_text(json.dumps(other))
    assert _merge(tmp_path / "out3", run / "a.csv").returncode == 0
    # Rows of a run made before the parties were split by content hash (no split recorded) never mix in.
    (run / "a.setting.json").write_text(json.dumps({k: v for k, v in recorded.items() if k != "split"}))
    refused = _merge(tmp_path / "out4", run / "a.csv")
    assert refused.returncode != 0 and "parties split by position and seeded permutation" in refused.stderr
