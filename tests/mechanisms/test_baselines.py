"""The baselines of ``benchmarks/mechanisms.py``: CaPC's accounting is the Confident-GNMax accountant's, CaPC
improves a querying party with the other parties' labels, DP-FedAvg's statistics release reads back the
clients' records and is charged as one more step, its in-process run (what a validation sweep runs) is the
Flower run, and every new method runs end to end on the digits proxy (the Flower one with a real server and
real client processes) with a sensible accuracy."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from capc_common.aggregation import mechanism_noise
from capc_common.data import load_dataset, site_parts
from capc_common.errors import InputError
from capc_common.learn.heads import HeadRecipe
from capc_common.mechanisms import ConfidentGNMax, calibrate, normalise
from capc_common.mechanisms.capc import capc_epsilon, capc_mechanism, capc_teachers, run_capc
from capc_common.mechanisms.central import PartyData
from capc_common.mechanisms.training import standardiser
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
    assert table["dp-fedavg"]["released"] == 9  # the DP statistics and 8 rounds


@pytest.fixture(scope="module")
def bench() -> Iterator[SimpleNamespace]:
    """The benchmark modules DP-FedAvg is made of (``benchmarks/`` on the path while they are imported)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import _baselines
        import _flower_app
        from methods import common, fedavg

        yield SimpleNamespace(baselines=_baselines, app=_flower_app, common=common, fedavg=fedavg)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_the_statistics_release_reads_back_the_clients_records(
    bench: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each client releases the sums of its records' ``(u, u², 1)·C/√3``, each clipped to ``C`` (one DP-SGD
    step's sensitivity, so the release is charged as one more step), with ``zC`` noise on each; the server's
    sum, decoded, is the federation's standardiser of the pooled records (no noise drawn)."""
    h = bench.common.HYPER["fedavg"]
    monkeypatch.setitem(h, "clip", 0.1)
    monkeypatch.setitem(h, "unit_variance", True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16))
    x *= rng.uniform(0.2, 1.0, size=(300, 1)) / np.linalg.norm(x, axis=1, keepdims=True)
    plan = {"sampling_rate": 1.0, "clip": 0.1, "noise_multiplier": 0.0}
    total = bench.app.noisy_statistics(x[:120], plan, rng) + bench.app.noisy_statistics(x[120:], plan, rng)
    mean, scale = bench.fedavg.statistics_map(total, dim=16, noise_multiplier=0.0, clients=2)
    want = standardiser(
        x.sum(axis=0), (x * x).sum(axis=0), 300.0, floor=h["variance_floor"], noise=0.0, unit_variance=True
    )
    np.testing.assert_allclose(mean, want[0], rtol=1e-10)
    np.testing.assert_allclose(scale, want[1], rtol=1e-10)
    # A record of any norm moves its client's release by at most C.
    assert np.linalg.norm(bench.app.noisy_statistics(np.full((1, 16), 5.0), plan, rng)) <= 0.1 * (1 + 1e-12)
    # The noise is N(0, (zC)²) on every coordinate: 400 releases of no records at z 2.
    empty = np.zeros((0, 16))
    noise = np.stack(
        [bench.app.noisy_statistics(empty, {**plan, "noise_multiplier": 2.0}, rng) for _ in range(400)]
    )
    assert noise.shape == (400, 33) and abs(noise.std() / 0.2 - 1) < 0.03


