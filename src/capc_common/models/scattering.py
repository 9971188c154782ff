"""Wavelet scattering transform (Mallat 2012; Bruna & Mallat 2013), 2-D, in torch: a fixed Morlet filter bank.

Tramèr & Boneh (2021, "Differentially private learning needs better features") showed that a scattering
front end (J = 2, L = 8) plus a linear model rivals learned features at low privacy budgets. It is data-free
and training-free, so it costs no privacy, and it is cheap on CPUs.

Definitions (Morlet filters as in ScatNet/kymatio, implemented here from the formulas):

* Gabor ``g(u) = exp(-uᵀ Σ u) · exp(i ξ·(u₁cos θ + u₂sin θ)) / (2π σ² / s)`` with
  ``Σ = R_θ diag(1, s²) R_θᵀ / (2σ²)``, evaluated on the periodic grid of the padded image (summed over
  ±2 periods so it wraps smoothly).
* Morlet ``ψ = g_ξ − K g_0`` with ``K = Σg_ξ / Σg_0`` (zero mean: a band-pass filter).
* Wavelets ``ψ_{j,ℓ}``: ``σ = 0.8·2^j``, ``ξ = (3π/4)/2^j``, ``θ = (L/2 − 1 − ℓ)π/L``, slant ``s = 4/L``,
  for ``j < J``, ``ℓ < L``; low-pass ``φ_J``: Gaussian with ``σ = 0.8·2^(J−1)``.
* Coefficients (each low-passed by ``φ_J`` and subsampled by ``2^J``):
  order 0 ``x ⋆ φ``; order 1 ``|x ⋆ ψ_{j1,ℓ1}| ⋆ φ``; order 2 ``||x ⋆ ψ_{j1,ℓ1}| ⋆ ψ_{j2,ℓ2}| ⋆ φ``,
  ``j2 > j1``. That is ``1 + JL + L²J(J−1)/2`` channels per input channel (81 for J = 2, L = 8) on an
  ``(H/2^J) × (W/2^J)`` grid.

Convolutions are products in the Fourier domain of the image reflect-padded by ``2^J`` pixels per side.
Intermediate signals are subsampled as soon as their band allows (subsampling by ``k`` in space is the mean of
the ``k × k`` aliased blocks of the spectrum), and filters used at a coarser resolution are the low-frequency
crops of their full-resolution spectra. With the inverse FFT normalised, every step is a true circular
convolution with the spatial filter, so the transform is consistent across resolutions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

from capc_common.errors import InputError

__all__ = ["Scattering2D", "gabor_2d", "morlet_2d", "scattering_channels"]

_PERIODS = (-2, -1, 0, 1, 2)
# Maps transformed together: small enough that the second-order tensors stay in cache (measured: 32 maps per
# pass run ~1.4x faster than 256 on one core), large enough to amortise Python overhead. Every pass holds
# exactly this many maps (see :meth:`Scattering2D.forward`).
_MAPS_PER_PASS = 32


def scattering_channels(*, J: int, L: int) -> int:
    """Number of scattering channels per input channel: ``1 + J·L + L²·J(J−1)/2``."""
    return 1 + J * L + L * L * J * (J - 1) // 2


def gabor_2d(
    height: int, width: int, *, sigma: float, theta: float, xi: float, slant: float = 1.0
) -> npt.NDArray[np.complex128]:
    """Periodised 2-D Gabor filter in space (see the module docstring), complex128 ``(height, width)``."""
    cos, sin = math.cos(theta), math.sin(theta)
    rot = np.array([[cos, -sin], [sin, cos]])
    curv = rot @ np.diag([1.0, slant * slant]) @ rot.T / (2.0 * sigma * sigma)
    rows = np.arange(height, dtype=np.float64)
    cols = np.arange(width, dtype=np.float64)
    out = np.zeros((height, width), dtype=np.complex128)
    for er in _PERIODS:
        xx = (rows + er * height)[:, np.newaxis]
        for ec in _PERIODS:
            yy = (cols + ec * width)[np.newaxis, :]
            quad = curv[0, 0] * xx * xx + (curv[0, 1] + curv[1, 0]) * xx * yy + curv[1, 1] * yy * yy
            out += np.exp(-quad + 1j * xi * (xx * cos + yy * sin))
    return out / (2.0 * math.pi * sigma * sigma / slant)


def morlet_2d(
    height: int, width: int, *, sigma: float, theta: float, xi: float, slant: float
) -> npt.NDArray[np.complex128]:
    """Zero-mean Morlet wavelet: a Gabor filter minus the multiple of its envelope that cancels its mean."""
    wave = gabor_2d(height, width, sigma=sigma, theta=theta, xi=xi, slant=slant)
    envelope = gabor_2d(height, width, sigma=sigma, theta=theta, xi=0.0, slant=slant)
    return wave - (wave.sum() / envelope.sum()) * envelope


def _spectrum(filt: npt.NDArray[np.complex128]) -> npt.NDArray[np.float64]:
    # The filters satisfy f(-u) = conj(f(u)), so their spectra are real: the imaginary part is rounding.
    return np.real(np.fft.fft2(filt))


def _crop(spectrum: npt.NDArray[np.float64], factor: int, axes: tuple[int, ...]) -> npt.NDArray[np.float64]:
    """Low-frequency crop of a spectrum to a grid ``factor`` times coarser (the filter's periodisation)."""
    for axis in axes:
        n = spectrum.shape[axis]
        m = n // factor
        keep = np.r_[0 : (m + 1) // 2, n - m // 2 : n]
        spectrum = np.take(spectrum, keep, axis=axis)
    return spectrum


def _alias_mean(spectrum: npt.NDArray[np.complex128], factor: int) -> npt.NDArray[np.complex128]:
    """1-D spectrum of the signal subsampled by ``factor``: the mean of its aliased blocks (axis 0)."""
    n = spectrum.shape[0]
    return spectrum.reshape(factor, n // factor, *spectrum.shape[1:]).mean(axis=0)


def _lowpass_matrix(profile: npt.NDArray[np.float64], *, res: int, J: int) -> npt.NDArray[np.float64]:
    """Matrix of the 1-D low-pass at resolution ``res``: filter, subsample to resolution ``J``, unpad.

    ``φ_J`` is an isotropic Gaussian, so its periodised 2-D spectrum is the outer product of two 1-D
    spectra and the whole low-pass step (product in Fourier, aliasing, inverse FFT, crop of the padding) is
    ``A_h · U · A_wᵀ`` — two small real matrix products instead of an FFT round trip per coefficient map.
    """
    spectrum = _crop(np.real(np.fft.fft(profile)), 2**res, axes=(0,))
    n = len(spectrum)
    basis = np.fft.fft(np.eye(n), axis=0) * spectrum[:, np.newaxis]
    out = np.fft.ifft(_alias_mean(basis, 2 ** (J - res)), axis=0)
    return np.real(out[1:-1])  # imaginary part is rounding: the profile is even


def _modulus(z: torch.Tensor) -> torch.Tensor:
    """``|z|`` of a complex tensor. Without autograd on the CPU numpy's vectorised modulus (within one ulp
    of torch's) is used: torch's took a quarter of the whole transform (measured: 4.5 ms against numpy's
    0.4 ms for 32 maps of 8 orientations at 36x36, one thread). Visual prompts backpropagate through the
    transform, so a tensor that needs gradients keeps torch's."""
    if z.requires_grad or z.device.type != "cpu":
        return z.abs()
    return torch.from_numpy(np.abs(z.numpy()))


def _filter_subsample(spec: torch.Tensor, filters: torch.Tensor, factor: int) -> torch.Tensor:
    """``subsample(spec[:, :, None] · filters, factor)`` without materialising the full-size product.

    Args:
        spec: complex spectra ``(B, P, h, w)``.
        filters: complex filter spectra ``(Q, h, w)`` at the same resolution.
        factor: spatial subsampling factor (a power of two dividing ``h`` and ``w``).

    Returns:
        Complex ``(B, P, Q, h/factor, w/factor)``: subsampling in space is the mean of the ``factor²``
        aliased spectral blocks, so the product-then-alias is one small matrix product per frequency.
    """
    b, p, h, w = spec.shape
    q = filters.shape[0]
    if factor == 1:
        return spec.unsqueeze(2) * filters
    hh, ww, kk = h // factor, w // factor, factor * factor
    lhs = spec.reshape(b * p, factor, hh, factor, ww).permute(2, 4, 0, 1, 3).reshape(hh * ww, b * p, kk)
    rhs = filters.reshape(q, factor, hh, factor, ww).permute(2, 4, 1, 3, 0).reshape(hh * ww, kk, q)
    out = torch.bmm(lhs, rhs).mul_(1.0 / kk)  # (hh·ww, B·P, Q)
    return out.reshape(hh, ww, b, p, q).permute(2, 3, 4, 0, 1)


class Scattering2D(nn.Module):
    """Second-order 2-D scattering transform with fixed Morlet filters.

    Input ``(N, C, H, W)`` float; output ``(N, C·K, H/2^J, W/2^J)`` with ``K = scattering_channels(J, L)``,
    channels ordered per input channel as order 0, order 1 ``(j1, ℓ1)``, order 2 ``(j1, ℓ1, j2, ℓ2)`` (the
    order kymatio uses). The filters are fixed buffers, not saved in checkpoints: they are a function of the
    shape and ``J``, ``L``.
    """

    def __init__(self, *, height: int, width: int, J: int = 2, L: int = 8) -> None:
        super().__init__()
        step = 2**J
        if J < 1 or L < 1:
            raise InputError(f"scattering needs J >= 1 and L >= 1, got J={J}, L={L}")
        if height % step or width % step or min(height, width) <= step:
            raise InputError(
                f"scattering with J={J} needs height and width that are multiples of {step} and larger than "
                f"{step}, got {height}x{width}; resize or pad the images"
            )
        self.height, self.width, self.J, self.L = height, width, J, L
        self.pad = step
        hp, wp = height + 2 * step, width + 2 * step
        sigma_phi = 0.8 * 2 ** (J - 1)
        # φ_J = g(rows) g(cols) / (2π σ²) with g the periodised 1-D Gaussian (the 2-D Gabor with ξ = 0).
        norm = 1.0 / (2.0 * math.pi * sigma_phi * sigma_phi)
        profiles = {n: self._gaussian_profile(n, sigma_phi) for n in (hp, wp)}
        for res in range(J + 1):
            rows = _lowpass_matrix(profiles[hp], res=res, J=J) * norm
            cols = _lowpass_matrix(profiles[wp], res=res, J=J)
            self.register_buffer(f"lp_rows_{res}", self._tensor(rows), persistent=False)
            self.register_buffer(f"lp_cols_{res}", self._tensor(cols.T), persistent=False)
        for j in range(J):
            spectra = np.stack(
                [
                    _spectrum(
                        morlet_2d(
                            hp,
                            wp,
                            sigma=0.8 * 2**j,
                            theta=(L // 2 - 1 - ell) * math.pi / L,
                            xi=0.75 * math.pi / 2**j,
                            slant=4.0 / L,
                        )
                    )
                    for ell in range(L)
                ]
            )
            for res in range(j + 1):
                cropped = _crop(spectra, 2**res, axes=(1, 2))
                self.register_buffer(
                    f"psi_{j}_{res}", self._tensor(cropped).to(torch.complex64), persistent=False
                )

    @staticmethod
    def _gaussian_profile(n: int, sigma: float) -> npt.NDArray[np.float64]:
        x = np.arange(n, dtype=np.float64)
        return np.sum([np.exp(-((x + e * n) ** 2) / (2.0 * sigma * sigma)) for e in _PERIODS], axis=0)

    @staticmethod
    def _tensor(array: npt.NDArray[np.float64]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))

    @property
    def channels(self) -> int:
        """Output channels per input channel."""
        return scattering_channels(J=self.J, L=self.L)

    def _buffer(self, name: str) -> torch.Tensor:
        buf = getattr(self, name)
        assert isinstance(buf, torch.Tensor)
        return buf

    def _lowpass(self, u: torch.Tensor, res: int, *, wide: bool = False) -> torch.Tensor:
        """``u ⋆ φ_J`` subsampled to resolution ``J`` and unpadded, for real ``u`` at resolution ``res``.

        ``wide``: in float64, rounded back to ``u``'s precision (the order-0 maps of the images themselves).
        With one map per image the second product folds into a matrix product of only a few rows per map,
        and there MKL rounds a row differently by its place in the batch (measured on AMD EPYC: 24 of a
        pass's 32 places give other bits for a 28x28 image); the first-order and second-order maps (8 and 64
        per image) showed no such effect. In float64 such a difference is some 2^-29 of a float32 ulp, so
        the rounded coefficients are the same bits in any place but for about one in 2^29 (the pass is 3 %
        slower, not 2.4 times as with every low-pass in float64).
        """
        rows, cols = self._buffer(f"lp_rows_{res}"), self._buffer(f"lp_cols_{res}")
        if not wide:
            return rows @ u @ cols
        return (rows.double() @ u.double() @ cols.double()).to(u.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scattering coefficients of ``x`` ``(N, C, H, W)`` → ``(N, C·K, H/2^J, W/2^J)``."""
        n, c, h, w = x.shape
        if (h, w) != (self.height, self.width):
            raise InputError(f"scattering built for {self.height}x{self.width} images, got {h}x{w}")
        maps = x.reshape(n * c, 1, h, w).float()
        coeffs = torch.cat(list(self._passes(maps)))
        return coeffs.reshape(n, c * coeffs.shape[1], *coeffs.shape[2:])

    def _passes(self, maps: torch.Tensor) -> Iterator[torch.Tensor]:
        """:meth:`_transform` of ``maps`` in passes of exactly :data:`_MAPS_PER_PASS` maps, in order.

        A map's coefficients are then the same bits whatever it was batched with (the FFTs and matrix
        products of a full pass take one code path; a shorter pass may round differently in the last bit):
        the last pass overlaps the one before it, and fewer maps than one pass are padded with zeros. So the
        transform of an image is a function of that image alone, and a party that computed it once for all
        its records (:class:`~capc_common.models.features.FixedFront`) reuses it for any chunking exactly.
        """
        m, size = len(maps), _MAPS_PER_PASS
        if m < size:
            pad = maps.new_zeros((size - m, *maps.shape[1:]))
            yield self._transform(torch.cat([maps, pad]))[:m]
            return
        done = 0
        for start in [*range(0, m - size + 1, size), *([m - size] if m % size else [])]:
            yield self._transform(maps[start : start + size])[done - start :]
            done = start + size

    def _transform(self, maps: torch.Tensor) -> torch.Tensor:
        """Scattering of single-channel maps ``(B, 1, H, W)`` → ``(B, K, h', w')``."""
        padded = F.pad(maps, (self.pad,) * 4, mode="reflect")
        u0 = torch.fft.fft2(padded)  # (B, 1, Hp, Wp)
        outputs = [self._lowpass(padded, 0, wide=True)]
        second: list[torch.Tensor] = []
        for j1 in range(self.J):
            w1 = _filter_subsample(u0, self._buffer(f"psi_{j1}_0"), 2**j1)[:, 0]  # (B, L, ·, ·)
            u1 = _modulus(torch.fft.ifft2(w1))  # |x ⋆ ψ_{j1}| at resolution j1
            outputs.append(self._lowpass(u1, j1))
            if j1 + 1 == self.J:
                continue
            u1_spec = torch.fft.fft2(u1)
            per_j2 = []
            for j2 in range(j1 + 1, self.J):
                w2 = _filter_subsample(u1_spec, self._buffer(f"psi_{j2}_{j1}"), 2 ** (j2 - j1))
                per_j2.append(self._lowpass(_modulus(torch.fft.ifft2(w2)), j2))  # (B, L1, L2, h', w')
            second.append(torch.stack(per_j2, dim=2).flatten(1, 3))
        return torch.cat(outputs + second, dim=1)
