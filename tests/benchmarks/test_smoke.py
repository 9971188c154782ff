"""Every script under ``benchmarks/`` runs in the suite at toy size, and its JSON is checked: the keys its
docstring promises and figures in a sane range for the size (issue 27.1). A benchmark that stops working
fails here instead of rotting until someone needs its figure.

Each script runs as a real process, exactly as a person runs it, on one torch thread (on a shared 2-core
machine two threads spin against each other), writing only under the test's temporary directory. Scripts
whose toy run is already a test elsewhere (the chaos campaign's short version, the synthetic-image
benchmark) are listed in :data:`ELSEWHERE` with that test; :func:`test_every_script_has_a_smoke_test` fails
when a new script has neither.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capc_common.federation.sizing import DPSGD_ROUNDS

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CAPC_TORCH_THREADS": "1"}


def run_json(script: str, *args: str, timeout: float = 420) -> Any:
    """Run ``benchmarks/<script> ARGS`` and parse the one JSON object it prints last on stdout."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fraction(value: float, low: float = 0.0, high: float = 1.0) -> bool:
    return isinstance(value, float) and math.isfinite(value) and low <= value <= high


# ---------------------------------------------------------------------------------------- the scripts
def accounting(tmp: Path) -> None:
    out = run_json("accounting.py", "--format", "json", "--repeats", "1", "--ledger-batches", "5")
    assert set(out) == {"noise", "ledger", "accountant"}
    rates = [v["draws_per_s"] for v in out["noise"].values() if "draws_per_s" in v]
    assert len(rates) >= 8 and all(r > 0 for r in rates)
    tables = [v for k, v in out["noise"].items() if k.startswith("table_")]
    assert tables and all(t["entries"] > 0 and t["distance_bound_log2"] <= -64 for t in tables)
    ledger = out["ledger"]
    assert ledger["batches"] == 5 and ledger["entries"] == 10 and ledger["verify_ok"] is True
    assert ledger["batches_per_s"] > 0 and ledger["ms_per_transaction"] > 0
    assert out["accountant"]["orders"] > 10 and out["accountant"]["estimate_s"] > 0


def backbone_speed(tmp: Path) -> None:
    out = run_json(
        "backbone_speed.py", "--format", "json", "--threads", "1", "--images", "64", "--bn-batch", "32",
        "--repeats", "1", "--backbones", "scatter-28x28x1",
    )  # fmt: skip
    assert list(out) == ["scatter-28x28x1"]
    entry = out["scatter-28x28x1"]
    assert entry["images_per_s"] > 0 and entry["size"] == "28x28x1" and entry["bn_batch"] == 32
    assert entry["feature_dim"] > 1000 and entry["threads"] == 1


def dpsgd_recipe(tmp: Path) -> None:
    out = run_json(
        "dpsgd_recipe.py", "--smoke", "--format", "json", "--epsilons", "3",
        "--variants", "old", "recipe", "recipe+14-bits", "recipe+fine-encoding",
        "--out", str(tmp / "recipe" / "dpsgd_recipe"), "--cache-dir", str(tmp / "cache"),
    )  # fmt: skip
    assert out["setting"]["dataset"] == "digits" and out["setting"]["records"] == 1037
    rows = {(r["variant"], r["noise"]): r for r in out["rows"]}
    variants = ("old", "recipe", "recipe+14-bits", "recipe+fine-encoding")
    assert set(rows) == {(v, noise) for v in variants for noise in ("off", "on")}
    assert rows["recipe", "on"]["releases"] == DPSGD_ROUNDS + 1 and rows["old", "on"]["releases"] == 100
    assert rows["recipe+fine-encoding", "on"]["releases"] == DPSGD_ROUNDS + 1
    assert all(_fraction(r["accuracy"], 0.5) for r in out["rows"])  # digits: far above chance (0.1)
    assert all(abs(r["spent"] - 3.0) < 0.01 for r in out["rows"])
    assert {(t["variant"], t["noise"]) for t in out["table"]} == set(rows)
    assert all(Path(p).is_file() for p in out["outputs"])


