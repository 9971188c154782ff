"""End to end: ``capc dietpate run`` on a tiny digits configuration.

One real command-line run (the module-scoped ``cli_run`` fixture) is shared: its report and files are
checked, then in-process runs reuse its cache to check reproducibility, the federation's rule and the
rigour of the accuracy-vs-ε curve.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from capc_cli.main import main
from capc_common.aggregation import draw_confident_noise, draw_student_noise, mechanism_noise
from capc_common.dietpate import load_config, prepare, run
from capc_common.learn import load_student
from capc_common.mechanisms import confident_rule

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")

REPORT_KEYS = {
    "student_accuracy",
    "mean_teacher_accuracy",
    "best_teacher_accuracy",
    "queries",
    "answered",
    "epsilon",
    "epsilon_spent",
    "delta",
    "epsilon_data_dependent",
    "seconds",
}


def _config(cli_run, **overrides):
    """The shared run's config with the same command-line overrides (and any others)."""
    base = load_config(cli_run["config"]).with_overrides(**cli_run["overrides"])
    data = base.model_dump()
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return type(base).model_validate(data)


def test_cli_run_writes_report_student_and_plots(cli_run):
    report, out = cli_run["report"], cli_run["out"]
    assert report.keys() >= REPORT_KEYS
    assert report["teachers"] == cli_run["overrides"]["teachers"]
    assert report["seed"] == cli_run["overrides"]["seed"]
    assert 0 < report["answered"] <= report["queries"] <= 128
    # The published ε is the guarantee, the filter's limit (the --epsilon override); what the charges
    # added up to is the odometer beside it.
    assert report["epsilon"] == 30 and 0 < report["epsilon_spent"] <= 30 and report["delta"] == 1e-5
    assert report["accountant"].startswith("confident-gnmax: ")
    assert 0.0 <= report["student_accuracy"] <= 1.0
    assert 0 < report["epsilon"] <= 30 and report["delta"] == 1e-5
    assert report["best_teacher_accuracy"] >= report["mean_teacher_accuracy"] > 0.5
    assert json.loads((out / "report.json").read_text())["epsilon_spent"] == report["epsilon_spent"]
    for name in ("accuracy_vs_epsilon.png", "student.safetensors", "labels.npz"):
        assert (out / name).stat().st_size > 0
    head, card = load_student(out / "student.safetensors")
    assert head.heads == 1
    assert (card["privacy"]["epsilon"], card["privacy"]["epsilon_spent"]) == (30, report["epsilon_spent"])
    assert card["privacy"]["accountant"] == report["accountant"]
    assert "depends on the other images of its batch" in card["inference"]["note"]
    # Without --diagnostics nothing computed from the noiseless votes is reported or drawn, and what is
    # not private (the teachers' own accuracies) says so.
    assert "diagnostics_NOT_PRIVATE" not in report and "label_agreement_with_plurality" not in str(report)
    assert not list(out.glob("consensus*")) and report["not_private"].startswith("NOT PRIVATE")
    # Hash-assigned shards: ε holds for adding or removing one example, and the report says so.
    assert report["neighbouring"] == card["privacy"]["neighbouring"] == "add/remove one example"


