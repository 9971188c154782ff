"""``capc synth``: list the synthetic image generators, preview them as a grid, write batches to .npz."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, format_option, progress

_CHUNK = 4096  # images generated per step of ``generate`` (one progress tick)


def _parse_size(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, int, int]:
    """Parse ``HxWxC`` (e.g. 28x28x1) into three ints; shape limits are checked by the library."""
    parts = value.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise click.BadParameter(f"expected HxWxC such as 28x28x1 or 32x32x3, got {value!r}", ctx, param)
    height, width, channels = (int(p) for p in parts)
    return height, width, channels


def _size_text(size: tuple[int, int, int]) -> str:
    return "x".join(str(d) for d in size)


_seed_option = click.option(
    "--seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True, help="Stream seed."
)
_start_option = click.option(
    "--start", type=click.IntRange(min=0), default=0, show_default=True, help="Index of the first image."
)
_size_option = click.option(
    "--size",
    default="32x32x3",
    show_default=True,
    callback=_parse_size,
    help="HxWxC: height, width and channels (1 or 3).",
)


@click.group(name="synth")
def command() -> None:
    """Synthetic image generators: the public data for pretraining and teacher queries."""


@command.command(name="list")
@format_option
def list_generators(fmt: str) -> None:
    """List the generators with a one-line description each."""
    from capc_common.synth import DEFAULT_GENERATOR, GENERATOR_DESCRIPTIONS

    emit({"default": DEFAULT_GENERATOR, "generators": dict(GENERATOR_DESCRIPTIONS)}, fmt, _list_text)


def _list_text(result: dict[str, Any]) -> str:
    width = max(len(n) for n in result["generators"])
    lines = [f"{n:<{width}}  {d}" for n, d in result["generators"].items()]
    return "\n".join([*lines, f"(default: {result['default']})"])


@command.command(name="preview")
@click.argument("name")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="PNG to write.")
@_seed_option
@_start_option
@click.option("--count", type=click.IntRange(1, 1024), default=64, show_default=True, help="Images shown.")
@_size_option
@click.option(
    "--columns", type=click.IntRange(min=1), default=None, help="Images per row [default: ⌈√count⌉]."
)
@click.option(
    "--scale",
    type=click.IntRange(1, 16),
    default=None,
    help="Pixel magnification [default: tiles of about 64 pixels].",
)
@format_option
def preview(
    name: str,
    out: Path,
    seed: int,
    start: int,
    count: int,
    size: tuple[int, int, int],
    columns: int | None,
    scale: int | None,
    fmt: str,
) -> None:
    """Write a grid of COUNT images of generator NAME to --out (a PNG)."""
    from capc_common.errors import InputError
    from capc_common.synth import generate, image_grid, images_digest, write_png

    if not out.parent.is_dir():
        raise InputError(f"cannot write {out}: directory {out.parent} does not exist")
    height, width, channels = size
    t0 = time.perf_counter()
    images = generate(
        name, seed=seed, start=start, count=count, height=height, width=width, channels=channels
    )
    seconds = time.perf_counter() - t0
    magnification = scale if scale is not None else max(1, math.ceil(64 / max(height, width)))
    write_png(out, image_grid(images, columns=columns, scale=magnification))
    result = {
        "generator": name,
        "out": str(out),
        "seed": seed,
        "start": start,
        "count": count,
        "size": _size_text(size),
        "digest": images_digest(images),
        "seconds": round(seconds, 4),
    }
    emit(result, fmt)


@command.command(name="generate")
@click.argument("name")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help=".npz to write.")
@_seed_option
@_start_option
@click.option("--count", type=click.IntRange(min=1), required=True, help="Number of images.")
@_size_option
@format_option
def generate_npz(
    name: str, out: Path, seed: int, start: int, count: int, size: tuple[int, int, int], fmt: str
) -> None:
    """Write COUNT images of generator NAME to --out (.npz: ``images`` uint8 (N, H, W, C) and the spec)."""
    import hashlib

    import numpy as np

    from capc_common.errors import InputError
    from capc_common.synth import generate
    from capc_common.synth.core import MAX_BATCH_BYTES

    if out.suffix != ".npz":
        raise InputError(f"--out must name a .npz file, got {out}")
    if not out.parent.is_dir():
        raise InputError(f"cannot write {out}: directory {out.parent} does not exist")
    height, width, channels = size
    # validate everything (name, indices, shape) before allocating or touching the disk
    generate(name, seed=seed, start=start, count=0, height=height, width=width, channels=channels)
    if start + count > 2**64:
        raise InputError(f"image indices [{start}, {start + count}) must lie in [0, 2^64)")
    if count * height * width * channels > MAX_BATCH_BYTES:
        raise InputError(
            f"{count} images of {height}x{width}x{channels} take {count * height * width * channels} bytes, "
            f"over the {MAX_BATCH_BYTES} one file may hold; split the range over several --start values"
        )
    images = np.empty((count, height, width, channels), dtype=np.uint8)
    digest = hashlib.sha256()
    t0 = time.perf_counter()
    chunks = range(0, count, _CHUNK)
    for first in progress(chunks, total=len(chunks), desc=f"synth {name}", unit="chunk"):
        n = min(_CHUNK, count - first)
        images[first : first + n] = generate(
            name, seed=seed, start=start + first, count=n, height=height, width=width, channels=channels
        )
        digest.update(images[first : first + n].tobytes())
    seconds = time.perf_counter() - t0
    partial = out.with_name(f".{out.name}.partial.npz")
    try:
        np.savez(
            partial,
            images=images,
            generator=np.array(name),
            seed=np.array(seed, dtype=np.uint64),
            start=np.array(start, dtype=np.uint64),
        )
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    result = {
        "generator": name,
        "out": str(out),
        "seed": seed,
        "start": start,
        "count": count,
        "size": _size_text(size),
        "digest": digest.hexdigest(),
        "seconds": round(seconds, 4),
        "images_per_s": round(count / seconds, 1) if seconds > 0 else None,
    }
    emit(result, fmt)
