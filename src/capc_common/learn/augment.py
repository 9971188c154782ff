"""SimCLR's augmentations, batched in torch (torchvision is not usable here).

The DIET-PATE recipe (SimCLR on synthetic images): random resized crop, horizontal flip, colour jitter with
probability 0.8, Gaussian blur with a kernel of 10 % of the image side, and random grayscale with probability
0.2 for RGB images. Every parameter is drawn per image from an explicit ``torch.Generator``, so a view is a
pure function of ``(images, generator state)`` — pretraining is reproducible and resumable bit for bit.

Colour jitter applies brightness, contrast, saturation and hue in that fixed order (torchvision shuffles the
order; the distribution of outputs differs only slightly). Hue is rotated in YIQ space, the linear
approximation of a hue shift; saturation and hue are no-ops on grey images.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from capc_common.errors import InputError

__all__ = ["AugmentConfig", "augment"]

_LUMA = (0.299, 0.587, 0.114)
# RGB -> YIQ and back (NTSC); a hue shift is a rotation of the (I, Q) plane.
_RGB2YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))


@dataclass(frozen=True)
class AugmentConfig:
    """Strengths of the SimCLR augmentations (defaults: SimCLR's CIFAR settings, colour strength 0.5).

    Attributes:
        crop_scale: range of the crop's area as a fraction of the image.
        crop_ratio: range of the crop's aspect ratio (width / height).
        flip_p: probability of a horizontal flip.
        jitter_p: probability of colour jitter (0.8 in the paper).
        brightness, contrast, saturation, hue: jitter strengths (factors in ``[1 - s, 1 + s]``; hue in turns).
        blur_p: probability of a Gaussian blur.
        blur_sigma: range of the blur's standard deviation, in pixels.
        blur_kernel_frac: blur kernel side as a fraction of the image side (0.1 in the paper; at least 3).
        gray_p: probability of converting an RGB image to grey (0.2 in the paper; ignored for grey images).
    """

    crop_scale: tuple[float, float] = (0.2, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    blur_p: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    blur_kernel_frac: float = 0.1
    gray_p: float = 0.2

    def __post_init__(self) -> None:
        lo, hi = self.crop_scale
        if not 0 < lo <= hi <= 1:
            raise InputError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")
        for name in ("flip_p", "jitter_p", "blur_p", "gray_p"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise InputError(f"{name} is a probability in [0, 1], got {value}")

    def as_dict(self) -> dict[str, object]:
        """Plain-dict form, recorded in a backbone's pretraining recipe."""
        return asdict(self)


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=gen)


def _coin(n: int, p: float, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, generator=gen) < p


def _resized_crop_flip(x: torch.Tensor, cfg: AugmentConfig, gen: torch.Generator) -> torch.Tensor:
    n = x.shape[0]
    area = _uniform(n, *cfg.crop_scale, gen)
    log_ratio = _uniform(n, math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1]), gen)
    ratio = torch.exp(log_ratio)
    w = torch.sqrt(area * ratio).clamp(max=1.0)
    h = torch.sqrt(area / ratio).clamp(max=1.0)
    cx = (1 - w) * (2 * torch.rand(n, generator=gen) - 1)  # centre in normalised [-1, 1] coordinates
    cy = (1 - h) * (2 * torch.rand(n, generator=gen) - 1)
    flip = torch.where(_coin(n, cfg.flip_p, gen), -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = w * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = h
    theta[:, 1, 2] = cy
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def _gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    luma = torch.tensor(_LUMA, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * luma).sum(dim=1, keepdim=True)


def _per_image(values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return values.to(device=x.device, dtype=x.dtype).view(-1, 1, 1, 1)


def _colour_jitter(x: torch.Tensor, cfg: AugmentConfig, gen: torch.Generator) -> torch.Tensor:
    n = x.shape[0]
    apply = _per_image(_coin(n, cfg.jitter_p, gen).float(), x)
    b = _per_image(_uniform(n, 1 - cfg.brightness, 1 + cfg.brightness, gen), x)
    c = _per_image(_uniform(n, 1 - cfg.contrast, 1 + cfg.contrast, gen), x)
    s = _per_image(_uniform(n, 1 - cfg.saturation, 1 + cfg.saturation, gen), x)
    h = _uniform(n, -cfg.hue, cfg.hue, gen).to(x.device, x.dtype) * (2 * math.pi)
    out = (x * b).clamp(0, 1)
    mean = _gray(out).mean(dim=(1, 2, 3), keepdim=True)
    out = ((out - mean) * c + mean).clamp(0, 1)
    if x.shape[1] == 3:
        grey = _gray(out)
        out = ((out - grey) * s + grey).clamp(0, 1)
        m = torch.tensor(_RGB2YIQ, device=x.device, dtype=x.dtype)
        yiq = torch.einsum("ij,njhw->nihw", m, out)
        cos, sin = torch.cos(h).view(-1, 1, 1), torch.sin(h).view(-1, 1, 1)
        i_rot = yiq[:, 1] * cos - yiq[:, 2] * sin
        q_rot = yiq[:, 1] * sin + yiq[:, 2] * cos
        yiq = torch.stack([yiq[:, 0], i_rot, q_rot], dim=1)
        out = torch.einsum("ij,njhw->nihw", torch.linalg.inv(m), yiq).clamp(0, 1)
    return apply * out + (1 - apply) * x


def _blur(x: torch.Tensor, cfg: AugmentConfig, gen: torch.Generator) -> torch.Tensor:
    n, c, height, width = x.shape
    size = max(3, round(cfg.blur_kernel_frac * min(height, width)) | 1)
    sigma = _uniform(n, *cfg.blur_sigma, gen).to(x.device, x.dtype)
    offsets = torch.arange(size, device=x.device, dtype=x.dtype) - size // 2
    kernel = torch.exp(-(offsets.view(1, -1) ** 2) / (2 * sigma.view(-1, 1) ** 2))
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (N, size)
    apply = _coin(n, cfg.blur_p, gen).to(x.device)
    identity = torch.zeros_like(kernel)
    identity[:, size // 2] = 1.0
    kernel = torch.where(apply.view(-1, 1), kernel, identity)
    k = kernel.repeat_interleave(c, dim=0)  # one kernel per (image, channel)
    flat = x.reshape(1, n * c, height, width)
    pad = size // 2
    flat = F.conv2d(F.pad(flat, (pad, pad, 0, 0), mode="reflect"), k.view(n * c, 1, 1, size), groups=n * c)
    flat = F.conv2d(F.pad(flat, (0, 0, pad, pad), mode="reflect"), k.view(n * c, 1, size, 1), groups=n * c)
    return flat.view(n, c, height, width)


def augment(x: torch.Tensor, *, config: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """One random SimCLR view of each image.

    Args:
        x: float images ``(N, C, H, W)`` in ``[0, 1]`` (any device).
        config: augmentation strengths.
        generator: CPU generator all random parameters are drawn from (the only source of randomness).

    Returns:
        Augmented images, same shape, in ``[0, 1]``.
    """
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise InputError(f"augment takes images (N, C, H, W) with C 1 or 3, got {tuple(x.shape)}")
    out = _resized_crop_flip(x, config, generator)
    out = _colour_jitter(out, config, generator)
    if x.shape[1] == 3:
        gray = _per_image(_coin(x.shape[0], config.gray_p, generator).float(), out)
        out = gray * _gray(out).expand_as(out) + (1 - gray) * out
    return _blur(out, config, generator).clamp(0, 1)
