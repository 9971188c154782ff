"""``capc teacher personalise`` refuses what it cannot compare, before it computes anything; ``capc local up``
plans each hospital's holdout from its planned size.

The students here are written in the published formats by the functions the student party publishes with
(``save_student``; ``head.npy`` beside its card), over a site of real Fashion-MNIST images; the federations
that really publish are in tests/e2e (test_federation.py, test_release_federation.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from protocol_force import protocol_force
from sites_harness import federation_dict

from capc_common.data import holdout_fraction, load_dataset
from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_common.learn.heads import HeadEnsemble, HeadRecipe
from capc_common.learn.student import StudentFit, save_student
from capc_services.local.provision import LocalOptions, provision
from capc_services.teacher.personal import personalise_site
from capc_services.teacher.settings import TeacherSettings


def _site(tmp: Path, federation: dict, **fields: object) -> Path:
    """hospital-a's site file over 300 Fashion-MNIST images (``fields`` override the site file's)."""
    tmp.mkdir(parents=True, exist_ok=True)
    FederationConfig.from_dict(federation).save(tmp / "federation.yaml")
    if not (tmp / "site.npz").exists():
        data = load_dataset("fashion-mnist", split="train")
        np.savez(tmp / "site.npz", images=data.images[:300], labels=data.labels[:300])
    site = {
        "party": "hospital-a",
        "federation": "federation.yaml",
        "tls": {"ca": "ca.pem", "cert": "a.pem", "key": "a.key"},
        "admin": {"token_file": "token"},
        "student_address": "127.0.0.1:1",
        "guardian_address": "127.0.0.1:2",
        "heads": "state/heads.safetensors",
        "cap": {"epsilon": 10.0, "record": "state/cap.jsonl"},
        "data": {"dataset": f"npz:{tmp / 'site.npz'}"},
        **fields,
    }
    path = tmp / "hospital-a.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def _selection_student(out: Path, config: FederationConfig, **card: object) -> Path:
    """A student in the selection mechanisms' published format (its card as the student writes it)."""
    head = HeadEnsemble("linear", {"w_out": torch.zeros(1, 10, 8), "b_out": torch.zeros(1, 10)}, 10)
    base = {
        "config_hash": config.config_hash(),
        "backbone": {"name": config.backbone.name, "sha256": config.backbone.sha256},
    }
    path = out / "student.safetensors"
    save_student(path, StudentFit(head, HeadRecipe(), 0), card={**base, **card})
    return path


def _refused(site: Path, match: str, **kwargs: object) -> None:
    with pytest.raises(InputError, match=match):
        personalise_site(site, cnn=False, **kwargs)  # type: ignore[arg-type]


def test_personalise_refuses_what_it_cannot_compare(tmp_path: Path) -> None:
    fed = federation_dict()
    site = _site(tmp_path, fed)
    config = TeacherSettings.load(site).federation_config
    published = tmp_path / "published"
    published.mkdir()
    # Nothing published yet, and no student site beside this one to find it by.
    _refused(
        site, r"no published student at .*student\.safetensors.*progress says `published`", student=published
    )
    _refused(site, r"no --student given, and no student site file .*student\.yaml", student=None)
    # A student of another federation, or of another backbone.
    _selection_student(published, config, config_hash="0" * 64)
    _refused(site, r"published by a federation of config hash 0000000000000000…", student=published)
    _selection_student(published, config, backbone={"name": "other", "sha256": "ab" * 32})
    _refused(site, r"backbone abababababababab….*another federation's student", student=published)
    # A release mechanism's head where the federation runs a selection mechanism, and a head without a card.
    np.save(published / "head.npy", np.zeros((10, 9)))
    _refused(site, r"head\.npy has no model_card\.json beside it", student=published / "head.npy")
    (published / "model_card.json").write_text(
        json.dumps({"config_hash": config.config_hash(), "backbone": {"sha256": config.backbone.sha256}})
    )
    _refused(
        site,
        r"is a release mechanism's student, but federation\.yaml runs 'confident-gnmax'",
        student=published / "head.npy",
    )
    # An --evaluate file of another image shape; a site without a holdout.
    _selection_student(published, config)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, images=np.zeros((20, 32, 32, 3), np.uint8), labels=np.zeros(20, np.int64))
    _refused(
        site,
        r"images are 32x32x3, the federation's queries are 28x28x1.*capc data import",
        student=published,
        evaluate=wrong,
    )
    # Too few images for a selection student: refused with the file's name before the candidates are trained.
    few = tmp_path / "few.npz"
    np.savez(few, images=np.zeros((15, 28, 28, 1), np.uint8), labels=np.zeros(15, np.int64))
    _refused(site, r"few\.npz holds 15 images; .* supply at least 16", student=published, evaluate=few)
    empty = _site(tmp_path, fed, holdout={"fraction": 0.0})
    _refused(empty, r"hospital-a's holdout is empty .*holdout\.fraction 0", student=published)


