"""``fractal``: FractalDB-style iterated-function-system fractals (Kataoka et al., ACCV 2020), with the
contractive sampling of Anderson & Farrell ("Improving Fractal Pre-training", WACV 2022).

A system has N ∈ {2, 3, 4} affine maps x ↦ A x + b. Each A = R(θ) D₁ diag(σ₁, σ₂) R(φ) D₂ with random
rotations, random sign flips D and singular values 1 ≥ σ₁ ≥ σ₂ ≥ 0 drawn so that the "σ-factor"
Σᵢ (σᵢ₁ + 2 σᵢ₂) is uniform on [(5 + N)/2, (6 + N)/2], the band Anderson & Farrell found to give the most
varied, least degenerate shapes; b is uniform on [-1, 1]². Maps are picked with probability ∝ |det A|.

The chaos game starts at the fixed point of the first map (a point of the attractor, so no burn-in), runs
``POINTS_PER_PIXEL`` points per pixel of the fractal's box, and fits the attractor's bounding box into a
random box of the canvas. FractalDB's fill-rate filter then rejects systems that cover less than
``MIN_FILL`` of their box (up to ``MAX_TRIES`` systems; the last one is kept). Pixels are coloured by hit
density through a random hue ramp (as Anderson & Farrell's colouring) and composited, with density as
opacity, over a random two-colour gradient (darker than the fractal, as FractalDB's black background).
Grayscale images use a gray density ramp over a darker gradient, since the luma of a saturated hue ramp is
dim and flat. A third
of the images hold two fractals. The canvas is rendered at least 2× (and at least 48 pixels) above the
target size and area-downsampled.

Everything is sequential scalar code (one chaos-game walker): vectorising the walk would change which
random number drives which point, and this is already fast (tens of thousands of points per millisecond).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from capc_common.synth._jit import (
    TWO_PI,
    dcos,
    dlog,
    dsin,
    hsv_to_rgb,
    randint,
    store_area,
    uniform,
    uniform_in,
)
from capc_common.synth.dead_leaves import supersample

DESCRIPTION = "FractalDB-style IFS fractals (contractive sampling, fill-rate filter), chaos game"

POINTS_PER_PIXEL = 4
"""Chaos-game points per canvas pixel of the fractal's box."""
MIN_FILL = 0.12
"""Fill-rate filter: the fraction of its box a fractal must cover."""
MAX_TRIES = 8
"""Systems tried per fractal before the fill-rate filter gives up and keeps the last one."""
_MAX_MAPS = 4


