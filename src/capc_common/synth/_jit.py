"""Compiled building blocks every generator shares: a counter-based RNG, deterministic math, pixel output.

Why hand-written math: every party regenerates the student's query images on its own machine, so an image
must come out byte-identical on any CPU (checked on AVX2 and AVX-512 x86-64; see docs/synth.md).
IEEE-754 guarantees correctly rounded ``+ - * /`` and ``sqrt``, but not ``sin``/``exp``/``log``: libm and
numpy's SIMD loops pick different code paths (and different last bits) on AVX2, AVX-512 or NEON machines.
So the transcendental functions here are range reductions plus fixed polynomials made of basic operations
only; numba compiles them without fast-math, so LLVM may neither reassociate nor contract them into FMAs,
and the results do not depend on the SIMD width. Reductions are sequential loops (a fixed order) for the
same reason.

The RNG is SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014):
the j-th draw of a stream is ``mix64(key + j * golden)``, a pure function of the image's key and j, so an
image never depends on which other images were generated with it.

Numba caches a compiled kernel keyed on its own source file only: after editing this module, delete the
``__pycache__`` folder of this package, or cached generator kernels keep the old helpers (the known-answer
digests in ``tests/synth`` catch a stale cache).
"""

from __future__ import annotations

import math

import numba
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S11 = np.uint64(11)
_S27 = np.uint64(27)
_S30 = np.uint64(30)
_S31 = np.uint64(31)
_TWO_M53 = 1.0 / 9007199254740992.0
_LATTICE_X = np.uint64(0xD1B54A32D192ED03)  # odd multipliers decorrelating the two lattice axes
_LATTICE_Y = np.uint64(0xABC98388FB8FAC03)
_LATTICE_OFFSET = 1 << 40  # keeps lattice coordinates positive before the unsigned conversion

PI = 3.141592653589793
TWO_PI = 6.283185307179586
HALF_PI = 1.5707963267948966
LN2 = 0.6931471805599453
# 2π split into a head with 33 significant bits and a tail, so k * head is exact for |k| < 2^20 (Cody-Waite).
_TWO_PI_HI = 6.2831853069365025
_TWO_PI_LO = TWO_PI - _TWO_PI_HI
_LN2_HI = 0.6931471803691238
_LN2_LO = LN2 - _LN2_HI
_TAN_PI_8 = 0.41421356237309503  # √2 − 1
_QUARTER_PI = 0.7853981633974483

# ---------------------------------------------------------------- random numbers


