"""BatchNorm statistics modes: current vs running, in train() and eval(), never mutating the buffers."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from capc_common.errors import InputError
from capc_common.models import bn_stats, build_backbone, recalibrate_running_stats


def _warm(arch: str = "cnn"):
    """A backbone whose running statistics are not the initial ones (so modes give different outputs)."""
    backbone = build_backbone(arch, input_shape="12x12x1", seed=0).train()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(3):
            backbone.features(torch.rand(16, 1, 12, 12, generator=gen) * 0.5)
    return backbone


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.named_buffers()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _batches():
    gen = torch.Generator().manual_seed(1)
    first = torch.rand(8, 1, 12, 12, generator=gen)
    other = torch.rand(8, 1, 12, 12, generator=gen) * 0.3
    mixed = torch.cat([first[:1], other[1:]])
    return first, mixed


@pytest.mark.parametrize("arch", ["cnn", "scatter_cnn", "resnet10"])
@pytest.mark.parametrize("training", [True, False])
def test_modes_never_mutate_buffers(arch, training):
    backbone = _warm(arch).train(training)
    before = _buffers(backbone)
    first, mixed = _batches()
    with torch.no_grad():
        for mode in ("current", "running"):
            with bn_stats(backbone, mode):
                backbone.features(first)
                backbone.features(mixed)
    _assert_same(before, _buffers(backbone))


@pytest.mark.parametrize("training", [True, False])
def test_current_depends_on_batch_running_does_not(training):
    backbone = _warm().train(training)
    first, mixed = _batches()  # both start with the same image
    with torch.no_grad():
        with bn_stats(backbone, "current"):
            a, b = backbone.features(first)[0], backbone.features(mixed)[0]
        assert not torch.allclose(a, b, atol=1e-3)
        with bn_stats(backbone, "running"):
            c, d = backbone.features(first)[0], backbone.features(mixed)[0]
        torch.testing.assert_close(c, d)
        assert not torch.allclose(a, c, atol=1e-3)
        backbone.eval()
        torch.testing.assert_close(backbone.features(first)[0], c)  # running == plain eval()


def test_default_train_mode_still_updates(tmp_path):
    # Without an override, train() keeps PyTorch semantics (pretraining needs them): the check above can fail.
    backbone = _warm().train()
    before = _buffers(backbone)
    with torch.no_grad():
        backbone.features(torch.rand(8, 1, 12, 12))
    after = _buffers(backbone)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_contexts_nest_and_restore():
    backbone = _warm().eval()
    first, _ = _batches()
    with torch.no_grad():
        plain = backbone.features(first)
        with bn_stats(backbone, "current"):
            cur = backbone.features(first)
            with bn_stats(backbone, "running"):
                torch.testing.assert_close(backbone.features(first), plain)
            torch.testing.assert_close(backbone.features(first), cur)
        torch.testing.assert_close(backbone.features(first), plain)


def test_mode_is_scoped_to_the_thread():
    backbone = _warm().eval()
    first, _ = _batches()
    with torch.no_grad():
        plain = backbone.features(first)
        seen = {}
        with bn_stats(backbone, "current"):
            worker = threading.Thread(target=lambda: seen.update(out=backbone.features(first)))
            worker.start()
            worker.join()
            cur = backbone.features(first)
    torch.testing.assert_close(seen["out"], plain)
    assert not torch.allclose(cur, plain, atol=1e-3)


def test_errors():
    backbone = _warm()
    with pytest.raises(InputError, match="unknown BatchNorm statistics mode"), bn_stats(backbone, "batch"):
        pass
    plain = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    with pytest.raises(InputError, match="plain torch BatchNorm"), bn_stats(plain, "current"):
        pass


def test_recalibrate_running_stats_is_the_exact_average():
    backbone = build_backbone("scatter_cnn", input_shape="12x12x1", seed=0, config={"cnn_width": 8}).eval()
    gen = torch.Generator().manual_seed(3)
    batches = [torch.rand(6, 1, 12, 12, generator=gen) for _ in range(3)]
    assert recalibrate_running_stats(backbone, batches) == 3
    assert not backbone.training
    norm = backbone.trunk.front.norm
    with torch.no_grad():
        maps = [backbone.trunk.front.scattering(b) for b in batches]
    expected = torch.stack([m.mean(dim=(0, 2, 3)) for m in maps]).mean(0)
    torch.testing.assert_close(norm.running_mean, expected, atol=1e-5, rtol=1e-4)
    assert norm.momentum is None and backbone.trunk.cnn[0][1].momentum == 0.1  # momenta restored
    # the output standardisation, never run by SimCLR, now holds real statistics too
    assert not torch.equal(
        backbone.trunk.learned_norm.running_var, torch.ones_like(backbone.trunk.learned_norm.running_var)
    )
    with pytest.raises(InputError, match="at least one batch"):
        recalibrate_running_stats(backbone, [])