def test_the_reported_accuracy_is_the_saved_students_and_beats_chance(cli_run):
    """Issue 25.8: recompute the student's accuracy from its saved file on the evaluation set, featurised as
    the run does (chunks of eval_bn_batch, current statistics); it must equal the report's and be far above
    chance (10 classes) — a student trained on shuffled labels, or a report of another model, fails."""
    prep = prepare(_config(cli_run))
    cfg = prep.config
    features = prep.student_featurizer.extract(
        prep.evaluation.images, bn_batch=cfg.student.eval_bn_batch, mode=cfg.backbone.bn_mode
    )
    head, _ = load_student(cli_run["out"] / "student.safetensors")
    accuracy = float((head.predict(features)[0] == prep.evaluation.labels).mean())
    assert cli_run["report"]["student_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert accuracy > 0.25  # 0.33 measured (seeded run); chance is 0.10


def test_curve_points_are_runs_at_smaller_budgets(cli_run):
    report = cli_run["report"]
    curve = report["curve"]
    assert [c["epsilon_target"] for c in curve] == [15.0, 20.0, 30.0]  # 50 > budget is dropped
    for c in curve:
        assert 0 < c["epsilon_spent"] <= c["epsilon_target"] and 0 < c["answered"] <= c["queries"]
    assert [c["queries"] for c in curve] == sorted(c["queries"] for c in curve)
    last = curve[-1]  # the run's own budget replays to exactly the run
    assert (last["queries"], last["epsilon_target"], last["epsilon_spent"], last["student_accuracy"]) == (
        report["queries"],
        report["epsilon"],
        report["epsilon_spent"],
        report["student_accuracy"],
    )


def test_a_curve_point_is_exactly_the_run_at_that_budget(cli_run, tmp_path):
    """Without tail shrinking a smaller budget asks the same batches with the same seeded draws, so the
    curve's replay must match a real run at that budget: same queries, ε and labels."""
    no_shrink = {"shrink_tail": False}
    big = run(
        _config(cli_run, queries=no_shrink, plots=False, output=str(tmp_path / "big")),
        cache_dir=cli_run["cache"],
    )
    small = run(
        _config(cli_run, queries=no_shrink, plots=False, output=str(tmp_path / "small")).with_overrides(
            epsilon=15.0
        ),
        cache_dir=cli_run["cache"],
    )
    point = next(c for c in big["curve"] if c["epsilon_target"] == 15.0)
    assert small["queries"] < big["queries"]
    assert (point["queries"], point["epsilon_spent"], point["answered"]) == (
        small["queries"],
        small["epsilon_spent"],
        small["answered"],
    )
    assert point["epsilon_data_dependent"] == pytest.approx(small["epsilon_data_dependent"])
    np.testing.assert_array_equal(
        np.load(tmp_path / "small" / "labels.npz")["label"],
        np.load(tmp_path / "big" / "labels.npz")["label"][: small["queries"]],
    )


def test_diagnostics_of_the_noiseless_votes_only_on_request_and_marked_not_private(cli_run, tmp_path, capsys):
    """``--diagnostics`` (the command line in process, teachers and features from the shared run's cache):
    the figures of the noiseless votes appear, in the JSON and in the plot's file name, as NOT PRIVATE."""
    out = tmp_path / "diagnostics"
    overrides = [f"--{k}={v}" for k, v in cli_run["overrides"].items()]
    with pytest.raises(SystemExit) as exit_:
        main(["dietpate", "run", "--config", str(cli_run["config"]), *overrides, "--output", str(out),
              "--cache-dir", str(cli_run["cache"]), "--diagnostics", "--format", "json"])  # fmt: skip
    assert exit_.value.code == 0
    report = json.loads(capsys.readouterr().out)
    diagnostics = report["diagnostics_NOT_PRIVATE"]
    assert diagnostics["note"].startswith("NOT PRIVATE")
    assert 0 < diagnostics["label_agreement_with_plurality"] <= 1
    assert 0 < diagnostics["query_consensus_mean"] <= 1
    assert (out / "consensus-NOT-PRIVATE.png").stat().st_size > 0
    assert str(out / "consensus-NOT-PRIVATE.png") in report["files"] and not (out / "consensus.png").exists()
    # The private outputs are those of the run without diagnostics.
    assert (report["epsilon_spent"], report["student_accuracy"]) == (
        cli_run["report"]["epsilon_spent"],
        cli_run["report"]["student_accuracy"],
    )


def test_bad_config_exits_2_before_work(write_config, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["dietpate", "run", "--config", str(write_config(queries={"generator": "nope"}))])
    assert exit_.value.code == 2
    assert "unknown generator 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_labels_are_reproducible_and_match_the_federation_rule(cli_run, tmp_path):
    """With the same seeded noise a federation (canonical draws + plaintext rule) releases the same labels."""
    config = _config(cli_run, output=str(tmp_path / "again"), plots=False)
    labels = np.load(cli_run["out"] / "labels.npz")
    lines: list[str] = []
    again = run(config, cache_dir=cli_run["cache"], log=lines.append)  # another process, from the cache
    assert "teachers: reused from the cache" in lines
    np.testing.assert_array_equal(np.load(tmp_path / "again" / "labels.npz")["label"], labels["label"])
    assert again["epsilon_spent"] == cli_run["report"]["epsilon_spent"]
    assert again["student_accuracy"] == cli_run["report"]["student_accuracy"]

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
        recipe=t.recipe.recipe(),
        seed=config.seed,
    )
    noise = mechanism_noise(seed="tiny-run")  # the guardian's and the student's seeded sources
    m = config.mechanism
    start = 0
    for end in labels["batch_end"]:
        images = generate(
            "dead_leaves", seed=1, start=int(start), count=int(end - start), height=8, width=8, channels=1
        )
        hist = ensemble.votes(prep.featurizer.extract(images, bn_batch=16, mode="current"))
        z1, z2 = draw_confident_noise(
            noise.guardian, batch=len(hist), classes=10, sigma1=m.sigma1, sigma2=m.sigma2
        )
        z1 = z1 + draw_student_noise(noise.student, batch=len(hist), sigma1=m.sigma1)
        np.testing.assert_array_equal(
            confident_rule(hist, threshold=m.threshold, z1=z1, z2=z2), labels["label"][start:end]
        )
        start = end
