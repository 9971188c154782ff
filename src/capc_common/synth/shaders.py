"""``shaders``: random procedural "fragment shader" programs, a stand-in for Shaders21k (Baradad et al.,
"Procedural image programs for representation learning", NeurIPS 2022).

Shaders21k renders 21,000 OpenGL shaders collected from Shadertoy and similar sites; its best pretraining
variant mixes several shaders per image (MixUp of 6). Those codes need an OpenGL context and cannot be
downloaded here, so this generator writes its own programs instead, from the building blocks such shaders
are made of, and evaluates them per pixel the way a fragment shader does:

* a random similarity transform of the pixel coordinates, then 0 to 3 **coordinate warps** chosen among
  sine displacement, polar mapping, kaleidoscopic folding, domain repetition, swirl, value-noise
  displacement and mirroring;
* one **field** over the warped coordinates: a sum of plane waves, concentric rings, fractal value noise
  (plain or ridged), Voronoi cells (distance or cell edges), a signed-distance shape (bands or a solid),
  a soft checkerboard or stripes, or a spiral; then optionally folded, turned into a glow, or quantised;
* a **cosine palette** colour = a + b·cos(2π(c·t + d)) (Quilez) with random a, b, c, d.

Each image is the MixUp (Dirichlet(1) weights) of 1 to 3 such programs, then given a random mean and
contrast (MixUp alone averages contrast away); a mix that is flat over the image (its luma varies by less
than ``MIN_STD``) is drawn again. Limits: these programs are far fewer kinds and much simpler
than 21k human-written shaders (no ray marching, no lighting, no time or feedback), and pixels are point
sampled (one sample per pixel, so the finest patterns alias as on a GPU without anti-aliasing).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from capc_common.synth._jit import (
    TWO_PI,
    datan2,
    dcos,
    dexp,
    dlog,
    dsin,
    fract,
    lattice_uniform,
    luma,
    mean_std,
    next_u64,
    randint,
    smoothstep,
    to_u8,
    uniform,
    uniform_in,
)

DESCRIPTION = "procedural shader-like programs (warps, fields, cosine palettes), MixUp of 1-3 programs"

MAX_PROGRAMS = 3
"""Programs mixed into one image (1 to this many, uniformly)."""
MIN_STD = 0.01
"""A mix whose luma varies less than this (standard deviation, intensities in [0, 1]) is flat: drawn again."""
MAX_TRIES = 8
"""Mixes drawn per image before a flat one is kept."""
_MAX_WARPS = 3
_WIDTH = 16  # parameters per op
# one row per op of a program: the transform, up to three warps, the field, the post-op, the palette
_ROW_TRANSFORM, _ROW_FIELD, _ROW_POST, _ROW_PALETTE = 0, 1 + _MAX_WARPS, 2 + _MAX_WARPS, 3 + _MAX_WARPS
_ROWS = 4 + _MAX_WARPS
_N_WARPS = 7  # sine, polar, kaleidoscope, repeat, swirl, noise, mirror
_N_FIELDS = 7  # waves, rings, fbm, voronoi, sdf, checker, spiral
_N_POSTS = 4  # none, fold, glow, steps
_NONE = -1
_MAX_PHASE = 2.0  # radians per pixel (π is the Nyquist limit)
_MAX_CELLS = 0.35  # noise-lattice cells per pixel
_MIN_UNIT_PIXELS = 64


@numba.njit(cache=True, nogil=True)
def _value_noise(seed: np.uint64, x: float, y: float) -> float:  # pragma: no cover - compiled
    """Smooth value noise in [0, 1): hashed lattice values, bilinear with a smoothstep fade."""
    fx = math.floor(x)
    fy = math.floor(y)
    ix = int(fx)
    iy = int(fy)
    tx = x - fx
    ty = y - fy
    tx = tx * tx * (3.0 - 2.0 * tx)
    ty = ty * ty * (3.0 - 2.0 * ty)
    a = lattice_uniform(seed, ix, iy)
    b = lattice_uniform(seed, ix + 1, iy)
    c = lattice_uniform(seed, ix, iy + 1)
    d = lattice_uniform(seed, ix + 1, iy + 1)
    top = a + tx * (b - a)
    return top + ty * (c + tx * (d - c) - top)


@numba.njit(cache=True, nogil=True)
def _warp(code: int, p: np.ndarray, seed: np.uint64, xy: np.ndarray) -> None:  # pragma: no cover - compiled
    """Apply coordinate warp ``code`` with parameters ``p`` (uniforms in [0, 1)) to the point ``xy``."""
    x, y = xy[0], xy[1]
    if code == 0:  # sine displacement
        amp = 0.05 + 0.4 * p[0]
        freq = 1.0 + 5.0 * p[1]
        x = x + amp * dsin(freq * y + TWO_PI * p[2])
        y = y + amp * dsin(freq * x + TWO_PI * p[3])
    elif code == 1:  # polar mapping (radius, angle turns × m)
        r = math.sqrt(x * x + y * y)
        a = datan2(y, x)
        x = r * (0.5 + 2.0 * p[0])
        y = a * (1 + int(p[1] * 6)) / math.pi
    elif code == 2:  # kaleidoscope: fold the angle into one of n mirrored sectors
        sector = TWO_PI / (2 + int(p[0] * 8))
        r = math.sqrt(x * x + y * y)
        a = datan2(y, x) + TWO_PI * p[1]
        a = a - sector * math.floor(a / sector)
        a = abs(a - 0.5 * sector)
        x = r * dcos(a)
        y = r * dsin(a)
    elif code == 3:  # domain repetition in tiles of side `cell`
        cell = 0.3 + 1.2 * p[0]
        x = cell * (fract(x / cell + 0.5) - 0.5)
        y = cell * (fract(y / cell + 0.5 + 0.5 * p[1]) - 0.5)
    elif code == 4:  # swirl: rotate by an angle that decays with the radius
        angle = (p[0] - 0.5) * 10.0 * dexp(-(x * x + y * y) * (0.3 + 2.0 * p[1]))
        c = dcos(angle)
        s = dsin(angle)
        x, y = c * x - s * y, s * x + c * y
    elif code == 5:  # value-noise displacement
        amp = 0.1 + 0.6 * p[0]
        freq = 1.0 + 4.0 * p[1]
        dx = _value_noise(seed, freq * x, freq * y) - 0.5
        dy = _value_noise(seed ^ np.uint64(0x5851F42D4C957F2D), freq * x, freq * y) - 0.5
        x = x + 2.0 * amp * dx
        y = y + 2.0 * amp * dy
    else:  # mirror: rotate, then fold both axes
        c = dcos(TWO_PI * p[0])
        s = dsin(TWO_PI * p[0])
        x, y = c * x - s * y, s * x + c * y
        x = abs(x) - 0.6 * p[1]
        y = abs(y) - 0.6 * p[2]
    xy[0] = x
    xy[1] = y


@numba.njit(cache=True, nogil=True)
def _field(
    code: int, p: np.ndarray, seed: np.uint64, x: float, y: float, pixel: float
) -> float:  # pragma: no cover
    """Field ``code`` at (x, y), roughly in [-1, 1].

    ``pixel`` is the size of one pixel in field units: angular frequencies are capped at ``_MAX_PHASE``
    radians per pixel and noise lattices at ``_MAX_CELLS`` cells per pixel, so patterns stay above the
    pixel grid instead of aliasing into speckle.
    """
    cap = _MAX_PHASE / pixel
    if code == 0:  # sum of 1-4 plane waves
        n = 1 + int(p[0] * 4)
        t = 0.0
        for j in range(n):
            angle = TWO_PI * p[1 + 3 * j]
            freq = min(1.0 + 7.0 * p[2 + 3 * j], cap)
            t += dsin(freq * (dcos(angle) * x + dsin(angle) * y) + TWO_PI * p[3 + 3 * j])
        return t / math.sqrt(n)
    if code == 1:  # concentric rings
        dx = x - (p[0] - 0.5)
        dy = y - (p[1] - 0.5)
        return dsin(min(3.0 + 15.0 * p[2], cap) * math.sqrt(dx * dx + dy * dy) + TWO_PI * p[3])
    if code == 2:  # fractal value noise (fBm), ridged half of the time
        octaves = 2 + int(p[0] * 4)
        freq = 1.0 + 3.0 * p[1]
        gain = 0.4 + 0.3 * p[2]
        amp = 1.0
        t = 0.0
        norm = 0.0
        for o in range(octaves):
            if o > 0 and freq * pixel > _MAX_CELLS:
                break
            t += amp * (2.0 * _value_noise(seed + np.uint64(o), freq * x, freq * y) - 1.0)
            norm += amp
            amp *= gain
            freq *= 2.0
        t = 1.8 * t / norm
        return 1.0 - 2.0 * abs(t) if p[3] < 0.5 else t
    if code == 3:  # Voronoi: distance to the nearest feature point, or cell edges (F2 - F1)
        scale = min(2.0 + 6.0 * p[0], _MAX_CELLS / (4.0 * pixel))  # cells at least 4 / _MAX_CELLS pixels
        sx = x * scale
        sy = y * scale
        cx = math.floor(sx)
        cy = math.floor(sy)
        f1 = 9.0
        f2 = 9.0
        for j in range(-1, 2):
            for i in range(-1, 2):
                gx = int(cx) + i
                gy = int(cy) + j
                px = gx + lattice_uniform(seed, gx, gy) - sx
                py = gy + lattice_uniform(seed ^ np.uint64(0x2545F4914F6CDD1D), gx, gy) - sy
                d = px * px + py * py
                if d < f1:
                    f2 = f1
                    f1 = d
                elif d < f2:
                    f2 = d
        if p[1] < 0.5:
            return 2.0 * math.sqrt(f1) - 1.0
        return 1.0 - 2.0 * min(3.0 * (math.sqrt(f2) - math.sqrt(f1)), 1.0)
    if code == 4:  # signed distance to a circle or a box: bands or a solid shape
        if p[0] < 0.5:
            d = math.sqrt(x * x + y * y) - (0.2 + 0.6 * p[1])
        else:
            d = max(abs(x) - (0.1 + 0.6 * p[1]), abs(y) - (0.1 + 0.6 * p[2]))
        if p[3] < 0.5:
            return dsin(min(4.0 + 20.0 * p[4], cap) * d + TWO_PI * p[5])
        return 1.0 - 2.0 * smoothstep(-0.02, 0.02 + 0.2 * p[4], d)
    if code == 5:  # soft checkerboard or wavy stripes
        freq = min(2.0 + 8.0 * p[0], cap)
        if p[1] < 0.5:
            return dsin(freq * x) * dsin(freq * y) * 1.5
        return dsin(freq * x + (0.5 + 3.0 * p[2]) * dsin((1.0 + 4.0 * p[3]) * y))
    arms = 1 + int(p[0] * 6)  # spiral
    r = math.sqrt(x * x + y * y)
    radial = r if p[2] < 0.5 else dlog(r + 1e-3)
    return dsin(arms * datan2(y, x) + min(2.0 + 12.0 * p[1], cap) * radial + TWO_PI * p[3])


@numba.njit(cache=True, nogil=True)
def _post(code: int, p: np.ndarray, t: float) -> float:  # pragma: no cover - compiled
    if code == 1:  # fold
        return 2.0 * abs(t) - 1.0
    if code == 2:  # glow around the field's zero set
        return min(0.08 / (abs(t) + 0.04), 2.0) - 1.0
    if code == 3:  # quantise into 2-6 levels
        levels = 2 + int(p[0] * 5)
        return 2.0 * math.floor((0.5 + 0.5 * t) * levels) / levels - 1.0
    return t


@numba.njit(cache=True, nogil=True)
def _sample_program(
    state: np.ndarray, codes: np.ndarray, params: np.ndarray, seeds: np.ndarray
) -> None:  # pragma: no cover
    """Draw one program into ``codes`` (rows), ``params`` (rows × _WIDTH uniforms) and ``seeds`` (rows)."""
    for row in range(_ROWS):
        for k in range(_WIDTH):
            params[row, k] = uniform(state)
        seeds[row] = next_u64(state)
        codes[row] = _NONE
    n_warps = randint(state, _MAX_WARPS + 1)
    for w in range(n_warps):
        codes[1 + w] = randint(state, _N_WARPS)
    codes[_ROW_FIELD] = randint(state, _N_FIELDS)
    codes[_ROW_POST] = randint(state, _N_POSTS)


@numba.njit(cache=True, nogil=True)
def _paint(
    state: np.ndarray,
    height: int,
    width: int,
    codes: np.ndarray,
    params: np.ndarray,
    seeds: np.ndarray,
    weights: np.ndarray,
    rgb: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Draw a MixUp of 1 to MAX_PROGRAMS programs and render it into ``rgb`` (H·W·3, interleaved)."""
    n_programs = 1 + randint(state, MAX_PROGRAMS)
    total = 0.0
    for k in range(n_programs):
        _sample_program(state, codes[k], params[k], seeds[k])
        weights[k] = -dlog(1.0 - uniform(state))  # Exp(1) draws normalised: Dirichlet(1, ..., 1)
        total += weights[k]
    for k in range(n_programs):
        weights[k] /= total
    # one field unit spans at least _MIN_UNIT_PIXELS / 2 pixels: small images show a window of the program
    # (as a crop of a larger render) rather than squeezing its patterns below the pixel grid
    half = 0.5 * max(min(height, width), _MIN_UNIT_PIXELS)
    xy = np.empty(2)
    rgb[:] = 0.0
    for k in range(n_programs):
        tp = params[k, _ROW_TRANSFORM]
        angle = TWO_PI * tp[0]
        zoom = dexp(dlog(0.6) + tp[1] * dlog(2.5 / 0.6))  # log-uniform on [0.6, 2.5]
        ca = dcos(angle) * zoom
        sa = dsin(angle) * zoom
        pixel = zoom / half
        ox = tp[2] - 0.5
        oy = tp[3] - 0.5
        pal = params[k, _ROW_PALETTE]
        for yy in range(height):
            v = (yy + 0.5 - 0.5 * height) / half
            for xx in range(width):
                u = (xx + 0.5 - 0.5 * width) / half
                xy[0] = ca * u - sa * v + ox
                xy[1] = sa * u + ca * v + oy
                for w in range(1, 1 + _MAX_WARPS):
                    if codes[k, w] != _NONE:
                        _warp(codes[k, w], params[k, w], seeds[k, w], xy)
                t = _field(
                    codes[k, _ROW_FIELD], params[k, _ROW_FIELD], seeds[k, _ROW_FIELD], xy[0], xy[1], pixel
                )
                t = 0.5 + 0.5 * _post(codes[k, _ROW_POST], params[k, _ROW_POST], t)
                base = (yy * width + xx) * 3
                for c in range(3):
                    # cosine palette: a in [0.3, 0.7], b in [0.2, 0.5], c in [0.3, 1.5], d in [0, 1]
                    a = 0.3 + 0.4 * pal[c]
                    b = 0.2 + 0.3 * pal[3 + c]
                    f = 0.3 + 1.2 * pal[6 + c]
                    rgb[base + c] += weights[k] * (a + b * dcos(TWO_PI * (f * t + pal[9 + c])))