def federation(tmp: Path) -> None:
    out = run_json(
        "federation.py", "--format", "json", "--parties", "2", "--train-limit", "200", "--bn-batch", "16",
        "--batch-size", "32", "--batches", "2", "--latency-batch", "16", "--latency-batches", "3",
        "--memory-batches", "3", "--work-dir", str(tmp / "federation"),
    )  # fmt: skip
    assert {"federation_labels_per_s", "central_labels_per_s", "ratio", "protocol_latency_16_s", "stages",
            "mpc_bytes_per_label", "guardian_rss_mb", "setup"} <= out.keys()  # fmt: skip
    assert out["federation_labels_per_s"] > 0 and out["central_labels_per_s"] > 0
    assert out["ratio"] == pytest.approx(out["federation_labels_per_s"] / out["central_labels_per_s"])
    assert 0 < out["protocol_latency_16_s"] < 60 and out["mpc_bytes_per_label"] > 0
    assert set(out["stages"]) == {"central", "federation", "latency_run"}
    # The planner's heads for the parties' actual (hash-selected) examples, not a fixed count.
    setup = out["setup"]
    planned = setup["planned"]
    assert len(planned["examples"]) == 2 and all(120 < n < 280 for n in planned["examples"])
    assert setup["teachers_per_party"] == min(planned["heads"]) >= 2
    rss = out["guardian_rss_mb"]
    assert rss["batches"] == 3 and 50 < rss["last"] < 4000


def gpu_check(tmp: Path) -> None:
    out = run_json(
        "gpu_check.py", "--device", "cpu", "--images", "128", "--batch-size", "8", "--steps", "2",
        "--format", "json",
    )  # fmt: skip
    assert {"device", "torch", "features", "pretrain"} <= out.keys() and out["device"] == "cpu"
    features = out["features"]
    assert features["images"] == 128 and features["agree"] is True and features["max_abs_diff"] == 0.0
    assert features["cpu_images_per_s"] > 0 and features["gpu_images_per_s"] > 0
    pretrain = out["pretrain"]
    assert pretrain["steps"] == 2 and pretrain["batch_size"] == 8 and pretrain["images_per_s"] > 0
    losses = pretrain["first_losses"] + pretrain["last_losses"]
    assert losses and all(math.isfinite(v) and 0 < v < 20 for v in losses)


def heads_speed(tmp: Path) -> None:
    out = run_json("heads_speed.py", "--heads", "3", "--rows", "64", "--dim", "32", "--format", "json")
    (row,) = out["runs"]
    assert row["heads"] == 3 and row["rows_per_head"] == 64 and row["dim"] == 32
    assert row["seconds"] >= 0 and row["heads_per_s"] > 0 and row["recipe"]["kind"] == "linear"


def joining(tmp: Path) -> None:
    common = ["--smoke", "--epsilons", "20", "--seeds", "0", "--out", str(tmp), "--cache-dir",
              str(tmp / "cache"), "--runs-dir", str(tmp / "runs"), "--format", "json"]  # fmt: skip
    methods = ["alone", "pooled", "secagg-dpsgd", "private-knn", "diet-capc", "pate-scratch"]
    table = tmp / "joining_table.json"
    out = run_json("joining.py", *common, "--methods", *methods, "--export", str(table))
    setting = out["setting"]
    assert "add/remove one example" in setting["neighbouring"]
    assert [(lay["name"], lay["dataset"]) for lay in out["layouts"]] == [
        ("3x480-iid", "digits"), ("6x80-skewed", "digits")]  # fmt: skip
    # Private-kNN cannot vote from a Poisson sample of the skewed layout's smallest party, and the
    # pipelines' budget holds no batch of its few teachers: those cells are recorded with why, not run.
    skipped = {(s["layout"], s["method"]): s["noise"] for s in out["skipped"]}
    assert {layout for layout, _ in skipped} == {"6x80-skewed"} and ("6x80-skewed", "private-knn") in skipped
    assert "Poisson sample" in skipped[("6x80-skewed", "private-knn")] and out["ran"] > 0
    for lay in out["layouts"]:
        assert lay["parties"] in (3, 6) and 70 < lay["examples_per_party"] < 500
        alone = lay["alone"]  # each party's strongest model alone, min / median / mean / max over parties
        assert _fraction(alone["min"], 0.1) and alone["min"] <= alone["median"] <= alone["max"]
        assert alone["min"] <= alone["mean"] <= alone["max"]
        assert _fraction(lay["pooled"], 0.8)  # 1,438 or 479 digits, one head
        cells = {m["name"]: m for m in lay["mechanisms"]}
        ran = {*methods[2:], "kept"} - {method for layout, method in skipped if layout == lay["name"]}
        assert set(cells) == ran and all(m["epsilon"] == 20.0 for m in cells.values())
        for m in cells.values():
            assert _fraction(m["accuracy_mean"]) and m["accuracy_std"] == 0.0 and m["seeds"] == 1
            assert m["gain_over_best_party"] == pytest.approx(m["accuracy_mean"] - alone["max"])
        assert cells["secagg-dpsgd"]["accuracy_mean"] > 0.7
        # what every party kept is never below its own model alone (the keep rule leans to alone)
        assert cells["kept"]["worse"] == 0 and cells["kept"]["gain_over_alone"] >= 0
    assert {p.split(".")[-1] for p in out["outputs"]} == {"csv", "md", "png", "json"}
    assert (tmp / "joining-smoke.png").stat().st_size > 5_000
    assert "| 3x480-iid |" in (tmp / "joining-smoke.md").read_text()
    # The table `capc federation plan` recommends from: the federation's mechanisms only, labelled.
    exported = json.loads(table.read_text())
    assert "benchmarks/joining.py" in exported["source"] and exported["code"] == out["code"]
    assert {lay["dataset"] for lay in exported["layouts"]} == {"digits"}
    assert {m["name"] for lay in exported["layouts"] for m in lay["mechanisms"]} == {
        "secagg-dpsgd", "private-knn", "diet-capc", "kept"}  # fmt: skip
    # Resumable: every cell is in the CSV, so a second run runs nothing and reports the same table.
    again = run_json("joining.py", *common, "--methods", *methods)
    assert again["ran"] == 0 and again["layouts"] == out["layouts"]
    # A CSV of another setting (here: another pipeline config) is refused, not mixed in.
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "joining.py"), *common, "--methods", "diet-capc",
         "--config", str(REPO / "configs" / "fashion-mnist-diet-pate.yaml")],
        capture_output=True, text=True, timeout=120, env=ENV, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "holds rows of another setting" in proc.stderr and "hyper" in proc.stderr


