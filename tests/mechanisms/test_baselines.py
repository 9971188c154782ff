"""The baselines of ``benchmarks/mechanisms.py``: CaPC's accounting is the Confident-GNMax accountant's, CaPC
improves a querying party with the other parties' labels, and every new method runs end to end on the
digits proxy (the Flower one with a real server and real client processes) with a sensible accuracy."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from capc_common.aggregation import mechanism_noise
from capc_common.data import load_dataset, site_parts
from capc_common.errors import InputError
from capc_common.learn.heads import HeadRecipe
from capc_common.mechanisms import ConfidentGNMax, normalise
from capc_common.mechanisms.capc import capc_epsilon, capc_mechanism, capc_teachers, run_capc
from capc_common.mechanisms.central import PartyData
from capc_common.privacy import ConfidentGNMaxAccountant
from capc_common.privacy.analysis import epsilon_from_rdp

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")

REPO = Path(__file__).resolve().parents[2]
ORDERS = np.array([2.0, 4.0, 8.0, 16.0, 32.0, 64.0])


def test_capc_epsilon_is_the_confident_gnmax_accountants_worst_case():
    m = ConfidentGNMax(classes=10, teachers=90, threshold=54, sigma1=40, sigma2=20)
    acc = ConfidentGNMaxAccountant(
        teachers=90, classes=10, threshold=54, sigma1=40, sigma2=20, noise="discrete"
    )
    # every one of the 300 queries charged screening plus an answer (λ/σ2² = λ/400 at σ2 = 20)
    rdp = 300 * (acc.query_rdp(ORDERS) + ORDERS / 400)
    expected = epsilon_from_rdp(ORDERS, rdp, delta=1e-5)[0]
    assert capc_epsilon(m, queries=300, orders=ORDERS, delta=1e-5) == pytest.approx(expected, rel=1e-12)


def test_capc_mechanism_is_calibrated_to_the_budget():
    m = capc_mechanism(
        classes=10,
        teachers=90,
        budget_queries=200,
        epsilon=3.0,
        delta=1e-5,
        orders=ORDERS,
        threshold_share=0.6,
        sigma1_ratio=2.0,
    )
    assert m.threshold == pytest.approx(54) and m.sigma1 == pytest.approx(2 * m.sigma2)
    assert capc_epsilon(m, queries=200, orders=ORDERS, delta=1e-5) <= 3.0
    looser = ConfidentGNMax(
        classes=10, teachers=90, threshold=54, sigma1=2 * m.sigma2 * 0.99, sigma2=m.sigma2 * 0.99
    )
    assert capc_epsilon(looser, queries=200, orders=ORDERS, delta=1e-5) > 3.0  # the smallest σ2 that fits


def _digits_parties(parties: int) -> tuple[list[PartyData], np.ndarray, np.ndarray]:
    train, test = load_dataset("digits", split="train"), load_dataset("digits", split="test")
    x = normalise(train.images.reshape(len(train.labels), -1).astype(np.float32))
    y = train.labels.astype(np.int64)
    shards = site_parts(train.images, y, parts=parties, seed=0)
    ex = normalise(test.images.reshape(len(test.labels), -1).astype(np.float32))
    found = [PartyData(f"p{i}", x[s], y[s], images=train.images[s]) for i, s in enumerate(shards)]
    return found, ex, test.labels.astype(np.int64)


def test_capc_labels_a_querying_partys_records_with_the_other_parties_votes():
    parties, ex, ey = _digits_parties(4)
    recipe = HeadRecipe(steps=50, lr=0.1)
    # nearly noiseless: the other parties' ensemble labels the queries almost as their owner does
    m = ConfidentGNMax(classes=10, teachers=9, threshold=4, sigma1=0.5, sigma2=0.5)
    out = run_capc(
        parties,
        mechanism=m,
        queriers=[0, 2],
        queries_per_querier=120,
        teachers_per_party=3,
        recipe=recipe,
        noise=mechanism_noise(seed="capc"),
    )
    assert out.queriers == [0, 2] and out.queries == [120, 120] and out.heads.heads == 2
    assert all(60 < a <= 120 for a in out.answered)
    assert min(out.label_accuracy) > 0.85
    assert (out.heads.predict(ex) == ey[None, :]).mean(axis=1).min() > 0.85
    # teachers trained once and passed in (as the benchmark does for every ε) give the same run
    again = run_capc(
        parties,
        mechanism=m,
        queriers=[0, 2],
        queries_per_querier=120,
        teachers_per_party=3,
        recipe=recipe,
        noise=mechanism_noise(seed="capc"),
        teachers=capc_teachers(parties, per_party=3, classes=10, recipe=recipe, seed=0),
    )
    assert again.answered == out.answered
    same = [np.array_equal(again.heads.params[k], out.heads.params[k]) for k in out.heads.params]
    assert all(same)
    with pytest.raises(InputError, match="build it with teachers=12"):
        run_capc(
            parties, mechanism=m, queriers=[0], queries_per_querier=5, teachers_per_party=4, recipe=recipe
        )


def test_capc_teachers_move_one_head_when_one_record_is_removed():
    """Issue 25.4: a party's records are dealt to its heads by content hash, so removing one record retrains
    exactly one head (its part lost that record) and leaves every other head bit for bit the same."""
    parties, _, _ = _digits_parties(3)
    recipe = HeadRecipe(steps=20, lr=0.1)
    heads, owner = capc_teachers(parties, per_party=4, classes=10, recipe=recipe, seed=5)
    assert list(owner) == [0] * 4 + [1] * 4 + [2] * 4
    for gone in (0, 7, len(parties[1].labels) - 1):
        p = parties[1]
        keep = np.delete(np.arange(len(p.labels)), gone)
        fewer = [
            parties[0],
            PartyData(p.name, p.features[keep], p.labels[keep], images=p.images[keep]),
            parties[2],
        ]
        again, _ = capc_teachers(fewer, per_party=4, classes=10, recipe=recipe, seed=5)
        differ = [
            h
            for h in range(12)
            if not all(np.array_equal(heads.params[k][h], again.params[k][h]) for k in heads.params)
        ]
        assert len(differ) == 1 and 4 <= differ[0] < 8  # one of party 1's heads
    with pytest.raises(InputError, match="carry no images"):
        capc_teachers([PartyData("x", p.features, p.labels)], per_party=2, classes=10, recipe=recipe, seed=0)


def _run_benchmark(tmp_path: Path, methods: list[str]) -> dict[str, dict[str, object]]:
    """``benchmarks/mechanisms.py`` on the digits proxy, shortened; its JSON table by method."""
    fast = ["local.steps=50", "capc.teachers_per_party=3", "capc.budget_queries=60"]
    fast += ["cnn.epochs=2", "cnn.batch=128", "fedavg.rounds=8", "fedavg.learning_rate=4.0"]
    args = ["--dataset", "digits", "--train-limit", "1400", "--parties", "3", "--epsilons", "10"]
    args += ["--seeds", "0", "--partitions", "iid", "--methods", *methods, "--out", str(tmp_path)]
    args += [x for s in fast for x in ("--set", s)] + ["--format", "json"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "mechanisms.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = {t["method"]: t for t in json.loads(proc.stdout)["table"]}
    assert sorted(table) == sorted(methods)
    for method in methods:
        assert 0.5 < table[method]["accuracy_mean"] <= 1.0, (method, table[method])
    return table


@pytest.mark.slow
def test_benchmark_runs_every_baseline_end_to_end(tmp_path: Path) -> None:
    table = _run_benchmark(tmp_path, ["local-only", "capc-fair", "capc-greedy", "cnn-dpsgd"])
    # local-only is non-private: CaPC adds the others' labels and must not fall far below it
    assert table["capc-greedy"]["accuracy_mean"] > table["local-only"]["accuracy_mean"] - 0.1


def _flower_problem() -> str | None:
    """Why Flower's own virtualenv cannot be had here (built from PyPI on first use), or None."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from _baselines import flower_python

        flower_python(REPO / "runs" / "cache", timeout=600)
    except RuntimeError as exc:
        return str(exc)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return None


@pytest.mark.slow
def test_dp_fedavg_runs_on_real_flower_processes(
    tmp_path: Path, require: Callable[[bool, str], None]
) -> None:
    """Needs Flower's own virtualenv (its pins conflict with the project's), built from PyPI on first use.
    A machine that cannot build it skips with pip's reason (fails under CI=true); once built, a failing run
    fails the test."""
    problem = _flower_problem()
    require(problem is None, f"Flower's environment could not be built here: {problem}")
    table = _run_benchmark(tmp_path, ["dp-fedavg"])
    assert table["dp-fedavg"]["released"] == 8
