"""Scattering front end: a known answer from kymatio and the invariances the transform is built for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from capc_common.errors import InputError
from capc_common.models import Scattering2D, scattering_channels
from capc_common.models.scattering import gabor_2d, morlet_2d

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def scat28() -> Scattering2D:
    return Scattering2D(height=28, width=28)


def _blob() -> torch.Tensor:
    r, c = np.mgrid[0:28, 0:28]
    img = np.exp(-((r - 13.5) ** 2 / 18 + (c - 11.5) ** 2 / 8)).astype(np.float32)
    img[10:18, 12:14] += 0.6
    return torch.from_numpy(img)[None, None]


def test_matches_kymatio(scat28):
    # Reference: kymatio 0.3.0 numpy frontend, Scattering2D(J=2, shape=(28, 28), L=8) on these two images.
    # kymatio normalises its Gabor filters with pi ~ 3.1415, so orders 0/1/2 differ by ~3e-5/6e-5/9e-5.
    ref = np.load(DATA / "kymatio_0.3.0_J2_L8_28x28.npz")
    ours = scat28(torch.from_numpy(ref["images"])[:, None]).numpy()
    expected = ref["scattering"]
    assert ours.shape == expected.shape == (2, 81, 7, 7)
    scale = np.abs(expected).max(axis=(2, 3), keepdims=True)
    assert np.abs(ours - expected).max(initial=0, where=scale > 0) < 1.5e-4 * scale.max()
    np.testing.assert_allclose(ours, expected, rtol=1.5e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "J", "L", "expected"),
    [((28, 28, 1), 2, 8, (81, 7, 7)), ((32, 32, 3), 2, 8, (243, 8, 8)), ((16, 24, 1), 3, 4, (61, 2, 3))],
)
def test_output_shape(shape, J, L, expected):
    h, w, c = shape
    assert scattering_channels(J=J, L=L) * c == expected[0]
    out = Scattering2D(height=h, width=w, J=J, L=L)(torch.rand(2, c, h, w))
    assert tuple(out.shape) == (2, *expected)


def test_wavelets_are_band_pass_and_lowpass_keeps_mean():
    psi = morlet_2d(36, 36, sigma=0.8, theta=0.3, xi=0.75 * np.pi, slant=0.5)
    assert abs(psi.sum()) < 1e-12 * np.abs(psi).sum()
    phi = gabor_2d(36, 36, sigma=1.6, theta=0.0, xi=0.0)
    assert phi.sum().real == pytest.approx(1.0, abs=1e-3)


def test_constant_image_has_only_order_zero(scat28):
    out = scat28(torch.full((1, 1, 28, 28), 0.7))[0]
    np.testing.assert_allclose(out[0].numpy(), 0.7, rtol=1e-3)
    assert out[1:].abs().max() < 1e-5


def test_transpose_permutes_orientations(scat28):
    # Transposing the image maps angle theta to pi/2 - theta, i.e. orientation l to (2 - l) mod 8.
    x = _blob()
    s = scat28(x)[0]
    t = scat28(x.transpose(2, 3))[0]
    perm = [(2 - ell) % 8 for ell in range(8)]
    for j in range(2):
        for ell in range(8):
            torch.testing.assert_close(t[1 + 8 * j + perm[ell]], s[1 + 8 * j + ell].T, atol=1e-6, rtol=0)
    for a in range(8):
        for b in range(8):
            torch.testing.assert_close(t[17 + 8 * perm[a] + perm[b]], s[17 + 8 * a + b].T, atol=1e-6, rtol=0)


def test_translation_covariance_and_stability(scat28):
    x = _blob()
    s = scat28(x)[0]
    # A shift by 2^J pixels shifts the coefficient grid by exactly one cell (away from the border).
    shifted = scat28(torch.roll(x, 4, dims=3))[0]
    torch.testing.assert_close(shifted[:, :, 2:6], s[:, :, 1:5], atol=1e-5, rtol=0)
    # Small shifts barely move the spatially pooled coefficients, although the pixels change a lot.
    for step in (1, 2):
        y = torch.roll(x, step, dims=3)
        pixel_change = float((x - y).norm() / x.norm())
        pooled_change = float((scat28(y)[0].sum((1, 2)) - s.sum((1, 2))).norm() / s.sum((1, 2)).norm())
        assert pixel_change > 0.5 and pooled_change < 0.03


def test_bad_shapes():
    with pytest.raises(InputError, match="multiples of 4"):
        Scattering2D(height=30, width=28)
    with pytest.raises(InputError, match="built for 28x28"):
        Scattering2D(height=28, width=28)(torch.rand(1, 1, 32, 32))


def test_an_images_coefficients_do_not_depend_on_its_batch(scat28):
    """Every pass holds 32 maps (the last overlaps, a short input is padded), so an image's coefficients
    are the same bits alone, in any batch and in any order: what FixedFront's reuse relies on."""
    x = torch.from_numpy(np.random.default_rng(3).random((40, 1, 28, 28), dtype=np.float32))
    with torch.inference_mode():
        whole = scat28(x)
        assert torch.equal(torch.cat([scat28(x[i : i + 7]) for i in range(0, 40, 7)]), whole)
        assert torch.equal(scat28(x[5:6]), whole[5:6])
        order = torch.from_numpy(np.random.default_rng(4).permutation(40))
        assert torch.equal(scat28(x[order]), whole[order])