def linear_probe(tmp: Path) -> None:
    out = run_json(
        "linear_probe.py", "--format", "json", "--limit", "256", "--bn-batch", "64", "--max-iter", "5",
        "--backbones", "scatter-28x28x1", "--out", str(tmp),
    )  # fmt: skip
    assert set(out) == {"scatter-28x28x1", "random_init", "random_init/learned", "raw_pixels"}
    for name in ("scatter-28x28x1", "random_init"):
        assert set(out[name]) == {"current", "running"}
        assert all(_fraction(a, 0.3) for a in out[name].values()), out  # 10 classes: chance is 0.1
    assert _fraction(out["raw_pixels"], 0.3)
    with (tmp / "linear_probe.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 7
    assert (tmp / "linear_probe.png").stat().st_size > 5_000


#: The methods of benchmarks/mechanisms.py whose toy run is a test elsewhere (with its accuracy checked).
METHODS_ELSEWHERE = {
    "local-only": "tests/mechanisms/test_benchmark.py::test_json_table_outputs_and_resume",
    "dppl": "tests/mechanisms/test_benchmark.py::test_json_table_outputs_and_resume",
    "secagg-dpsgd": "tests/mechanisms/test_benchmark.py::test_json_table_outputs_and_resume",
    "capc-fair": "tests/mechanisms/test_baselines.py::test_benchmark_runs_every_baseline_end_to_end",
    "capc-greedy": "tests/mechanisms/test_baselines.py::test_benchmark_runs_every_baseline_end_to_end",
    "cnn-dpsgd": "tests/mechanisms/test_baselines.py::test_benchmark_runs_every_baseline_end_to_end",
    "dp-fedavg": "tests/mechanisms/test_baselines.py::test_dp_fedavg_runs_on_real_flower_processes",
}
#: The others run here, shrunk.
MECHANISMS = ["central-dpsgd", "dppl-public", "dppl-public-votes", "private-knn", "prom-pate"]
SHRINK = ["dpsgd.epochs=2", "dppl_public.queries=256", "dppl_public_votes.per_class=10", "knn.queries=128",
          "knn.neighbours=20", "prompate.teachers_per_party=2", "prompate.queries=128"]  # fmt: skip
#: Accuracy floors on digits (chance is 0.1) below 0.5: the methods that learn from synthetic queries or
#: candidates (measured 0.45–0.62 for DPPL-Public). Private-kNN and Prom-PATE are checked here for running
#: and accounting only: on digits' raw pixels the synthetic queries' nearest neighbours often all fall in one
#: class (Private-kNN's student was one class, 0.09, in 8 of 17 runs at 128–256 queries and 20–40
#: neighbours; 0.32–0.53 otherwise), and Prom-PATE's six teachers answer a handful of queries. Their labels
#: are checked against the central run in tests/e2e/test_private_knn.py and test_prom_pate.py.
FLOOR = {"dppl-public": 0.25, "dppl-public-votes": 0.25, "private-knn": 0.0, "prom-pate": 0.0}


def mechanisms(tmp: Path) -> None:
    out = run_json(
        "mechanisms.py", "--dataset", "digits", "--train-limit", "1400", "--parties", "3", "--epsilons", "10",
        "--seeds", "0", "--partitions", "imbalanced", "--methods", *MECHANISMS, "--out", str(tmp),
        "--cache-dir", str(tmp / "cache"), "--format", "json", *(x for s in SHRINK for x in ("--set", s)),
    )  # fmt: skip
    assert out["setting"]["split"] == "keyed-hash" and out["setting"]["train_images"] == 1400
    assert "add/remove one example" in out["setting"]["neighbouring"]
    cells = {t["method"]: t for t in out["table"]}
    assert sorted(cells) == sorted(MECHANISMS) and out["rows"] == len(MECHANISMS)
    for method, cell in cells.items():
        assert cell["seeds"] == 1 and cell["partition"] == "imbalanced" and _fraction(cell["accuracy_mean"])
        assert cell["accuracy_mean"] >= FLOOR.get(method, 0.5), (method, cell)
    with (tmp / "mechanisms.csv").open() as handle:
        rows = {r["method"]: r for r in csv.DictReader(handle)}
    assert all(float(r["epsilon"]) <= 10 * (1 + 1e-9) for r in rows.values())
    assert rows["dppl-public-votes"]["released"] == "1" and int(rows["central-dpsgd"]["released"]) > 0
    assert (tmp / "mechanisms.md").read_text().startswith("Neighbouring datasets: add/remove one example")


def mpc(tmp: Path) -> None:
    out = run_json(
        "mpc.py", "--format", "json", "--classes", "2", "--batch", "16", "--queries", "64",
        "--csv", str(tmp / "mpc.csv"),
    )  # fmt: skip
    (row,) = out["rows"]
    assert row["classes"] == 2 and row["batch"] == 16 and row["batches"] == 4 and row["correct"] is True
    assert row["labels_per_s"] > 0 and row["and_gates_per_label"] > 0 and row["bytes_per_label"] > 0
    assert 0 < row["answered_fraction"] < 1  # both outcomes of the threshold occur
    assert (tmp / "mpc.csv").read_text().startswith("classes,batch,")


def prompt_teachers(tmp: Path) -> None:
    out = run_json(
        "prompt_teachers.py", "--teachers", "1", "--shard", "64", "--steps", "1", "--validation", "64",
        "--format", "json",
    )  # fmt: skip
    assert out["setting"]["teachers"] == 1
    (row,) = out["rows"]
    assert row["steps"] == 1 and row["seconds_per_teacher"] > 0
    assert _fraction(row["mean_teacher_accuracy"], 0.3)
    assert all(math.isfinite(v) for v in row["loss_first_last"])


def recipe_sweep(tmp: Path) -> None:
    out = run_json(
        "recipe_sweep.py", "--smoke", "--device", "cpu", "--stages", "recipes,mechanism,baseline,balance",
        "--validation", "200", "--queries", "256", "--out", str(tmp), "--format", "json",
    )  # fmt: skip
    assert out["smoke"] is True and out["device"] == "cpu" and out["validation"] == 200
    (best,) = out["best"]
    assert best["teachers"] == 8 and set(best["curve"]) == {"100", "200"}
    assert all(_fraction(v, 0.15) for v in best["curve"].values())
    lines = [json.loads(line) for line in (tmp / "sweep.jsonl").read_text().splitlines()]
    assert {line["stage"] for line in lines} == {"teachers", "dp", "balance"}
    assert {line.get("tag") for line in lines if line["stage"] == "dp"} == {"main", "curve", "baseline"}
    (balance,) = [line for line in lines if line["stage"] == "balance"]
    assert all(_fraction(balance[k], 0.1) for k in ("plain", "inverse", "sqrt", "logit_adjusted"))


def memory(tmp: Path) -> None:
    out = run_json(
        "memory.py", "--smoke", "--mechanism", "secagg-dpsgd", "--shipped-basis", "--format", "json",
        "--work-dir", str(tmp),
    )  # fmt: skip
    assert set(out) == {"rows", "federations", "growth", "setup"} and out["setup"]["smoke"] is True
    assert out["setup"]["caches"] == "shipped-basis"
    rows = {r["role"]: r for r in out["rows"]}
    assert set(rows) == {"guardian", "student", "teacher"} and rows["teacher"]["processes"] == 2
    for row in rows.values():
        assert (row["mechanism"], row["records"], row["caches"]) == ("secagg-dpsgd", 150, "shipped-basis")
        assert 30 < row["steady_rss_mb"] <= row["peak_rss_mb"] < 8000 and row["cpu_s"] > 0
        assert row["with_children_peak_mb"] >= row["steady_rss_mb"]
    # Each teacher's own feature cache held the basis file `capc federation basis` wrote, and nothing else
    # afterwards: it read the basis there, never computed it; the student's holds it too (beside the public
    # evaluation images' features it computes).
    (basis,) = (tmp / "secagg-dpsgd-150" / "feature-cache").glob("array-*.npy")
    owns = sorted((tmp / "secagg-dpsgd-150" / "own-caches").iterdir())
    assert [p.name for p in owns] == ["hospital-1", "hospital-2", "student"]
    for own in owns[:2]:
        assert sorted(p.name for p in own.iterdir() if not p.name.startswith(".")) == [basis.name]
    assert (owns[2] / basis.name).read_bytes() == basis.read_bytes()
    # Neither the guardian nor a teacher's serving process loads torch: the guardian never featurises, a
    # teacher featurises in a child process of its own (the student does load it, for the public basis).
    assert not rows["guardian"]["torch"] and not rows["teacher"]["torch"] and rows["student"]["torch"]
    (federation,) = out["federations"]
    assert 100 < federation["held"] < 200 and federation["round_s"] > 0 and federation["up_s"] > 0
    assert federation["command"].startswith("capc local up --state-dir ") and out["growth"] == []


def student_memory(tmp: Path) -> None:
    out = run_json("student_memory.py", "--queries", "256", "--format", "json")
    assert set(out) == {"queries", "answered", "chunk_queries", "chunks", "peak_rss_mb", "train_s"}
    assert out["queries"] == 256 and 0 < out["answered"] <= 256 and out["chunks"] >= 1
    assert 50 < out["peak_rss_mb"] < 8000 and out["train_s"] > 0


def tune_baselines(tmp: Path) -> None:
    args = ("tune_baselines.py", "--smoke", "--epsilons", "3", "--out", str(tmp), "--format", "json")
    out = run_json(*args)
    setting = out["setting"]
    assert setting["evaluate_on"] == "validation" and setting["evaluation"] == 288  # never the test set
    assert {m["method"] for m in out["methods"]} == {"dp-fedavg", "central-dpsgd"}
    for m in out["methods"]:
        assert m["candidates"] >= 3 and m["stages"][0] == "before"
        # The chosen setting is the best of what was drawn again, the before setting among the candidates.
        assert _fraction(m["chosen"]["accuracy_mean"], 0.3) and _fraction(m["before"]["accuracy_mean"], 0.1)
    rows = out["rows"]
    assert rows and {r["code"] for r in rows} == {out["code"]}
    for m in out["methods"]:  # one finalist at toy size: the chosen setting is the best first draw
        first = [r for r in rows if r["method"] == m["method"] and r["draw"] == 0]
        chosen = json.dumps(m["chosen"]["settings"], sort_keys=True)
        assert len({r["accuracy"] for r in first}) > 1  # the candidates' settings were applied
        assert max(r["accuracy"] for r in first) == next(
            r["accuracy"] for r in first if r["settings"] == chosen
        )
    assert all(abs(r["epsilon_spent"] - 3) < 0.05 for r in rows)
    # Resumed from its CSV, the same code runs no candidate again and chooses the same.
    again = run_json(*args)
    assert again["rows"] == rows
    assert [m["chosen"]["settings"] for m in again["methods"]] == [
        m["chosen"]["settings"] for m in out["methods"]
    ]


def utility(tmp: Path) -> None:
    out = run_json(
        "utility.py", "--config", str(REPO / "configs" / "digits-quick.yaml"), "--teachers", "40",
        "--epsilons", "10,20", "--seeds", "0", "--generators", "dead_leaves", "--no-baseline",
        "--out", str(tmp), "--runs-dir", str(tmp / "runs"), "--cache-dir", str(tmp / "cache"),
        "--format", "json",
    )  # fmt: skip
    assert out["runs"] == 1 and out["ran"] == 1 and len(out["files"]) == 3
    cells = {t["epsilon"]: t for t in out["table"]}
    assert set(cells) == {10.0, 20.0}
    for eps, cell in cells.items():
        assert cell["method"] == "diet-pate" and cell["teachers"] == 40
        assert cell["epsilon_achieved"] <= eps * (1 + 1e-9) and _fraction(cell["student_accuracy"], 0.2)
    assert cells[20.0]["answered"] >= cells[10.0]["answered"] > 0


def startup(tmp: Path) -> None:
    out = run_json(
        "startup.py", "--format", "json", "--runs", "1", "--heads", "2", "--state-dir", str(tmp / "startup")
    )
    for role in ("guardian", "student", "teacher"):
        assert out[f"{role}_ready_s"] > 0 and out[f"{role}_cpu_s"] > 0 and len(out[f"{role}_ready_runs"]) == 1
        assert out[f"{role}_modules"] > 500  # the count sees the admin API and the numerics each imports
    # The guardian never imports torch, the student not before it trains; the teacher votes with its model.
    assert (out["guardian_imports_torch"], out["student_imports_torch"], out["teacher_imports_torch"]) == (
        False,
        False,
        True,
    )
    # The accountant's scipy.special (0.15 s) loads at the first release, not before a party is ready.
    assert not out["guardian_imports_scipy_special"] and not out["student_imports_scipy_special"]
    assert out["guardian_modules"] < out["teacher_modules"] and out["runs"] == 1 and out["heads"] == 2


#: Script → its smoke test here.
SMOKE: dict[str, Callable[[Path], None]] = {
    "accounting.py": accounting,
    "backbone_speed.py": backbone_speed,
    "dpsgd_recipe.py": dpsgd_recipe,
    "federation.py": federation,
    "gpu_check.py": gpu_check,
    "heads_speed.py": heads_speed,
    "joining.py": joining,
    "linear_probe.py": linear_probe,
    "mechanisms.py": mechanisms,
    "memory.py": memory,
    "mpc.py": mpc,
    "prompt_teachers.py": prompt_teachers,
    "recipe_sweep.py": recipe_sweep,
    "startup.py": startup,
    "student_memory.py": student_memory,
    "tune_baselines.py": tune_baselines,
    "utility.py": utility,
}
#: Smoke tests that take more than ~20 s on the 2-core machine.
SLOW = {"federation.py", "joining.py", "mechanisms.py", "memory.py", "recipe_sweep.py", "startup.py"}
#: Script → the test elsewhere in the suite that runs it at toy size and checks its JSON.
ELSEWHERE = {
    "chaos.py": "tests/e2e/test_restarts.py::test_the_chaos_campaigns_short_version",
    "synth.py": "tests/synth/test_synth_benchmark.py::test_json_output_and_csv",
    # Its measurements and table on the lab federation the fault campaign's short version shares (`--faults`).
    "wan.py": "tests/e2e/test_links.py::test_the_wan_benchmarks_short_version",
}


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=[pytest.mark.slow] if s in SLOW else []) for s in sorted(SMOKE)],
)
def test_the_script_runs_at_toy_size(script: str, tmp_path: Path) -> None:
    SMOKE[script](tmp_path)


