"""``generate(name, seed=, start=, count=, height=, width=, channels=)``: the synthetic image streams.

A stream is named by its generator and seed; image k of it is a pure function of
``(name, seed, k, height, width, channels)``. Each image gets its own 64-bit key, the first 8 bytes of
SHA-256 over a domain tag, the name, the seed and k, and the generator draws everything from a counter-based
RNG keyed by it (see ``_jit``). So any index range can be produced without generating the images before it,
and a party that regenerates a batch from its ``SyntheticSpec`` gets the same bytes as everyone else.
"""

from __future__ import annotations

import hashlib
import importlib
import operator
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType, ModuleType
from typing import Final

import numpy as np

from capc_common.errors import InputError

__all__ = [
    "DEFAULT_GENERATOR",
    "GENERATOR_DESCRIPTIONS",
    "GENERATOR_NAMES",
    "MAX_BATCH_BYTES",
    "MAX_SIDE",
    "generate",
    "image_keys",
    "image_shape_for",
    "images_digest",
]

_Renderer = Callable[[np.ndarray, np.ndarray], None]
GENERATOR_NAMES: Final[tuple[str, ...]] = ("gaussian", "dead_leaves", "fractal", "stylegan", "shaders")
"""Every generator name, in the order the docs and benchmarks list them (each is the module
``capc_common.synth.<name>`` defining ``render`` and ``DESCRIPTION``)."""


def _generator(name: str) -> ModuleType:
    """The generator's module, imported on first use: its numba kernels load (or compile) only in a process
    that makes images, not in every one that merely names a query stream (the guardian, a CLI command)."""
    return importlib.import_module(f"capc_common.synth.{name}")


class _Descriptions(Mapping[str, str]):
    """One line per generator, read from its module when asked (``capc synth list``)."""

    def __getitem__(self, name: str) -> str:
        if name not in GENERATOR_NAMES:
            raise KeyError(name)
        description: str = _generator(name).DESCRIPTION
        return description

    def __iter__(self) -> Iterator[str]:
        return iter(GENERATOR_NAMES)

    def __len__(self) -> int:
        return len(GENERATOR_NAMES)


GENERATOR_DESCRIPTIONS: Final[Mapping[str, str]] = _Descriptions()
"""One line per generator for ``capc synth list``."""

DEFAULT_GENERATOR: Final = "stylegan"
"""The generator DIET-PATE pretrains on for MNIST-like data (StyleGAN-oriented)."""

MAX_SIDE: Final = 1024
"""Largest height or width accepted: enough for any model here, and a spec from a peer cannot ask a party
to allocate unbounded memory."""

MAX_BATCH_BYTES: Final = 1 << 32
"""Largest result of one ``generate`` call (4 GiB): longer streams are generated in chunks, and a peer's spec
cannot make a party allocate more."""

MAX_INDEX: Final = 2**64
"""Seeds and image indices are unsigned 64-bit on the wire."""

_DOMAIN: Final = b"capc-synth/v1\x00"

# Image shapes of the built-in datasets, so a federation's query shape can be chosen without loading them.
_DATASET_SHAPES: Final = MappingProxyType({"fashion-mnist": (28, 28, 1), "digits": (8, 8, 1)})