def test_dp_fedavg_charges_the_statistics_release_as_one_more_step(
    bench: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record is in one client, so its ε is that client's releases: ``rounds × local_steps`` steps and the
    statistics release. Full batch, ``T`` Gaussian releases of multiplier ``z`` compose to one of ``z/√T``:
    the noise must be ``√T`` times one release's at the same ε."""
    parties, ex, ey = _digits_parties(3)
    h = bench.common.HYPER["fedavg"]
    fields = {"rounds": 3, "local_steps": 2, "sampling_rate": 1.0, "projection": 0, "statistics": True,
              "unit_variance": True, "clip": 0.1, "learning_rate": 30.0, "step_noise": 0.0}  # fmt: skip
    for key, value in fields.items():
        monkeypatch.setitem(h, key, value)
    orders, delta = bench.common.ORDERS, bench.common.DELTA
    one = calibrate(lambda z: epsilon_from_rdp(orders, orders / (2 * z * z), delta=delta)[0], target=3.0)
    run = functools.partial(bench.fedavg.dp_fedavg_flower, parties, ex, ey, epsilon=3.0, seed=0, basis=None)
    out = run(python=None)
    assert out["releases"] == 7 and out["released"] == 4  # the statistics phase and 3 rounds
    assert out["noise_multiplier"] == pytest.approx(math.sqrt(7) * one, rel=3e-3)
    assert 3.0 * 0.995 <= out["epsilon"] <= 3.0 * (1 + 1e-9) and out["accuracy"] > 0.5
    monkeypatch.setitem(h, "statistics", False)
    out = run(python=None)
    assert out["releases"] == 6 and out["noise_multiplier"] == pytest.approx(math.sqrt(6) * one, rel=3e-3)


def test_the_statistics_release_samples_each_record_at_the_rate_it_is_charged_at(
    bench: SimpleNamespace,
) -> None:
    """Charged as a step at Poisson rate q, the release must sum a Poisson sample at rate q: its decoded count
    (the third block, ``C/√3`` per record) averages ``q·n`` over draws, not n."""
    rng = np.random.default_rng(1)
    x = normalise(rng.normal(size=(300, 8)))
    plan = {"sampling_rate": 0.3, "clip": 0.1, "noise_multiplier": 0.0}
    counts = [bench.app.noisy_statistics(x, plan, rng)[-1] * math.sqrt(3) / 0.1 for _ in range(200)]
    assert abs(np.mean(counts) - 90) < 3 and np.std(counts) > 3  # binomial(300, 0.3): 90 ± 7.9


def test_the_clients_add_the_noise_calibrated_to_the_budget(
    bench: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One client, one full-batch step from zero at a fixed step L: the head is ``−L(g + n)/N`` with ``n`` the
    client's N(0, (zC)²) noise, so two runs differ by noise of σ ``√2·L·zC/N`` on each weight, with ``z`` the
    multiplier calibrated to ε — a client that drew less noise than it is charged for fails here."""
    parties, ex, ey = _digits_parties(1)
    h = bench.common.HYPER["fedavg"]
    fields = {"rounds": 1, "local_steps": 1, "sampling_rate": 1.0, "projection": 0, "statistics": False,
              "unit_variance": False, "clip": 0.1, "learning_rate": 1.0, "step_noise": 0.0,
              "server_momentum": 0.0}  # fmt: skip
    for key, value in fields.items():
        monkeypatch.setitem(h, key, value)
    runs = [
        bench.fedavg.dp_fedavg_flower(parties, ex, ey, epsilon=3.0, seed=0, basis=None, python=None)
        for _ in range(2)
    ]
    z, n = runs[0]["noise_multiplier"], len(parties[0].labels)
    assert z > 1  # one step at ε 3: z ≈ 1.6
    spread = np.std(runs[0]["head"] - runs[1]["head"])
    assert spread / (math.sqrt(2) * 1.0 * z * 0.1 / n) == pytest.approx(1.0, abs=0.1)


@pytest.mark.slow
def test_the_in_process_run_is_the_flower_run_when_no_noise_is_drawn(
    bench: SimpleNamespace, require: Callable[[bool, str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a validation sweep runs (:func:`_flower_app.simulate`) computes what the Flower server and client
    processes compute — both phases, FedAvgM's momentum included — so a setting chosen in process is the
    setting Flower runs. Full batch and no noise: nothing random is drawn, so they agree to rounding."""
    problem = _flower_problem()
    require(problem is None, f"Flower's environment could not be built here: {problem}")
    monkeypatch.setitem(bench.common.HYPER["fedavg"], "clip", 0.1)
    monkeypatch.setitem(bench.common.HYPER["fedavg"], "unit_variance", True)
    parties, _, _ = _digits_parties(3)
    shards = [(p.features.astype(np.float32), p.labels) for p in parties]
    plan = {"rounds": 3, "local_steps": 2, "sampling_rate": 1.0, "noise_multiplier": 0.0, "clip": 0.1,
            "learning_rate": 30.0, "step_noise": 0.0, "server_momentum": 0.9}  # fmt: skip
    standardise = functools.partial(bench.fedavg.statistics_map, dim=64, noise_multiplier=0.0, clients=3)
    python = bench.baselines.flower_python(REPO / "runs" / "cache")
    flower, ran = bench.baselines.dp_fedavg(shards, python=python, plan=plan, standardise=standardise)
    here, simulated = bench.baselines.dp_fedavg(shards, python=None, plan=plan, standardise=standardise)
    for a, b in zip(ran["map"], simulated["map"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert np.abs(here).max() > 0.1  # it learned something
    np.testing.assert_allclose(flower, here, rtol=1e-9, atol=1e-12)