def test_every_method_of_the_mechanisms_benchmark_runs_somewhere() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from methods import REGISTRY
    finally:
        sys.path.remove(str(BENCHMARKS))
    names = {m.name for m in REGISTRY}
    assert set(MECHANISMS) | METHODS_ELSEWHERE.keys() == names
    assert not set(MECHANISMS) & METHODS_ELSEWHERE.keys()
    for method, node in METHODS_ELSEWHERE.items():
        path, _, name = node.partition("::")
        text = (REPO / path).read_text()
        assert f"def {name}(" in text and f'"{method}"' in text, f"{node} does not run {method}"


def test_every_script_has_a_smoke_test() -> None:
    """A new script under benchmarks/ (helpers start with ``_``; ``methods/`` is mechanisms.py's package)
    must get a smoke test here or name the test that runs it."""
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert len(scripts) >= 14
    missing = sorted(scripts - SMOKE.keys() - ELSEWHERE.keys())
    assert not missing, f"benchmarks without a smoke test: {missing}; add one to {Path(__file__).name}"
    assert not (SMOKE.keys() | ELSEWHERE.keys()) - scripts, "smoke tests of scripts that no longer exist"
    assert not SMOKE.keys() & ELSEWHERE.keys()
    for script, node in ELSEWHERE.items():
        path, _, name = node.partition("::")
        text = (REPO / path).read_text()
        assert f"def {name}(" in text and script in text, f"{node} does not run benchmarks/{script}"