def as_int(value: object, what: str) -> int:
    """``value`` as a plain int, or an InputError naming ``what`` (booleans and floats are refused)."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be an integer, got the boolean {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InputError(f"{what} must be an integer, got {type(value).__name__} {value!r}") from None


def check_shape(height: object, width: object, channels: object) -> tuple[int, int, int]:
    """Validate an image shape and return it as plain ints.

    Raises:
        InputError: a side outside [1, MAX_SIDE] or channels other than 1 or 3.
    """
    h = as_int(height, "height")
    w = as_int(width, "width")
    c = as_int(channels, "channels")
    for what, side in (("height", h), ("width", w)):
        if not 1 <= side <= MAX_SIDE:
            raise InputError(f"{what} must be in [1, {MAX_SIDE}] pixels, got {side}")
    if c not in (1, 3):
        raise InputError(f"channels must be 1 (grayscale) or 3 (RGB), got {c}")
    return h, w, c


def check_generator(name: object) -> str:
    """Return ``name`` if it names a generator, else raise an InputError listing the names."""
    if not isinstance(name, str) or name not in GENERATOR_NAMES:
        raise InputError(f"unknown generator {name!r}; choose one of {', '.join(GENERATOR_NAMES)}")
    return name


def image_keys(name: str, *, seed: int, start: int, count: int) -> np.ndarray:
    """The 64-bit RNG keys of images ``start .. start + count - 1`` of stream ``(name, seed)``.

    Args:
        name: generator name (part of the key, so two generators never share randomness).
        seed: stream seed in [0, 2^64).
        start: first image index in [0, 2^64).
        count: number of keys.

    Returns:
        uint64 array of shape (count,).
    """
    tag = _DOMAIN + name.encode() + b"\x00" + seed.to_bytes(8, "little")
    keys = np.empty(count, dtype=np.uint64)
    for i in range(count):
        digest = hashlib.sha256(tag + (start + i).to_bytes(8, "little")).digest()
        keys[i] = int.from_bytes(digest[:8], "little")
    return keys


def generate(
    name: str, *, seed: int, start: int, count: int, height: int, width: int, channels: int
) -> np.ndarray:
    """Images ``start .. start + count - 1`` of the stream ``(name, seed)``.

    Image i of the result is image ``start + i`` of the stream whatever range it was requested in, and its
    bytes are the same in every process and on every machine (see docs/synth.md for the guarantee).

    Args:
        name: one of :data:`GENERATOR_NAMES`.
        seed: stream seed, an integer in [0, 2^64).
        start: index of the first image, in [0, 2^64).
        count: number of images (0 gives an empty array).
        height: image height in pixels, 1 to :data:`MAX_SIDE`.
        width: image width in pixels, 1 to :data:`MAX_SIDE`.
        channels: 1 (grayscale, BT.601 luma of the colour image) or 3 (RGB).

    Returns:
        uint8 array of shape (count, height, width, channels).

    Raises:
        InputError: an unknown name, a negative or too large seed/index, a bad shape, or a result over
            :data:`MAX_BATCH_BYTES`.
    """
    name = check_generator(name)
    seed = as_int(seed, "seed")
    start = as_int(start, "start")
    count = as_int(count, "count")
    if not 0 <= seed < MAX_INDEX:
        raise InputError(f"seed must be in [0, 2^64), got {seed}")
    if count < 0:
        raise InputError(f"count must be >= 0, got {count}")
    if start < 0 or start + count > MAX_INDEX:
        raise InputError(f"image indices [{start}, {start + count}) must lie in [0, 2^64)")
    h, w, c = check_shape(height, width, channels)
    if count * h * w * c > MAX_BATCH_BYTES:
        raise InputError(
            f"{count} images of {h}x{w}x{c} take {count * h * w * c} bytes, over the {MAX_BATCH_BYTES} bytes "
            "one call may return; generate the range in chunks"
        )
    out = np.empty((count, h, w, c), dtype=np.uint8)
    if count:
        render: _Renderer = _generator(name).render
        render(image_keys(name, seed=seed, start=start, count=count), out)
    return out


def images_digest(images: np.ndarray) -> str:
    """SHA-256 (hex) of a uint8 image batch's bytes in C order.

    Parties compare digests to check that they regenerated the same queries from a spec (whose shape
    they already agree on).

    Raises:
        InputError: ``images`` is not a 4-D uint8 array.
    """
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4:
        what = f"{images.dtype} {images.shape}" if isinstance(images, np.ndarray) else type(images).__name__
        raise InputError(f"images_digest needs a uint8 array (N, H, W, C), got {what}")
    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()


def image_shape_for(dataset: str) -> tuple[int, int, int]:
    """The (height, width, channels) of a dataset's images, i.e. the shape its queries must have.

    Built-in datasets are answered from a table; any other name (``idx:``, ``npz:``, ``folder:``) is
    loaded once with :func:`capc_common.data.load_dataset` to read its shape.

    Raises:
        InputError: the dataset cannot be loaded (its message names the path), or its channels are not 1 or 3.
    """
    if dataset in _DATASET_SHAPES:
        return _DATASET_SHAPES[dataset]
    from capc_common.data import load_dataset

    images = load_dataset(dataset, split="train").images
    return check_shape(*images.shape[1:])
