"""Bad run configurations fail with a precise message before any work starts."""

from __future__ import annotations

import pytest
import yaml

from capc_common.dietpate import load_config, prepare
from capc_common.errors import InputError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"teachers": {"count": 0}}, r"teachers\.count"),
        ({"teacher": {"count": 3}}, r"teacher: Extra inputs are not permitted"),
        ({"queries": {"batch_size": 40}}, "multiple of backbone.bn_batch 16"),
        ({"mechanism": {"threshold": None}}, "confident-gnmax needs threshold"),
        ({"mechanism": {"name": "lnmax"}}, "lnmax needs scale"),
        ({"budget": {"delta": 2}}, r"budget\.delta"),
        ({"teachers": {"partition": "dirichlet"}}, "needs teachers.alpha"),
        ({"dataset": {"evaluate_on": "validation"}}, "validation > 0"),
        ({"teachers": {"recipe": {"optimizer": "lbfgs", "l2": 0}}}, r"teachers\.recipe.*needs l2 > 0"),
    ],
)
def test_schema_errors_name_the_key(write_config, overrides, message):
    with pytest.raises(InputError, match=message):
        load_config(write_config(**overrides))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("teachers: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(InputError, match="mapping"):
        load_config(bad)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dataset": {"name": "imagenet"}}, "unknown dataset 'imagenet'"),
        ({"queries": {"generator": "mandelbrot"}}, "unknown generator 'mandelbrot'"),
        ({"teachers": {"count": 5000, "partition": "iid"}}, "5000 teachers but only 1438 training images"),
        ({"backbone": {"name": "scatter-28x28x1"}}, "takes 28x28x1 images but the dataset has 8x8x1"),
        ({"budget": {"epsilon": 0.05}}, "too small for a single batch of 16 queries"),
    ],
)
def test_semantic_errors_come_before_any_work(write_config, tmp_path, overrides, message):
    config = load_config(write_config(**overrides))
    with pytest.raises(InputError, match=message):
        prepare(config)
    assert not (tmp_path / "out").exists()  # nothing written for a refused run


def test_short_hash_shards_abstain_instead_of_refusing_the_run(write_config):
    """Issue 25.2: under the hash partition whether a run (or a party) trains must not hinge on one example,
    so shards shorter than one BatchNorm chunk are announced and their teachers abstain."""
    said: list[str] = []
    prep = prepare(load_config(write_config(teachers={"count": 100})), log=said.append)
    assert sum(len(s) < 16 for s in prep.shards) > 0
    assert any("teacher shards hold fewer than one BatchNorm chunk" in line for line in said)


def test_overrides_are_revalidated(write_config):
    config = load_config(write_config())
    assert config.with_overrides(epsilon=3.0, teachers=7, seed=5).teachers.count == 7
    with pytest.raises(InputError, match=r"budget\.epsilon"):
        config.with_overrides(epsilon=-1.0)


def test_shipped_configs_are_valid():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    assert configs, "configs/ ships at least one run config"
    for path in configs:
        load_config(path)
        assert isinstance(yaml.safe_load(path.read_text()), dict)


def test_a_run_that_cuts_the_training_set_by_position_states_no_per_example_relation(write_config):
    """`dataset.validation` / `train_limit` cut by a permutation of the data's size: adding or removing one
    example re-draws the cut, so such a run's report must not claim add/remove (review of issue 10.9)."""
    from capc_common.dietpate.report import _neighbouring

    assert _neighbouring(load_config(write_config())) == "add/remove one example"
    for dataset in ({"validation": 100}, {"train_limit": 1000}):
        assert _neighbouring(load_config(write_config(dataset=dataset))).startswith("none per example")
    iid = load_config(write_config(teachers={"partition": "iid"}))
    assert _neighbouring(iid) == "replace one example"
