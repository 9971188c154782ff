"""Sample grids: tile a batch of images into one picture and write it as a PNG (for people, not models)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from capc_common.errors import InputError

__all__ = ["image_grid", "write_png"]


def image_grid(images: np.ndarray, *, columns: int | None = None, scale: int = 1, gap: int = 1) -> np.ndarray:
    """Tile uint8 images (N, H, W, C) into one (rows·(H·scale+gap)−gap, …, C) picture.

    Args:
        images: the batch; N ≥ 1.
        columns: images per row (default: the smallest square-ish layout, ⌈√N⌉).
        scale: nearest-neighbour magnification, so small images stay crisp in a viewer.
        gap: pixels of white between tiles.

    Raises:
        InputError: not a non-empty 4-D uint8 batch, or a non-positive columns/scale, or a negative gap.
    """
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[0] == 0:
        raise InputError(
            f"image_grid needs a non-empty uint8 batch (N, H, W, C), got {images.dtype} {images.shape}"
        )
    count = images.shape[0]
    columns = columns if columns is not None else math.ceil(math.sqrt(count))
    if columns < 1 or scale < 1 or gap < 0:
        raise InputError(f"need columns >= 1, scale >= 1 and gap >= 0; got {columns}, {scale}, {gap}")
    rows = math.ceil(count / columns)
    tiles = images.repeat(scale, axis=1).repeat(scale, axis=2)
    th, tw, channels = tiles.shape[1:]
    grid = np.full((rows * (th + gap) - gap, columns * (tw + gap) - gap, channels), 255, dtype=np.uint8)
    for k in range(count):
        r, c = divmod(k, columns)
        grid[r * (th + gap) : r * (th + gap) + th, c * (tw + gap) : c * (tw + gap) + tw] = tiles[k]
    return grid


def write_png(path: str | os.PathLike[str], picture: np.ndarray) -> Path:
    """Write a uint8 (H, W, 1 or 3) picture as a PNG atomically (a temporary file, then a rename).

    Raises:
        InputError: the parent directory does not exist, or the picture has the wrong shape.
    """
    from PIL import Image

    target = Path(path)
    if not target.parent.is_dir():
        raise InputError(f"cannot write {target}: directory {target.parent} does not exist")
    if picture.dtype != np.uint8 or picture.ndim != 3 or picture.shape[2] not in (1, 3):
        raise InputError(f"a PNG picture must be uint8 (H, W, 1 or 3), got {picture.dtype} {picture.shape}")
    image = Image.fromarray(picture[..., 0] if picture.shape[2] == 1 else picture)
    partial = target.with_name(f".{target.name}.partial")
    try:
        image.save(partial, format="PNG", optimize=True)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target
