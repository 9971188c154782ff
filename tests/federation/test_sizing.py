"""``capc federation plan``: teachers from the data, the mechanism scaled to them, answers from the plan."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.data import partition
from capc_common.errors import InputError
from capc_common.federation import MECHANISM_RATIOS, propose
from capc_common.federation.sizing import heads_for
from capc_common.privacy import plan


@pytest.mark.parametrize(("examples", "bn_batch"), [(20_000, 64), (3_000, 32), (700, 16)])
def test_every_hash_shard_holds_a_batchnorm_chunk(examples, bn_batch):
    heads = heads_for(examples, bn_batch=bn_batch)
    assert examples / heads < 2.5 * bn_batch  # not wastefully few teachers
    rng = np.random.default_rng(examples)
    for seed in range(3):  # real hash partitions of random images
        images = rng.integers(0, 256, size=(examples, 4, 4, 1), dtype=np.uint8)
        shards = partition(
            np.zeros(examples, np.int64), shards=heads, scheme="hash", seed=seed, images=images
        )
        assert min(len(s) for s in shards) >= bn_batch


def test_proposal_scales_the_mechanism_and_plans_the_budget():
    r = propose([20_000, 20_000, 20_000], classes=10, epsilon=6.0)
    assert r["heads"] == [heads_for(20_000, bn_batch=64)] * 3 and r["teachers"] == sum(r["heads"])
    k = r["teachers"]
    m = r["mechanism"]
    assert (m["threshold"], m["sigma1"], m["sigma2"]) == pytest.approx(
        tuple(x * k for x in MECHANISM_RATIOS), rel=1e-3
    )
    again = plan(
        teachers=k,
        classes=10,
        epsilon=6.0,
        delta=1e-5,
        answer_rate=0.5,
        **{x: m[x] for x in ("threshold", "sigma1", "sigma2")},
    )
    assert r["budget"]["order"] == again["order"] and r["expected"]["answered"] == again["answered"]
    q = r["queries"]
    assert q["batch_size"] % q["bn_batch"] == 0 and q["total"] % q["batch_size"] == 0
    assert q["total"] >= r["expected"]["queries"]  # the budget, not the stream, ends the run
    assert r["notes"] == []
    small = propose([2_000, 1_500], classes=10, epsilon=6.0)
    assert small["teachers"] < 200 and any("few answers" in n for n in small["notes"])
    with pytest.raises(InputError, match="cannot hold one teacher"):
        propose([40, 5_000], classes=10, epsilon=6.0)


def test_cli_prints_one_json_object(capc_json):
    r = capc_json(
        "federation",
        "plan",
        "--examples",
        "20000",
        "--examples",
        "10000",
        "--classes",
        "10",
        "--epsilon",
        "4",
    )
    assert r["heads"][0] > r["heads"][1] > 0 and r["budget"]["epsilon"] == 4


def test_the_demos_are_sized_as_the_planner_proposes():
    """`make demo` and `capc demo --quick` run the planner's head counts (each shard holds one chunk)."""
    from capc_services.local.demo import DEMO_OPTIONS, QUICK_OPTIONS

    for options in (DEMO_OPTIONS, QUICK_OPTIONS):
        per_party = min(options.train_limit or 60000, 60000 // options.parties)  # Fashion-MNIST's 60,000
        plan = propose(
            [per_party] * options.parties, classes=10, epsilon=options.epsilon, bn_batch=options.bn_batch
        )
        assert plan["heads"] == [options.teachers_per_party] * options.parties
