"""SimCLR augmentations: determinism, ranges, and each transform's switch doing what it says."""

from __future__ import annotations

import pytest
import torch

from capc_common.errors import InputError
from capc_common.learn.augment import AugmentConfig, augment


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # A second OpenMP thread spin-waits on the shared 2-core machine (see tests/models/conftest.py).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


IDENTITY = AugmentConfig(
    crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, blur_p=0.0, gray_p=0.0
)


def _images(c: int = 3) -> torch.Tensor:
    return torch.rand(6, c, 16, 16, generator=torch.Generator().manual_seed(0))


def test_identity_settings_return_the_input():
    x = _images()
    torch.testing.assert_close(augment(x, config=IDENTITY, generator=torch.Generator()), x, atol=1e-5, rtol=0)


def test_flip_only_mirrors():
    x = _images(1)
    cfg = AugmentConfig(**{**IDENTITY.as_dict(), "flip_p": 1.0})
    torch.testing.assert_close(
        augment(x, config=cfg, generator=torch.Generator()), x.flip(3), atol=1e-5, rtol=0
    )


def test_grayscale_makes_channels_equal():
    cfg = AugmentConfig(**{**IDENTITY.as_dict(), "gray_p": 1.0})
    out = augment(_images(), config=cfg, generator=torch.Generator())
    torch.testing.assert_close(out[:, 0], out[:, 1])
    torch.testing.assert_close(out[:, 1], out[:, 2])


def test_blur_smooths():
    x = _images(1)
    cfg = AugmentConfig(**{**IDENTITY.as_dict(), "blur_p": 1.0, "blur_sigma": (1.5, 1.5)})
    out = augment(x, config=cfg, generator=torch.Generator())
    assert out.diff(dim=3).abs().mean() < 0.7 * x.diff(dim=3).abs().mean()
    torch.testing.assert_close(out.mean(), x.mean(), atol=0.02, rtol=0)


def test_default_views_are_random_but_reproducible():
    x = _images()
    a = augment(x, config=AugmentConfig(), generator=torch.Generator().manual_seed(5))
    b = augment(x, config=AugmentConfig(), generator=torch.Generator().manual_seed(5))
    c = augment(x, config=AugmentConfig(), generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert a.shape == x.shape and a.min() >= 0 and a.max() <= 1


def test_bad_inputs():
    with pytest.raises(InputError, match="C 1 or 3"):
        augment(torch.rand(2, 2, 8, 8), config=AugmentConfig(), generator=torch.Generator())
    with pytest.raises(InputError, match="crop_scale"):
        AugmentConfig(crop_scale=(0.0, 1.0))
    with pytest.raises(InputError, match="probability"):
        AugmentConfig(jitter_p=1.5)