@numba.njit(cache=True, nogil=True)
def _sample_system(state: np.ndarray, maps: np.ndarray, cumulative: np.ndarray) -> int:  # pragma: no cover
    """Draw a contractive system into ``maps`` (rows a, b, c, d, e, f: x' = a x + b y + e, y' = c x + d y + f)
    and the cumulative map probabilities; returns N."""
    n = 2 + randint(state, 3)
    alpha = uniform_in(state, (5.0 + n) / 2.0, (6.0 + n) / 2.0)
    # Singular values 0 <= s2 <= s1 <= 1 with sum_i (s1 + 2 s2) = alpha, pair by pair (Anderson & Farrell).
    p = alpha
    q = alpha - 3.0 * n + 3.0
    total = 0.0
    for i in range(n):
        if i < n - 1:
            s1 = uniform_in(state, max(0.0, q / 3.0), min(1.0, p))
            q -= s1
            p -= s1
            s2 = uniform_in(state, max(0.0, q / 2.0), min(s1, p / 2.0))
            q = q - 2.0 * s2 + 3.0
            p -= 2.0 * s2
        else:
            s2 = uniform_in(state, max(0.0, (p - 1.0) / 2.0), p / 3.0)
            s1 = p - 2.0 * s2
        theta = uniform_in(state, -math.pi, math.pi)
        phi = uniform_in(state, -math.pi, math.pi)
        f1 = 1.0 if uniform(state) < 0.5 else -1.0
        f2 = 1.0 if uniform(state) < 0.5 else -1.0
        g1 = 1.0 if uniform(state) < 0.5 else -1.0
        g2 = 1.0 if uniform(state) < 0.5 else -1.0
        ct, st = dcos(theta), dsin(theta)
        cp, sp = dcos(phi), dsin(phi)
        # U = R(theta) diag(f1, f2), V = R(phi) diag(g1, g2), A = U diag(s1, s2) V
        u00, u01, u10, u11 = ct * f1, -st * f2, st * f1, ct * f2
        v00, v01, v10, v11 = cp * g1, -sp * g2, sp * g1, cp * g2
        maps[i, 0] = u00 * s1 * v00 + u01 * s2 * v10
        maps[i, 1] = u00 * s1 * v01 + u01 * s2 * v11
        maps[i, 2] = u10 * s1 * v00 + u11 * s2 * v10
        maps[i, 3] = u10 * s1 * v01 + u11 * s2 * v11
        maps[i, 4] = uniform_in(state, -1.0, 1.0)
        maps[i, 5] = uniform_in(state, -1.0, 1.0)
        weight = max(s1 * s2, 1e-6)  # |det A|
        total += weight
        cumulative[i] = total
    for i in range(n):
        cumulative[i] /= total
    cumulative[n - 1] = 1.0
    return n


@numba.njit(cache=True, nogil=True)
def _chaos_game(
    state: np.ndarray, maps: np.ndarray, cumulative: np.ndarray, n: int, points: np.ndarray
) -> None:  # pragma: no cover
    a, b, c, d, e, f = maps[0, 0], maps[0, 1], maps[0, 2], maps[0, 3], maps[0, 4], maps[0, 5]
    det = (1.0 - a) * (1.0 - d) - b * c
    x, y = e, f
    if abs(det) > 1e-12:  # fixed point of the first map: (I - A)^-1 b
        x = ((1.0 - d) * e + b * f) / det
        y = (c * e + (1.0 - a) * f) / det
    for k in range(points.shape[0]):
        u = uniform(state)
        m = 0
        while m < n - 1 and u >= cumulative[m]:
            m += 1
        xt = maps[m, 0] * x + maps[m, 1] * y + maps[m, 4]
        y = maps[m, 2] * x + maps[m, 3] * y + maps[m, 5]
        x = xt
        points[k, 0] = x
        points[k, 1] = y


@numba.njit(cache=True, nogil=True)
def _rasterise(
    points: np.ndarray, n_points: int, box: np.ndarray, hits: np.ndarray
) -> float:  # pragma: no cover
    """Add the points, fitted into ``box`` (x0, y0, w, h), to ``hits`` (zeroed there); returns the fill."""
    xmin, ymin = points[0, 0], points[0, 1]
    xmax, ymax = xmin, ymin
    for k in range(n_points):
        xmin = min(xmin, points[k, 0])
        xmax = max(xmax, points[k, 0])
        ymin = min(ymin, points[k, 1])
        ymax = max(ymax, points[k, 1])
    x0, y0, bw, bh = int(box[0]), int(box[1]), int(box[2]), int(box[3])
    span_x = max(xmax - xmin, 1e-9)
    span_y = max(ymax - ymin, 1e-9)
    scale = min(bw / span_x, bh / span_y) * 0.9999
    off_x = x0 + 0.5 * (bw - span_x * scale)
    off_y = y0 + 0.5 * (bh - span_y * scale)
    occupied = 0
    for k in range(n_points):
        px = int((points[k, 0] - xmin) * scale + off_x)
        py = int((points[k, 1] - ymin) * scale + off_y)
        if hits[py, px] == 0.0:
            occupied += 1
        hits[py, px] += 1.0
    return occupied / (bw * bh)


