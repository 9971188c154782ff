"""``stylegan``: images from an untrained StyleGAN2-like generator with oriented filters, after the
"StyleGAN-Oriented" data of Baradad et al. ("Learning to see by looking at noise", NeurIPS 2021), which
DIET-PATE pretrains on for MNIST and TissueMNIST.

What is reproduced: a StyleGAN2 synthesis network (a 4 × 4 constant input, then per resolution an upsampling
modulated convolution and a plain one, a ReLU with gain √2, a "skip" ToRGB branch summed over resolutions)
whose weights are never trained. As in the oriented variant, every 3 × 3 convolution takes its filters from a
fixed bank (8 oriented edges, 8 oriented lines, 4 sparse patterns and their negatives, 40 in all): each layer
picks a random subset of 5 to 40 of them, gives each *input* channel one filter of the subset and each
*output* channel a N(0, 1) gain ("chin-chout"); styles modulate input channels and are demodulated per output
channel exactly as in StyleGAN2. Styles are 1 + N(0, 0.52) (the affine layer's output for a leaky-ReLU of a
Gaussian latent, as in the reference, which bypasses the mapping network); biases are uniform on
[-0.2, 0.2]; one pink-noise map (a 1/f^α spectrum, α ∈ [0.5, 1.5], under a Laplacian envelope) is shared
by every layer at a per-layer strength in [0, 0.3]. Each output channel is standardised and given a random
mean and standard deviation drawn around ImageNet's, as the reference's colour normalisation.

What is not: the network is drawn afresh for every image (the reference keeps one random network for 400
images; per-image networks are what makes every index independent), it has ``WIDTH`` channels per layer
instead of up to 512, resolution stops at the next power of two at or above the target size (then a random
crop), upsampling is a [1, 3, 3, 1] FIR filter followed by the convolution instead of StyleGAN2's transposed
convolution, borders are padded by replicating edge pixels rather than with zeros (zero padding draws a
frame around these small images), the pink noise is synthesised by octaves of value noise instead of an
FFT (an FFT's rounding depends on the library build), and the 3 × 3 filters are drawn analytically rather
than by rotating an 11 × 11 image with PIL. Grayscale images come from a one-channel ToRGB rather than
the luma of colour.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from capc_common.synth._jit import dexp, dlog, mean_std, normal, randint, to_u8, uniform, uniform_in

DESCRIPTION = "untrained StyleGAN2-like generator with an oriented filter bank (StyleGAN-Oriented-like)"

WIDTH = 24
"""Channels of every synthesis layer."""
_SQRT2 = math.sqrt(2.0)
_STYLE_STD = math.sqrt(0.52)  # E[lrelu(z, 0.2)^2] for z ~ N(0, 1): the variance of one affine output
_BIAS_RANGE = 0.2
_NOISE_MAX = 0.3
# (mean of the mean, std of the mean, mean of the std, std of the std) per output channel, from the reference
_RGB_STATS = np.array(
    [[0.483, 0.145, 0.219, 0.063], [0.455, 0.142, 0.213, 0.062], [0.401, 0.161, 0.213, 0.069]]
)
_GRAY_STATS = np.array([[0.446, 0.149, 0.215, 0.065]])


def _filter_bank() -> np.ndarray:
    """The 40 fixed 3 × 3 filters: oriented edges and lines at k·π/8, four sparse patterns, negatives."""
    c1 = math.sqrt(2.0 + math.sqrt(2.0)) / 2.0  # cos(π/8), from correctly rounded sqrt only
    c2 = math.sqrt(0.5)
    c3 = math.sqrt(2.0 - math.sqrt(2.0)) / 2.0
    cosines = [1.0, c1, c2, c3, 0.0, -c3, -c2, -c1]
    sines = [0.0, c3, c2, c1, 1.0, c1, c2, c3]
    offsets = np.array([-1.0, 0.0, 1.0])
    ys, xs = np.meshgrid(offsets, offsets, indexing="ij")
    filters = []
    for profile in ("edge", "line"):
        for cos_t, sin_t in zip(cosines, sines, strict=True):
            d = xs * cos_t + ys * sin_t
            f = np.clip(d, -1.0, 1.0) if profile == "edge" else 2.0 * np.minimum(np.abs(d), 1.0) - 1.0
            filters.append(f - math.fsum(f.ravel()) / 9.0)  # fsum: exactly rounded, no SIMD-dependent order
    centre = np.zeros((3, 3))
    centre[1, 1] = 1.0
    surround = -np.ones((3, 3))
    surround[1, 1] = 1.0
    plus = np.array([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    filters += [centre, surround, plus, 2.0 * plus - 1.0]
    bank = np.array(filters)
    return np.concatenate([bank, -bank])


_BANK = _filter_bank()
_BANK_NORM2 = np.array([math.fsum((f * f).ravel()) for f in _BANK])


def render_size(height: int, width: int) -> int:
    """Side of the square synthesis canvas: the next power of two at or above the target, at least 8."""
    side = 8
    while side < max(height, width):
        side *= 2
    return side


@numba.njit(cache=True, nogil=True)
def _upsample(src: np.ndarray, r: int, dst: np.ndarray) -> None:  # pragma: no cover - compiled
    """2× upsampling of src[:r, :r] into dst[:2r, :2r] with the separable [1, 3, 3, 1] / 4 filter."""
    for y in range(2 * r):
        ya = y // 2
        yb = min(max(ya + (1 if y % 2 else -1), 0), r - 1)
        for x in range(2 * r):
            xa = x // 2
            xb = min(max(xa + (1 if x % 2 else -1), 0), r - 1)
            dst[y, x] = 0.5625 * src[ya, xa] + 0.1875 * (src[ya, xb] + src[yb, xa]) + 0.0625 * src[yb, xb]


@numba.njit(cache=True, nogil=True)
def _pink_noise(state: np.ndarray, side: int, noise: np.ndarray) -> None:  # pragma: no cover - compiled
    """A unit-variance 1/f^α noise map in noise[:side, :side], α ∈ [0.5, 1.5], under a Laplacian envelope."""
    alpha = uniform_in(state, 0.5, 1.5)
    noise[:side, :side] = 0.0
    lattice = np.empty((side + 1, side + 1))
    cells = 2
    while cells <= side:
        cell = side / cells
        amplitude = dexp(alpha * dlog(cell))  # a 1/f^α amplitude spectrum: octave amplitude ∝ wavelength^α
        for gy in range(cells + 1):
            for gx in range(cells + 1):
                lattice[gy, gx] = uniform_in(state, -1.0, 1.0)
        for y in range(side):
            fy = (y + 0.5) / cell
            iy = int(fy)
            ty = fy - iy
            ty = ty * ty * (3.0 - 2.0 * ty)
            for x in range(side):
                fx = (x + 0.5) / cell
                ix = int(fx)
                tx = fx - ix
                tx = tx * tx * (3.0 - 2.0 * tx)
                top = lattice[iy, ix] + tx * (lattice[iy, ix + 1] - lattice[iy, ix])
                bottom = lattice[iy + 1, ix] + tx * (lattice[iy + 1, ix + 1] - lattice[iy + 1, ix])
                noise[y, x] += amplitude * (top + ty * (bottom - top))
        cells *= 2
    envelope = np.empty((5, 5))
    for gy in range(5):
        for gx in range(5):
            u = uniform(state) - 0.5
            magnitude = -dlog(1.0 - 2.0 * abs(u)) if abs(u) < 0.5 else 0.0
            envelope[gy, gx] = magnitude if u >= 0.0 else -magnitude  # Laplace(0, 1)
    for y in range(side):
        fy = (y + 0.5) * 4.0 / side
        iy = min(int(fy), 3)
        ty = fy - iy
        for x in range(side):
            fx = (x + 0.5) * 4.0 / side
            ix = min(int(fx), 3)
            tx = fx - ix
            top = envelope[iy, ix] + tx * (envelope[iy, ix + 1] - envelope[iy, ix])
            bottom = envelope[iy + 1, ix] + tx * (envelope[iy + 1, ix + 1] - envelope[iy + 1, ix])
            noise[y, x] *= top + ty * (bottom - top)
    flat = noise[:side, :side].copy().reshape(side * side)
    mean, std = mean_std(flat)
    inv = 1.0 / std if std > 0.0 else 0.0
    for y in range(side):
        for x in range(side):
            noise[y, x] = (noise[y, x] - mean) * inv


@numba.njit(cache=True, nogil=True)
def _downsample(noise: np.ndarray, side: int, r: int, dst: np.ndarray) -> None:  # pragma: no cover - compiled
    """Area-average noise[:side, :side] down to dst[:r, :r]."""
    f = side // r
    inv = 1.0 / (f * f)
    for y in range(r):
        for x in range(r):
            acc = 0.0
            for dy in range(f):
                for dx in range(f):
                    acc += noise[y * f + dy, x * f + dx]
            dst[y, x] = acc * inv


@numba.njit(cache=True, nogil=True)
def _layer(
    state: np.ndarray,
    x: np.ndarray,
    r_in: int,
    up: bool,
    y: np.ndarray,
    noise: np.ndarray,
    bank: np.ndarray,
    bank_norm2: np.ndarray,
    groups: np.ndarray,
    upsampled: np.ndarray,
    z: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """One modulated 3 × 3 convolution (optionally after 2× upsampling), noise, bias and ReLU: x → y.

    With "chin-chout" weights W[o, i] = g_o · f_k(i), modulation by styles s_i and demodulation per output,
    every output is (g_o / sqrt(g_o² Q + 1e-8)) · z with z = Σ_i s_i (x_i ⋆ f_k(i)) and
    Q = Σ_i s_i² |f_k(i)|²; z is computed once, grouping the inputs that share a filter.
    Returns the output resolution.
    """
    width = x.shape[0]
    n_bank = bank.shape[0]
    r = 2 * r_in if up else r_in
    n_sub = 5 + randint(state, n_bank - 4)
    subset = np.arange(n_bank)
    for k in range(n_sub):  # partial Fisher-Yates: a random subset of the bank
        j = k + randint(state, n_bank - k)
        subset[k], subset[j] = subset[j], subset[k]
    slot = np.full(n_bank, -1)
    used = np.empty(width, dtype=np.int64)
    n_used = 0
    q = 0.0
    for i in range(width):
        s = 1.0 + _STYLE_STD * normal(state)
        k = subset[randint(state, n_sub)]
        q += s * s * bank_norm2[k]
        if slot[k] < 0:
            slot[k] = n_used
            used[n_used] = k
            groups[n_used, :r_in, :r_in] = 0.0
            n_used += 1
        g = groups[slot[k]]
        for yy in range(r_in):
            for xx in range(r_in):
                g[yy, xx] += s * x[i, yy, xx]
    z[:r, :r] = 0.0
    for n in range(n_used):
        src = groups[n]
        if up:
            _upsample(groups[n], r_in, upsampled)
            src = upsampled
        f = bank[used[n]]
        for yy in range(r):
            for xx in range(r):
                acc = 0.0
                for dy in range(3):
                    sy = min(max(yy + dy - 1, 0), r - 1)  # edge padding: zero padding draws frames
                    for dx in range(3):
                        acc += f[dy, dx] * src[sy, min(max(xx + dx - 1, 0), r - 1)]
                z[yy, xx] += acc
    strength = uniform_in(state, 0.0, _NOISE_MAX)
    for o in range(width):
        gain = normal(state)
        a = gain / math.sqrt(gain * gain * q + 1e-8)
        b = uniform_in(state, -_BIAS_RANGE, _BIAS_RANGE)
        for yy in range(r):
            for xx in range(r):
                v = a * z[yy, xx] + strength * noise[yy, xx] + b
                y[o, yy, xx] = _SQRT2 * v if v > 0.0 else 0.0
    return r


@numba.njit(cache=True, nogil=True)
def _to_rgb(state: np.ndarray, x: np.ndarray, r: int, img: np.ndarray) -> None:  # pragma: no cover - compiled
    """Add the modulated 1 × 1 ToRGB projection of x[:, :r, :r] (random weights, no demodulation) to img."""
    width = x.shape[0]
    for i in range(width):
        s = (1.0 + _STYLE_STD * normal(state)) / math.sqrt(width)
        for c in range(img.shape[0]):
            w = s * normal(state)
            for yy in range(r):
                for xx in range(r):
                    img[c, yy, xx] += w * x[i, yy, xx]


@numba.njit(cache=True, nogil=True)
def _render(
    keys: np.ndarray, out: np.ndarray, side: int, bank: np.ndarray, bank_norm2: np.ndarray, stats: np.ndarray
) -> None:  # pragma: no cover - compiled
    count, height, width, channels = out.shape
    x = np.empty((WIDTH, side, side))
    y = np.empty((WIDTH, side, side))
    groups = np.empty((WIDTH, side, side))
    upsampled = np.empty((side, side))
    z = np.empty((side, side))
    noise_full = np.empty((side, side))
    noise = np.empty((side, side))
    img = np.empty((channels, side, side))
    img_up = np.empty((side, side))
    crop = np.empty(height * width)
    state = np.empty(1, dtype=np.uint64)
    for i in range(count):
        state[0] = keys[i]
        _pink_noise(state, side, noise_full)
        for c in range(WIDTH):
            for yy in range(4):
                for xx in range(4):
                    x[c, yy, xx] = normal(state)
        # layers alternate: a plain 3 × 3 at 4 × 4, then (upsampling, plain) per resolution up to the canvas;
        # one call site per kernel keeps numba's compile time (LLVM inlines per call site) short
        r = min(4, side)  # not the literal 4: numba would compile the kernels twice (literal and int64)
        n_layers = 1
        while 4 << (n_layers // 2) < side:
            n_layers += 2
        for j in range(n_layers):
            up = j % 2 == 1
            if up:
                for c in range(channels):
                    _upsample(img[c], r, img_up)
                    for yy in range(2 * r):
                        for xx in range(2 * r):
                            img[c, yy, xx] = img_up[yy, xx]
            src = x if j % 2 == 0 else y
            dst = y if j % 2 == 0 else x
            _downsample(noise_full, side, 2 * r if up else r, noise)
            r = _layer(state, src, r, up, dst, noise, bank, bank_norm2, groups, upsampled, z)
            if not up:
                if j == 0:
                    img[:, :4, :4] = 0.0
                _to_rgb(state, dst, r, img)
        oy = randint(state, side - height + 1)
        ox = randint(state, side - width + 1)
        for c in range(channels):
            target_mean = stats[c, 0] + stats[c, 1] * normal(state)
            target_std = max(stats[c, 2] + stats[c, 3] * normal(state), 0.02)
            for yy in range(height):
                for xx in range(width):
                    crop[yy * width + xx] = img[c, oy + yy, ox + xx]
            mean, std = mean_std(crop)
            scale = target_std / std if std > 0.0 else 0.0
            for yy in range(height):
                for xx in range(width):
                    out[i, yy, xx, c] = to_u8((crop[yy * width + xx] - mean) * scale + target_mean)


def render(keys: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (N, H, W, C) uint8 with the images of ``keys`` (N,) uint64."""
    stats = _GRAY_STATS if out.shape[3] == 1 else _RGB_STATS
    _render(keys, out, render_size(out.shape[1], out.shape[2]), _BANK, _BANK_NORM2, stats)
