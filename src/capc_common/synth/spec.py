"""``SyntheticSpec``: the description of a batch of synthetic queries that travels instead of its pixels.

The student names a batch by (generator, seed, first index, count, shape, BatchNorm batch); every party
regenerates the same images from it, so teachers only ever see public, synthetic inputs and the wire
carries a few integers instead of megabytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from capc_common.errors import InputError
from capc_common.synth.core import MAX_INDEX, as_int, check_generator, check_shape, generate, images_digest

__all__ = ["MIN_BN_BATCH", "SyntheticSpec"]

MIN_BN_BATCH: Final = 16
"""Smallest BatchNorm batch: current statistics of fewer than 16 queries are too noisy (DIET-PATE §5)."""


@dataclass(frozen=True)
class SyntheticSpec:
    """A batch of synthetic query images, as every party regenerates it.

    Attributes:
        generator: one of ``GENERATOR_NAMES``.
        seed: stream seed in [0, 2^64).
        first_index: index of the batch's first image in the stream.
        count: number of images, a positive multiple of ``bn_batch``.
        height: image height in pixels.
        width: image width in pixels.
        channels: 1 or 3.
        bn_batch: queries per current-statistics BatchNorm chunk, at least 16.

    Raises:
        InputError: on construction, if any field is out of range (the message names the field, its value
            and the fix).
    """

    generator: str
    seed: int
    first_index: int
    count: int
    height: int
    width: int
    channels: int
    bn_batch: int

    def __post_init__(self) -> None:
        check_generator(self.generator)
        for field in dataclasses.fields(self):
            if field.name != "generator":
                object.__setattr__(self, field.name, as_int(getattr(self, field.name), field.name))
        check_shape(self.height, self.width, self.channels)
        if not 0 <= self.seed < MAX_INDEX:
            raise InputError(f"seed must be in [0, 2^64), got {self.seed}")
        if self.bn_batch < MIN_BN_BATCH:
            raise InputError(
                f"bn_batch must be at least {MIN_BN_BATCH} (current BatchNorm statistics of smaller batches "
                f"are too noisy), got {self.bn_batch}"
            )
        if self.count < 1 or self.count % self.bn_batch:
            raise InputError(
                f"count must be a positive multiple of bn_batch {self.bn_batch}, got {self.count}; "
                f"e.g. {max(1, round(self.count / self.bn_batch)) * self.bn_batch}"
            )
        if self.first_index < 0 or self.first_index + self.count > MAX_INDEX:
            raise InputError(
                f"image indices [{self.first_index}, {self.first_index + self.count}) must lie in [0, 2^64)"
            )

    def images(self) -> np.ndarray:
        """The batch's images, uint8 (count, height, width, channels)."""
        return generate(
            self.generator,
            seed=self.seed,
            start=self.first_index,
            count=self.count,
            height=self.height,
            width=self.width,
            channels=self.channels,
        )

    def digest(self) -> str:
        """SHA-256 (hex) of the batch's image bytes, for parties to cross-check what they regenerated."""
        return images_digest(self.images())

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able dict with one key per field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SyntheticSpec:
        """Rebuild a spec from :meth:`to_dict`'s output, validating it.

        Raises:
            InputError: ``data`` is not a mapping, lacks a field, has an unknown key, or a value is invalid.
        """
        if not isinstance(data, Mapping):
            raise InputError(f"a synthetic spec must be a mapping, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        unknown = sorted(str(k) for k in data if k not in names)
        if missing or unknown:
            raise InputError(
                f"synthetic spec has missing fields {missing} and unknown fields {unknown}; "
                f"expected exactly {names}"
            )
        return cls(**{n: data[n] for n in names})
