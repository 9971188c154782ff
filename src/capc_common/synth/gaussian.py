"""``gaussian``: i.i.d. Gaussian pixel noise, the worst-case transfer set of DIET-PATE.

Each image draws its own brightness and contrast (per-channel means in [0.25, 0.75], one standard deviation
in [0.10, 0.35] of the intensity range), then every pixel value independently from that normal, clipped
to [0, 1]. Varying the first two moments per image keeps current-statistics BatchNorm from seeing one
constant input distribution; there is no spatial structure at all.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from capc_common.synth._jit import TWO_PI, dcos, dlog, dsin, to_u8, uniform, uniform_in

DESCRIPTION = "i.i.d. Gaussian pixels; per-image mean and contrast (no spatial structure)"


@numba.njit(cache=True, nogil=True)
def _render(keys: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    count, height, width, channels = out.shape
    state = np.empty(1, dtype=np.uint64)
    mean = np.empty(channels)
    flat_size = height * width * channels
    for i in range(count):
        state[0] = keys[i]
        for c in range(channels):
            mean[c] = uniform_in(state, 0.25, 0.75)
        sigma = uniform_in(state, 0.10, 0.35)
        flat = out[i].reshape(flat_size)
        # Box-Muller gives two normals per pair of uniforms.
        for k in range(0, flat_size, 2):
            radius = sigma * math.sqrt(-2.0 * dlog(1.0 - uniform(state)))
            angle = TWO_PI * uniform(state)
            flat[k] = to_u8(mean[k % channels] + radius * dcos(angle))
            if k + 1 < flat_size:
                flat[k + 1] = to_u8(mean[(k + 1) % channels] + radius * dsin(angle))


def render(keys: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (N, H, W, C) uint8 with the images of ``keys`` (N,) uint64."""
    _render(keys, out)
