"""Helpers that write real IDX files, so loader errors are tested on actual bytes on disk."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest


def idx_bytes(array: np.ndarray) -> bytes:
    """Serialise a uint8 array in the IDX format (magic 0x0000 08 ndim, big-endian dims, payload)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> Path:
    data = idx_bytes(array)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_idx_dir(directory: Path, *, n_train: int = 30, n_test: int = 12, gz: bool = True) -> Path:
    """An MNIST-style directory with the four files of a tiny 10-class dataset."""
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(directory / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), gz=gz)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, gz=gz)
    return directory


class IdxTools:
    """The helpers above, handed to tests as a fixture (test directories are not packages)."""

    idx_bytes = staticmethod(idx_bytes)
    write_idx = staticmethod(write_idx)
    write_idx_dir = staticmethod(write_idx_dir)


@pytest.fixture
def idx() -> IdxTools:
    return IdxTools()
