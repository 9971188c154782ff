"""Synthetic image generators: the public, privacy-free data DIET-CaPC pretrains on and queries teachers with.

Front door::

    from capc_common.synth import generate, GENERATOR_NAMES, SyntheticSpec
    images = generate("dead_leaves", seed=0, start=0, count=64, height=28, width=28, channels=1)
    spec = SyntheticSpec("shaders", seed=0, first_index=0, count=64, height=32, width=32, channels=3,
                         bn_batch=64)
    assert images_digest(spec.images()) == spec.digest()

Every image is a pure function of (generator, seed, index, height, width, channels), byte-identical in
every process and on every machine; see docs/synth.md.
"""

from capc_common.synth.core import (
    DEFAULT_GENERATOR,
    GENERATOR_DESCRIPTIONS,
    GENERATOR_NAMES,
    MAX_SIDE,
    generate,
    image_shape_for,
    images_digest,
)
from capc_common.synth.grid import image_grid, write_png
from capc_common.synth.spec import MIN_BN_BATCH, SyntheticSpec

__all__ = [
    "DEFAULT_GENERATOR",
    "GENERATOR_DESCRIPTIONS",
    "GENERATOR_NAMES",
    "MAX_SIDE",
    "MIN_BN_BATCH",
    "SyntheticSpec",
    "generate",
    "image_grid",
    "image_shape_for",
    "images_digest",
    "write_png",
]