def test_the_cli_exits_2_with_the_reason_and_no_traceback(capc, tmp_path: Path) -> None:
    site = _site(tmp_path, federation_dict())
    proc = capc("teacher", "personalise", "--site", str(site), "--student", str(tmp_path / "nowhere"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "no published student at" in proc.stderr


def test_local_up_plans_each_hospital_s_holdout_from_its_planned_size(tmp_path: Path) -> None:
    """The fraction is the planned size's (a public number), never the site's count of examples."""
    small = LocalOptions(  # no heads to refuse; the plan judges them too small to join
        parties=3, train_limit=120, mechanism="dppl", force=protocol_force("holdout planning")
    )
    for name, options, planned in (
        ("small", small, 120),
        ("default", replace(small, train_limit=3000), 3000),
        ("whole", replace(small, train_limit=None), 20000),
        ("beyond", replace(small, train_limit=50000), 20000),
    ):
        layout, config, _ = provision(tmp_path / name, options)
        for party in config.teacher_names:
            fraction = TeacherSettings.load(layout.site(party)).holdout.fraction
            assert fraction == holdout_fraction(planned), (name, fraction)
            # federation.yaml declares what the heads train on, as preflight counts it: the training part
            assert config.teacher(party).examples == round(planned * (1 - fraction)), name
    assert holdout_fraction(120) == 0.25 and holdout_fraction(3000) == 0.1


def test_a_selection_student_is_fine_tuned_at_norm_one_and_saved_in_its_own_space() -> None:
    """A selection student's features (current statistics, norms near 50) are divided by one number for the
    fine-tuning and its head multiplied by it: the same predictions; the kept head is saved unscaled."""
    from capc_common.learn.personal import LinearModel
    from capc_common.models import extract_features, load_backbone
    from capc_services.teacher.published import PublishedStudent, StudentSpace

    backbone = load_backbone("scatter-28x28x1")
    images = load_dataset("fashion-mnist", split="train").images[:64]
    raw = extract_features(backbone, images, bn_batch=16, mode="current")
    space = StudentSpace(backbone, release=False, bn_batch=16).fitted(raw)
    assert space.scale == pytest.approx(np.linalg.norm(raw, axis=1).mean(), rel=1e-6) and space.scale > 2
    scaled = space.inputs(images, name="test", with_images=False)["student"]
    assert np.linalg.norm(scaled, axis=1).mean() == pytest.approx(1.0, rel=1e-5)
    head = np.random.default_rng(0).normal(size=(10, backbone.feature_dim + 1))
    student = PublishedStudent(head, {}, Path("student.safetensors"), False, "confident-gnmax")
    shared = LinearModel(space.shared_head(student), "student")
    np.testing.assert_array_equal(shared.predict(scaled), LinearModel(head, "student").predict(raw))
    np.testing.assert_allclose(space.unscaled(shared).weights, head, rtol=1e-12)
    narrow = replace(student, head=head[:, :5])
    with pytest.raises(InputError, match=r"a head over 4-d features, but the backbone gives"):
        space.shared_head(narrow)
    # A release student's features are normalised already: nothing is scaled.
    release = StudentSpace(backbone, release=True, bn_batch=16)
    assert release.fitted(raw).scale == 1.0
