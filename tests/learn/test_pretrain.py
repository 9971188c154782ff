"""SimCLR pretraining: NT-Xent, a real smoke run on a synthetic generator, exact resumption, misuse."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capc_common.errors import InputError
from capc_common.learn.pretrain import PretrainConfig, calibrate_training_free, nt_xent, pretrain
from capc_common.models import load_backbone

TINY = {"cnn_width": 8, "pool": 1}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # A second OpenMP thread spin-waits on the shared 2-core machine (see tests/models/conftest.py).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(**overrides):
    base = {
        "generator": "dead_leaves",
        "arch": "scatter_cnn",
        "input_shape": (12, 12, 1),
        "arch_config": TINY,
        "batch_size": 8,
        "proj_hidden": 16,
        "proj_dim": 8,
    }
    return PretrainConfig(**{**base, **overrides})


def _run(config, **kwargs):
    return pretrain(config, **{"progress": False, "calibration_batches": 2, **kwargs})


def test_nt_xent_matches_definition():
    z = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    zn = F.normalize(z, dim=1).numpy()
    sim = zn @ zn.T / 0.5
    losses = []
    for i in range(6):
        positive = (i + 3) % 6
        others = [j for j in range(6) if j != i]
        losses.append(-sim[i, positive] + np.log(np.exp(sim[i, others]).sum()))
    assert float(nt_xent(z, temperature=0.5)) == pytest.approx(np.mean(losses), rel=1e-5)
    aligned = torch.cat([torch.eye(4) * 10, torch.eye(4) * 10])
    assert float(nt_xent(aligned, temperature=0.1)) < 1e-3
    with pytest.raises(InputError, match="even number"):
        nt_xent(torch.randn(5, 3), temperature=0.5)


def test_smoke_run_writes_outputs(tmp_path):
    result = _run(_config(), out_dir=tmp_path, steps=3)
    assert result.steps == 3 and result.images_seen == 24 and np.isfinite(result.final_loss)
    for name in ("backbone.safetensors", "recipe.json", "losses.csv", "loss.png", "pretrain_state.pt"):
        assert (tmp_path / name).stat().st_size > 0
    backbone = load_backbone(result.backbone_path, sha256=result.sha256)
    recipe = json.loads((tmp_path / "recipe.json").read_text())
    assert backbone.recipe["generator"] == recipe["generator"] == "dead_leaves"
    assert recipe["steps"] == 3 and recipe["sha256"] == result.sha256 and len(recipe["stream_sha256"]) == 64
    fresh = torch.zeros_like(backbone.trunk.learned_norm.running_var) + 1
    assert not torch.equal(backbone.trunk.learned_norm.running_var, fresh)  # recalibrated on synthetic data


def test_resume_continues_exactly(tmp_path):
    straight = _run(_config(), out_dir=tmp_path / "a", steps=4)
    _run(_config(), out_dir=tmp_path / "b", steps=2)
    resumed = _run(_config(), out_dir=tmp_path / "b", steps=4, resume=True)
    assert resumed.steps == 4
    a, b = load_backbone(straight.backbone_path), load_backbone(resumed.backbone_path)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name  # same weights and statistics, bit for bit


def test_minutes_budget_stops(tmp_path):
    result = _run(_config(), out_dir=tmp_path, minutes=0.01)
    assert result.steps >= 1 and result.seconds < 0.6 + 5.0


def test_misuse(tmp_path):
    with pytest.raises(InputError, match="stopping rule"):
        _run(_config(), out_dir=tmp_path / "x")
    with pytest.raises(InputError, match="nothing to resume"):
        _run(_config(), out_dir=tmp_path / "x", steps=1, resume=True)
    _run(_config(), out_dir=tmp_path / "x", steps=1)
    with pytest.raises(InputError, match="already holds a pretraining run"):
        _run(_config(), out_dir=tmp_path / "x", steps=2)
    with pytest.raises(InputError, match=r"different settings \(batch_size\)"):
        _run(_config(batch_size=4), out_dir=tmp_path / "x", steps=2, resume=True)
    with pytest.raises(InputError, match="unknown generator"):
        _run(_config(generator="imagenet"), out_dir=tmp_path / "y", steps=1)
    with pytest.raises(InputError, match="training-free"):
        _run(_config(arch="scatter", arch_config={}), out_dir=tmp_path / "z", steps=1)
    with pytest.raises(InputError, match="learnable weights"):
        calibrate_training_free(_config(), out_dir=tmp_path / "z")


def test_training_free_backbone_is_calibrated(tmp_path):
    result = calibrate_training_free(
        _config(arch="scatter", arch_config={}), out_dir=tmp_path, calibration_batches=2
    )
    backbone = load_backbone(result.backbone_path)
    assert backbone.recipe["method"] == "training-free" and result.steps == 0
    assert not torch.equal(
        backbone.trunk.norm.running_mean, torch.zeros_like(backbone.trunk.norm.running_mean)
    )
    assert not (tmp_path / "loss.png").exists()


def test_cli(capc_json, tmp_path):
    out = capc_json(
        "pretrain",
        "--generator",
        "fractal",
        "--arch",
        "cnn",
        "--size",
        "8x8x1",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--arch-config",
        '{"width": 4}',
        "--threads",
        "1",
        "--out",
        str(tmp_path / "run"),
    )
    assert out["steps"] == 2 and len(out["sha256"]) == 64
    assert (tmp_path / "run" / "loss.png").exists()