@numba.njit(cache=True, nogil=True)
def _render(keys: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    count, height, width, channels = out.shape
    codes = np.empty((MAX_PROGRAMS, _ROWS), dtype=np.int64)
    params = np.empty((MAX_PROGRAMS, _ROWS, _WIDTH))
    seeds = np.empty((MAX_PROGRAMS, _ROWS), dtype=np.uint64)
    weights = np.empty(MAX_PROGRAMS)
    rgb = np.empty(height * width * 3)
    gray = np.empty(height * width)
    state = np.empty(1, dtype=np.uint64)
    for i in range(count):
        state[0] = keys[i]
        target_mean = uniform_in(state, 0.3, 0.7)
        target_std = uniform_in(state, 0.15, 0.3)
        # a program can be flat over the window it shows (inside a solid shape, say): redraw it
        for _ in range(MAX_TRIES):
            _paint(state, height, width, codes, params, seeds, weights, rgb)
            for n in range(height * width):
                gray[n] = luma(rgb[3 * n], rgb[3 * n + 1], rgb[3 * n + 2])
            if mean_std(gray)[1] >= MIN_STD:
                break
        mean, std = mean_std(gray) if channels == 1 else mean_std(rgb)
        scale = target_std / std if std > 1e-9 else 1.0
        flat = out[i].reshape(height * width * channels)
        for n in range(height * width * channels):
            value = gray[n] if channels == 1 else rgb[n]
            flat[n] = to_u8((value - mean) * scale + target_mean)


def render(keys: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (N, H, W, C) uint8 with the images of ``keys`` (N,) uint64."""
    _render(keys, out)