@numba.njit(cache=True, nogil=True)
def mix64(z: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """SplitMix64's finaliser: a bijective 64-bit mix in which every input bit affects every output bit."""
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@numba.njit(cache=True, nogil=True)
def next_u64(state: np.ndarray) -> np.uint64:  # pragma: no cover - compiled
    """Advance a SplitMix64 stream held in ``state[0]`` and return its next 64-bit word."""
    state[0] += _GOLDEN
    return mix64(state[0])


@numba.njit(cache=True, nogil=True)
def lattice_uniform(seed: np.uint64, ix: int, iy: int) -> float:  # pragma: no cover - compiled
    """A uniform in [0, 1) attached to lattice point (ix, iy) of noise ``seed``: a hash, not a stream."""
    hx = np.uint64(ix + _LATTICE_OFFSET) * _LATTICE_X
    hy = np.uint64(iy + _LATTICE_OFFSET) * _LATTICE_Y
    return float(mix64(seed ^ hx ^ hy) >> _S11) * _TWO_M53


@numba.njit(cache=True, nogil=True)
def uniform(state: np.ndarray) -> float:  # pragma: no cover - compiled
    """A float64 uniform on [0, 1) with 53 random bits (exact: no rounding is involved)."""
    return float(next_u64(state) >> _S11) * _TWO_M53


@numba.njit(cache=True, nogil=True)
def uniform_in(state: np.ndarray, low: float, high: float) -> float:  # pragma: no cover - compiled
    """A float64 uniform on [low, high)."""
    return low + (high - low) * uniform(state)


# An explicit signature: call sites pass integer literals, and numba would compile one copy per literal.
@numba.njit("int64(uint64[::1], int64)", cache=True, nogil=True)
def randint(state: np.ndarray, n: int) -> int:  # pragma: no cover - compiled
    """An integer uniform on {0, ..., n - 1} (bias below 2^-40 for the small n used here)."""
    k = int(uniform(state) * n)
    return k if k < n else n - 1


@numba.njit(cache=True, nogil=True)
def normal(state: np.ndarray) -> float:  # pragma: no cover - compiled
    """A standard normal draw (Box-Muller on the deterministic log and cos below)."""
    u = 1.0 - uniform(state)  # (0, 1]: log stays finite
    return math.sqrt(-2.0 * dlog(u)) * dcos(TWO_PI * uniform(state))


# ---------------------------------------------------------------- deterministic math


@numba.njit(cache=True, nogil=True)
def _sin_kernel(r: float) -> float:  # pragma: no cover - compiled
    # Taylor series of sin on [-π/2, π/2] up to r^17: truncation error below 4e-15.
    r2 = r * r
    p = 1.0 / 355687428096000.0
    p = p * r2 - 1.0 / 1307674368000.0
    p = p * r2 + 1.0 / 6227020800.0
    p = p * r2 - 1.0 / 39916800.0
    p = p * r2 + 1.0 / 362880.0
    p = p * r2 - 1.0 / 5040.0
    p = p * r2 + 1.0 / 120.0
    p = p * r2 - 1.0 / 6.0
    return r + r * r2 * p


@numba.njit(cache=True, nogil=True)
def dsin(x: float) -> float:  # pragma: no cover - compiled
    """sin(x), identical on every IEEE-754 machine; absolute error below 1e-13 for |x| < 1000."""
    k = math.floor(x * (1.0 / TWO_PI) + 0.5)
    r = (x - k * _TWO_PI_HI) - k * _TWO_PI_LO  # r in [-π, π]
    if r > HALF_PI:
        r = PI - r
    elif r < -HALF_PI:
        r = -PI - r
    return _sin_kernel(r)


@numba.njit(cache=True, nogil=True)
def dcos(x: float) -> float:  # pragma: no cover - compiled
    """cos(x) as sin(x + π/2): same guarantees as :func:`dsin`."""
    return dsin(x + HALF_PI)


@numba.njit(cache=True, nogil=True)
def dexp(x: float) -> float:  # pragma: no cover - compiled
    """exp(x), relative error below 1e-15; arguments are clamped to [-700, 700]."""
    x = min(max(x, -700.0), 700.0)
    k = math.floor(x * (1.0 / LN2) + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO  # |r| <= ln2/2
    p = 1.0 / 479001600.0
    for d in (39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0):
        p = p * r + 1.0 / d
    return math.ldexp(p, int(k))


@numba.njit(cache=True, nogil=True)
def dlog(x: float) -> float:  # pragma: no cover - compiled
    """Natural log of x > 0 (frexp + atanh series), relative error below 1e-15."""
    m, e = math.frexp(x)  # x = m * 2^e, m in [0.5, 1): exact
    if m < 0.7071067811865476:
        m *= 2.0
        e -= 1
    s = (m - 1.0) / (m + 1.0)  # |s| < 0.172
    s2 = s * s
    p = 1.0 / 21.0
    for d in (19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0):
        p = p * s2 + 1.0 / d
    return 2.0 * s * p + e * _LN2_HI + e * _LN2_LO


@numba.njit(cache=True, nogil=True)
def _atan_unit(t: float) -> float:  # pragma: no cover - compiled
    # atan on [0, 1]: reduce to |u| <= tan(π/8) around π/4, then an odd Taylor series to u^31 (error < 1e-14).
    base = 0.0
    if t > _TAN_PI_8:
        base = _QUARTER_PI
        t = (t - 1.0) / (t + 1.0)
    t2 = t * t
    p = 0.0
    for n in range(15, -1, -1):
        term = 1.0 / (2 * n + 1)
        p = p * t2 + (term if n % 2 == 0 else -term)
    return base + t * p


@numba.njit(cache=True, nogil=True)
def datan2(y: float, x: float) -> float:  # pragma: no cover - compiled
    """atan2(y, x) in (-π, π]; atan2(0, 0) = 0."""
    ax = abs(x)
    ay = abs(y)
    if ax == 0.0 and ay == 0.0:
        return 0.0
    a = _atan_unit(ay / ax) if ay <= ax else HALF_PI - _atan_unit(ax / ay)
    if x < 0.0:
        a = PI - a
    return -a if y < 0.0 else a


@numba.njit(cache=True, nogil=True)
def fract(x: float) -> float:  # pragma: no cover - compiled
    """x − floor(x), in [0, 1)."""
    return x - math.floor(x)


@numba.njit(cache=True, nogil=True)
def smoothstep(e0: float, e1: float, x: float) -> float:  # pragma: no cover - compiled
    """GLSL smoothstep: 0 below e0, 1 above e1, a cubic Hermite ramp between."""
    t = min(max((x - e0) / (e1 - e0), 0.0), 1.0)
    return t * t * (3.0 - 2.0 * t)


# ---------------------------------------------------------------- colour and pixels


@numba.njit(cache=True, nogil=True)
def hsv_to_rgb(h: float, s: float, v: float, rgb: np.ndarray) -> None:  # pragma: no cover - compiled
    """Write the RGB of hue ``h`` (in turns, any real), saturation ``s`` and value ``v`` to ``rgb``."""
    h6 = fract(h) * 6.0
    sector = min(int(h6), 5)
    f = h6 - sector
    p = v * (1.0 - s)
    q = v * (1.0 - s * f)
    t = v * (1.0 - s * (1.0 - f))
    if sector == 0:
        rgb[0], rgb[1], rgb[2] = v, t, p
    elif sector == 1:
        rgb[0], rgb[1], rgb[2] = q, v, p
    elif sector == 2:
        rgb[0], rgb[1], rgb[2] = p, v, t
    elif sector == 3:
        rgb[0], rgb[1], rgb[2] = p, q, v
    elif sector == 4:
        rgb[0], rgb[1], rgb[2] = t, p, v
    else:
        rgb[0], rgb[1], rgb[2] = v, p, q


@numba.njit(cache=True, nogil=True)
def luma(r: float, g: float, b: float) -> float:  # pragma: no cover - compiled
    """ITU-R BT.601 luma, the weights PIL's ``convert("L")`` uses."""
    return 0.299 * r + 0.587 * g + 0.114 * b


@numba.njit(cache=True, nogil=True)
def to_u8(v: float) -> np.uint8:  # pragma: no cover - compiled
    """Quantise an intensity in [0, 1] to uint8: clipped, half rounded up, NaN to 0 (no undefined cast)."""
    if not v > 0.0:
        return np.uint8(0)
    if v >= 1.0:
        return np.uint8(255)
    return np.uint8(int(v * 255.0 + 0.5))


@numba.njit(cache=True, nogil=True)
def store_area(canvas: np.ndarray, factor: int, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Area-downsample an RGB ``canvas`` by ``factor`` into ``out`` (H, W, C), as luma when C == 1.

    ``canvas`` is (H * factor, W * factor, 3) float64 in [0, 1]; each output pixel is the mean of its
    ``factor`` × ``factor`` block, summed in a fixed order.
    """
    height, width, channels = out.shape
    inv = 1.0 / (factor * factor)
    for y in range(height):
        for x in range(width):
            r = 0.0
            g = 0.0
            b = 0.0
            for dy in range(factor):
                row = y * factor + dy
                for dx in range(factor):
                    col = x * factor + dx
                    r += canvas[row, col, 0]
                    g += canvas[row, col, 1]
                    b += canvas[row, col, 2]
            r *= inv
            g *= inv
            b *= inv
            if channels == 1:
                out[y, x, 0] = to_u8(luma(r, g, b))
            else:
                out[y, x, 0] = to_u8(r)
                out[y, x, 1] = to_u8(g)
                out[y, x, 2] = to_u8(b)


@numba.njit(cache=True, nogil=True)
def mean_std(values: np.ndarray) -> tuple[float, float]:  # pragma: no cover - compiled
    """Mean and standard deviation of a flat float64 array, summed sequentially (a fixed order)."""
    n = values.size
    total = 0.0
    for k in range(n):
        total += values[k]
    mean = total / n
    acc = 0.0
    for k in range(n):
        d = values[k] - mean
        acc += d * d
    return mean, math.sqrt(acc / n)