@numba.njit(cache=True, nogil=True)
def _render(keys: np.ndarray, out: np.ndarray, factor: int) -> None:  # pragma: no cover - compiled
    count, height, width, channels = out.shape
    rh = height * factor
    rw = width * factor
    short = min(rh, rw)
    canvas = np.empty((rh, rw, 3))
    hits = np.zeros((rh, rw))
    points = np.empty((POINTS_PER_PIXEL * rh * rw, 2))
    maps = np.empty((_MAX_MAPS, 6))
    cumulative = np.empty(_MAX_MAPS)
    box = np.empty(4)
    state = np.empty(1, dtype=np.uint64)
    c0 = np.empty(3)
    c1 = np.empty(3)
    fg = np.empty(3)
    for i in range(count):
        state[0] = keys[i]
        # background: a linear gradient between two muted colours along a random direction
        dark = 0.3 if channels == 1 else 0.5  # grayscale needs the larger gap to the fractal's gray ramp
        hsv_to_rgb(uniform(state), uniform_in(state, 0.0, 0.7), uniform_in(state, 0.0, dark), c0)
        hsv_to_rgb(uniform(state), uniform_in(state, 0.0, 0.7), uniform_in(state, 0.0, dark), c1)
        angle = uniform_in(state, 0.0, TWO_PI)
        gx = dcos(angle) / short
        gy = dsin(angle) / short
        for y in range(rh):
            for x in range(rw):
                t = min(max(0.5 + (x - 0.5 * rw) * gx + (y - 0.5 * rh) * gy, 0.0), 1.0)
                for ch in range(3):
                    canvas[y, x, ch] = c0[ch] + (c1[ch] - c0[ch]) * t
        fractals = 2 if uniform(state) < 1.0 / 3.0 else 1
        for _ in range(fractals):
            side = uniform_in(state, 0.55, 1.0) if fractals == 1 else uniform_in(state, 0.4, 0.75)
            bw = max(2, int(side * rw))
            bh = max(2, int(side * rh))
            box[0] = int(uniform(state) * (rw - bw + 1))
            box[1] = int(uniform(state) * (rh - bh + 1))
            box[2] = bw
            box[3] = bh
            n_points = POINTS_PER_PIXEL * bw * bh
            x0, y0 = int(box[0]), int(box[1])
            for _ in range(MAX_TRIES):
                hits[y0 : y0 + bh, x0 : x0 + bw] = 0.0
                n = _sample_system(state, maps, cumulative)
                _chaos_game(state, maps, cumulative, n, points[:n_points])
                if _rasterise(points, n_points, box, hits) >= MIN_FILL:
                    break
            peak = 0.0
            for y in range(y0, y0 + bh):
                for x in range(x0, x0 + bw):
                    peak = max(peak, hits[y, x])
            inv_log_peak = 1.0 / dlog(1.0 + peak)
            hue = uniform(state)
            hue_span = uniform_in(state, 0.1, 1.0)
            sat = uniform_in(state, 0.3, 1.0)
            val = uniform_in(state, 0.5, 1.0)
            for y in range(y0, y0 + bh):
                for x in range(x0, x0 + bw):
                    h = hits[y, x]
                    if h == 0.0:
                        continue
                    density = dlog(1.0 + h) * inv_log_peak
                    if channels == 1:  # a gray ramp: the luma of a hue ramp would be dim and flat
                        hsv_to_rgb(0.0, 0.0, val * (0.7 + 0.3 * density), fg)
                    else:
                        hsv_to_rgb(hue + hue_span * density, sat, val, fg)
                    alpha = 0.55 + 0.45 * density
                    for ch in range(3):
                        canvas[y, x, ch] += alpha * (fg[ch] - canvas[y, x, ch])
        store_area(canvas, factor, out[i])


def render(keys: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (N, H, W, C) uint8 with the images of ``keys`` (N,) uint64."""
    _render(keys, out, supersample(out.shape[1], out.shape[2]))
