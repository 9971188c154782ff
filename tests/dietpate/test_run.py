"""End to end: ``capc dietpate run`` on a tiny digits configuration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capc_common.aggregation import confident_rule, draw_confident_noise
from capc_common.dietpate import load_config, prepare, run
from capc_common.learn import load_student
from capc_common.privacy import SeededNoise

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")

REPORT_KEYS = {
    "student_accuracy",
    "mean_teacher_accuracy",
    "best_teacher_accuracy",
    "queries",
    "answered",
    "epsilon",
    "delta",
    "epsilon_data_dependent",
    "seconds",
}


def test_cli_run_writes_report_student_and_plots(capc, write_config, tmp_path):
    config = write_config()
    proc = capc(
        "dietpate", "run", "--config", str(config), "--epsilon", "30", "--format", "json", timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report.keys() >= REPORT_KEYS
    assert 0 < report["answered"] <= report["queries"] <= 128
    assert 0 < report["epsilon"] <= 30 and report["delta"] == 1e-5
    assert 0.0 <= report["student_accuracy"] <= 1.0
    assert report["best_teacher_accuracy"] >= report["mean_teacher_accuracy"] > 0.5
    out = tmp_path / "out"
    assert json.loads((out / "report.json").read_text())["epsilon"] == report["epsilon"]
    for name in ("accuracy_vs_epsilon.png", "consensus.png", "student.safetensors", "labels.npz"):
        assert (out / name).stat().st_size > 0
    head, card = load_student(out / "student.safetensors")
    assert card["privacy"]["epsilon"] == report["epsilon"] and head.heads == 1


def test_bad_config_exits_2_before_work(capc, write_config, tmp_path):
    proc = capc(
        "dietpate",
        "run",
        "--config",
        str(write_config(queries={"generator": "nope"})),
        env={"OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2
    assert "unknown generator 'nope'" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_labels_are_reproducible_and_match_the_federation_rule(write_config, tmp_path):
    """With the same seeded noise a federation (canonical draws + plaintext rule) releases the same labels."""
    config = load_config(write_config(student={"pseudo_labels": False}, plots=False))
    lines: list[str] = []
    first = run(config, cache_dir=tmp_path / "cache")  # computes everything and fills the cache
    labels = np.load(tmp_path / "out" / "labels.npz")
    again = run(
        config.with_overrides(output=str(tmp_path / "again")), cache_dir=tmp_path / "cache", log=lines.append
    )
    assert "teachers: reused from the cache" in lines
    np.testing.assert_array_equal(np.load(tmp_path / "again" / "labels.npz")["label"], labels["label"])
    assert again["epsilon"] == first["epsilon"]
    assert again["student_accuracy"] == first["student_accuracy"]

    # Recompute the histograms independently and replay the guardian's draws batch by batch.
    from capc_common.learn import shard_features, train_teachers
    from capc_common.synth import generate

    prep = prepare(config)
    feats, owners, index = shard_features(prep.featurizer, prep.train.images, prep.shards, bn_batch=16)
    t = config.teachers
    ensemble = train_teachers(
        feats,
        prep.train.labels[index],
        owners,
        teachers=t.count,
        classes=10,
        backbone_sha256=prep.featurizer.sha256,
        bn_batch=16,
        l2=t.l2,
        max_iter=t.max_iter,
    )
    guardian = SeededNoise("tiny-run")
    m = config.mechanism
    start = 0
    for end in labels["batch_end"]:
        images = generate(
            "dead_leaves", seed=1, start=int(start), count=int(end - start), height=8, width=8, channels=1
        )
        hist = ensemble.votes(prep.featurizer.extract(images, bn_batch=16, mode="current"))
        z1, z2 = draw_confident_noise(guardian, batch=len(hist), classes=10, sigma1=m.sigma1, sigma2=m.sigma2)
        np.testing.assert_array_equal(
            confident_rule(hist, threshold=m.threshold, z1=z1, z2=z2), labels["label"][start:end]
        )
        start = end
