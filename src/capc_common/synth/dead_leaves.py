"""``dead_leaves``: the "mixed" dead-leaves model of Baradad et al. (NeurIPS 2021, "Learning to see by
looking at noise"), after Lee, Mumford & Huang (IJCV 2001).

Opaque leaves of six kinds (circle, axis-aligned square, rotated square, rectangle, triangle,
quadrilateral; one kind chosen uniformly per leaf) with uniformly random colours fall on the image. Leaf
radii follow the scale-invariant law p(r) ∝ r⁻³ on [0.03, 1] × the image side (sampled exactly by inverting
the truncated CDF). Leaves are painted front to back: each one only covers pixels no earlier leaf covered,
and painting stops once every pixel is covered, which is the exact occlusion process (painting back to
front and stopping early is not). The canvas is rendered ``SUPERSAMPLE`` times above the target size
(at least 48 pixels on the short side) and area-downsampled, so edges are anti-aliased like a camera's.

Grayscale images take a uniform gray level per leaf instead of the luma of a uniform colour (which would
crowd the levels around the middle and lose contrast).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from capc_common.synth._jit import HALF_PI, PI, TWO_PI, dcos, dsin, randint, store_area, uniform

DESCRIPTION = "dead leaves, mixed shapes, r^-3 radii, random colours, front-to-back until covered"

R_MIN = 0.03
"""Smallest leaf radius, as a fraction of the canvas side."""
R_MAX = 1.0
"""Largest leaf radius, as a fraction of the canvas side."""
MAX_LEAVES = 20_000
"""Safety bound on leaves per image; the last leaf then fills whatever is still uncovered (never reached
in practice: a 64 × 64 canvas is covered after a few hundred leaves)."""

_CIRCLE, _SQUARE, _ROTATED_SQUARE, _RECTANGLE, _TRIANGLE, _QUADRILATERAL = range(6)
_TILE = 8


def supersample(height: int, width: int) -> int:
    """The integer factor the canvas is rendered above the target size: at least 2, at least 48 pixels."""
    return max(2, -(-48 // min(height, width)))


@numba.njit(cache=True, nogil=True)
def _leaf_polygon(
    kind: int, r: float, u: np.ndarray, vx: np.ndarray, vy: np.ndarray
) -> int:  # pragma: no cover
    """Vertices (relative to the leaf centre, counter-clockwise) of a polygonal leaf; returns their number.

    ``u`` holds the leaf's four shape uniforms (orientation, corner angles).
    """
    if kind in (_SQUARE, _ROTATED_SQUARE):
        phase = PI / 4.0 + (u[0] * HALF_PI if kind == _ROTATED_SQUARE else 0.0)
        for k in range(4):
            vx[k] = r * dcos(phase + k * HALF_PI)
            vy[k] = r * dsin(phase + k * HALF_PI)
        return 4
    if kind == _RECTANGLE:
        cx = r * dcos(u[0] * HALF_PI)
        cy = r * dsin(u[0] * HALF_PI)
        vx[0], vy[0] = cx, cy
        vx[1], vy[1] = -cx, cy
        vx[2], vy[2] = -cx, -cy
        vx[3], vy[3] = cx, -cy
        return 4
    n = 3 if kind == _TRIANGLE else 4
    # insertion sort of the corner angles: counter-clockwise order makes the polygon convex
    for k in range(1, n):
        a = u[k]
        j = k - 1
        while j >= 0 and u[j] > a:
            u[j + 1] = u[j]
            j -= 1
        u[j + 1] = a
    for k in range(n):
        vx[k] = r * dcos(TWO_PI * u[k])
        vy[k] = r * dsin(TWO_PI * u[k])
    return n


@numba.njit(cache=True, nogil=True)
def _render(keys: np.ndarray, out: np.ndarray, factor: int) -> None:  # pragma: no cover - compiled
    count, height, width, channels = out.shape
    rh = height * factor
    rw = width * factor
    canvas = np.empty((rh, rw, 3))
    covered = np.empty((rh, rw), dtype=np.bool_)
    # uncovered pixels per _TILE x _TILE tile: most leaves land where everything is already covered
    th = (rh + _TILE - 1) // _TILE
    tw = (rw + _TILE - 1) // _TILE
    open_in_tile = np.empty((th, tw), dtype=np.int64)
    state = np.empty(1, dtype=np.uint64)
    shape_u = np.empty(4)
    vx = np.empty(4)
    vy = np.empty(4)
    colour = np.empty(3)
    side = max(rh, rw)
    inv_a2 = 1.0 / (R_MIN * side) ** 2
    inv_b2 = 1.0 / (R_MAX * side) ** 2
    for i in range(count):
        state[0] = keys[i]
        covered[:, :] = False
        for ty in range(th):
            for tx in range(tw):
                open_in_tile[ty, tx] = (min(rh, (ty + 1) * _TILE) - ty * _TILE) * (
                    min(rw, (tx + 1) * _TILE) - tx * _TILE
                )
        remaining = rh * rw
        leaves = 0
        while remaining > 0:
            leaves += 1
            # every leaf consumes the same number of draws, whatever its kind
            kind = randint(state, 6)
            # inverse CDF of p(r) ∝ r^-3 on [a, b]: r = (a^-2 - u (a^-2 - b^-2))^(-1/2)
            r = 1.0 / math.sqrt(inv_a2 - uniform(state) * (inv_a2 - inv_b2))
            cx = uniform(state) * rw
            cy = uniform(state) * rh
            for c in range(3):
                colour[c] = uniform(state)
            if channels == 1:
                colour[1] = colour[0]
                colour[2] = colour[0]
            for k in range(4):
                shape_u[k] = uniform(state)
            last = leaves >= MAX_LEAVES
            y0 = max(0, math.floor(cy - r))
            y1 = min(rh - 1, math.floor(cy + r))
            x0 = max(0, math.floor(cx - r))
            x1 = min(rw - 1, math.floor(cx + r))
            if last:
                y0, y1, x0, x1 = 0, rh - 1, 0, rw - 1
            if y0 > y1 or x0 > x1:
                continue
            open_pixels = 0
            for ty in range(y0 // _TILE, y1 // _TILE + 1):
                for tx in range(x0 // _TILE, x1 // _TILE + 1):
                    open_pixels += open_in_tile[ty, tx]
            if open_pixels == 0:
                continue
            n = 0 if kind == _CIRCLE else _leaf_polygon(kind, r, shape_u, vx, vy)
            r2 = r * r
            for ty in range(y0 // _TILE, y1 // _TILE + 1):
                for tx in range(x0 // _TILE, x1 // _TILE + 1):
                    if open_in_tile[ty, tx] == 0:
                        continue
                    for y in range(max(y0, ty * _TILE), min(y1, ty * _TILE + _TILE - 1) + 1):
                        py = y + 0.5 - cy
                        for x in range(max(x0, tx * _TILE), min(x1, tx * _TILE + _TILE - 1) + 1):
                            if covered[y, x]:
                                continue
                            px = x + 0.5 - cx
                            inside = last
                            if not inside:
                                if n == 0:
                                    inside = px * px + py * py <= r2
                                else:
                                    inside = True
                                    for k in range(n):
                                        k1 = k + 1 if k + 1 < n else 0
                                        ex = vx[k1] - vx[k]
                                        ey = vy[k1] - vy[k]
                                        if ex * (py - vy[k]) - ey * (px - vx[k]) < 0.0:
                                            inside = False
                                            break
                            if inside:
                                covered[y, x] = True
                                open_in_tile[ty, tx] -= 1
                                remaining -= 1
                                canvas[y, x, 0] = colour[0]
                                canvas[y, x, 1] = colour[1]
                                canvas[y, x, 2] = colour[2]
        store_area(canvas, factor, out[i])


def render(keys: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (N, H, W, C) uint8 with the images of ``keys`` (N,) uint64."""
    _render(keys, out, supersample(out.shape[1], out.shape[2]))
