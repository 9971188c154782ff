"""Backbone checkpoint files without torch: where a name's file is, its metadata, its content hash.

A checkpoint is a safetensors file: 8 bytes giving the header's length, a JSON header (string metadata under
``__metadata__``, and each tensor's dtype, shape and byte range), then the tensors' bytes. That is enough to
verify the content hash and read the input shape, so a party that runs no model (the guardian; the student
until it trains) checks the backbone federation.yaml pins without importing torch or building the network.
The hash is the one :class:`~capc_common.models.Backbone` computes from its tensors (see
:func:`tensor_digest`); :func:`~capc_common.models.load_backbone` verifies every file through here.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from capc_common.errors import InputError, IntegrityError

__all__ = [
    "FORMAT",
    "CheckpointFile",
    "backbone_file",
    "check_pinned",
    "format_shape",
    "parse_shape",
    "read_checkpoint",
    "shipped_files",
    "sources_digest",
    "tensor_digest",
]

FORMAT = "capc-backbone-v1"
_SCATTER_PREFIX = "scatter-"
_BUILT_IN_SCATTER = ("scatter-28x28x1", "scatter-32x32x3")
_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)$")
_WEIGHTS = "weights"
# safetensors dtype codes → the name torch gives the dtype, which the content hash includes.
_TORCH_DTYPES = {
    "F64": "torch.float64",
    "F32": "torch.float32",
    "F16": "torch.float16",
    "BF16": "torch.bfloat16",
    "I64": "torch.int64",
    "I32": "torch.int32",
    "I16": "torch.int16",
    "I8": "torch.int8",
    "U8": "torch.uint8",
    "BOOL": "torch.bool",
}


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"28x28x1"`` → ``(28, 28, 1)`` (height, width, channels).

    Raises:
        InputError: not of the form ``HxWxC`` with positive integers.
    """
    match = _SHAPE.match(text.strip())
    if not match or min(int(g) for g in match.groups()) < 1:
        raise InputError(f"bad image shape {text!r}; expected HEIGHTxWIDTHxCHANNELS, e.g. 28x28x1 or 32x32x3")
    h, w, c = (int(g) for g in match.groups())
    return h, w, c


def format_shape(shape: tuple[int, int, int]) -> str:
    """``(28, 28, 1)`` → ``"28x28x1"``."""
    return "x".join(str(int(v)) for v in shape)


def sources_digest(package: Path, *versions: str) -> str:
    """SHA-256 of a package directory's Python sources (by name and bytes) and the given version strings: what
    a cache key names as "the code" of values that code computes, so a value written by other code is never
    read as this code's."""
    digest = hashlib.sha256("\0".join(versions).encode())
    for path in sorted(package.glob("*.py")):
        digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def tensor_digest(
    metadata: Mapping[str, str], tensors: Iterable[tuple[str, str, tuple[int, ...], bytes]]
) -> str:
    """SHA-256 over canonical metadata and every tensor ``(name, torch dtype name, shape, bytes)`` in name
    order: the content hash of a backbone, so it names the model itself, not one file layout of it."""
    digest = hashlib.sha256()
    digest.update(json.dumps(dict(metadata), sort_keys=True, separators=(",", ":")).encode())
    for name, dtype, shape, data in sorted(tensors, key=lambda t: t[0]):
        digest.update(f"\0{name}\0{dtype}\0{tuple(shape)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def shipped_files() -> dict[str, Path]:
    """Shipped backbones by name: ``capc_common/models/weights/NAME.safetensors`` (package data)."""
    directory = Path(str(resources.files("capc_common.models").joinpath(_WEIGHTS)))
    if not directory.is_dir():
        return {}
    return {p.stem: p for p in sorted(directory.glob("*.safetensors"))}


def list_backbones() -> list[str]:
    """Names accepted by :func:`~capc_common.models.load_backbone` without a path: shipped files and
    built-in scattering."""
    return sorted(set(shipped_files()) | set(_BUILT_IN_SCATTER))


def backbone_file(name_or_path: str | Path) -> Path | None:
    """The checkpoint file a backbone name or path stands for; None for a training-free scattering backbone
    ``scatter-HxWxC`` that no file ships (it is built from its configuration).

    Raises:
        InputError: neither a shipped name, a scattering name, nor an existing file.
    """
    text = str(name_or_path)
    shipped = shipped_files()
    if text in shipped:
        return shipped[text]
    if text.startswith(_SCATTER_PREFIX) and not text.endswith(".safetensors"):
        return None
    path = Path(text)
    if not path.is_file():
        raise InputError(
            f"no backbone {text!r}: not a shipped name ({', '.join(list_backbones())}) nor an existing "
            ".safetensors file"
        )
    return path


def check_pinned(name_or_path: str | Path, *, actual: str, expected: str | None) -> None:
    """Refuse a backbone whose content hash is not the pinned one (when one is pinned).

    Raises:
        IntegrityError: the hashes differ.
    """
    if expected is not None and actual != expected.lower():
        raise IntegrityError(
            f"backbone {name_or_path} has SHA-256 {actual}, but {expected} was expected; every party must "
            "use the backbone the federation pinned"
        )


@dataclass(frozen=True)
class CheckpointFile:
    """A backbone checkpoint's bytes and string metadata, its content hash verified.

    Attributes:
        path: where it was read from.
        data: the whole file (load the tensors from these bytes, not from the path again).
        metadata: the hashed metadata (format, arch, input shape, feature size, config, recipe).
        sha256: its content hash.
    """

    path: Path
    data: bytes
    metadata: dict[str, str]
    sha256: str

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """The ``(H, W, C)`` images the backbone takes."""
        return parse_shape(self.metadata["input_shape"])

    @property
    def feature_dim(self) -> int:
        """The length of the features it computes per image."""
        return int(self.metadata["feature_dim"])


def _header(path: Path, data: bytes) -> tuple[dict[str, str], dict[str, Any], int]:
    """The metadata, the tensor entries and where the tensor bytes start, or an InputError."""
    try:
        (length,) = struct.unpack_from("<Q", data)
        header = json.loads(data[8 : 8 + length])
        metadata = dict(header.pop("__metadata__", None) or {})
        if not isinstance(header, dict) or not all(isinstance(v, dict) for v in header.values()):
            raise ValueError("the header is not an object of tensor entries")
    except (struct.error, ValueError, TypeError) as exc:
        raise InputError(f"backbone file {path} is not a readable safetensors file ({exc})") from None
    return metadata, header, 8 + length


def read_checkpoint(path: Path) -> CheckpointFile:
    """Read a backbone checkpoint and verify its content hash (no torch).

    Raises:
        InputError: unreadable, not a safetensors file, or not a capc backbone.
        IntegrityError: the content does not match the hash recorded in it.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"backbone file {path} is not readable ({exc})") from exc
    metadata, entries, start = _header(path, data)
    if metadata.get("format") != FORMAT:
        raise InputError(
            f"{path} is not a capc backbone (metadata format {metadata.get('format')!r}, want {FORMAT})"
        )
    stored = metadata.pop("sha256", None)
    try:
        tensors = [_tensor(data, start, name, entry) for name, entry in entries.items()]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"backbone file {path} is not a readable safetensors file (entry {exc})") from None
    if stored is None or tensor_digest(metadata, tensors) != stored:
        raise IntegrityError(
            f"backbone {path}: content does not match its recorded SHA-256 ({stored}); the file was altered "
            "or corrupted — restore it from the original"
        )
    return CheckpointFile(path=path, data=data, metadata=metadata, sha256=stored)


def _tensor(
    data: bytes, start: int, name: str, entry: dict[str, Any]
) -> tuple[str, str, tuple[int, ...], bytes]:
    """One tensor's ``(name, torch dtype name, shape, bytes)``; ``data_offsets`` count from the header."""
    begin, end = (int(v) for v in entry["data_offsets"])
    if not 0 <= begin <= end <= len(data) - start:
        raise ValueError(f"{name}: data_offsets {entry['data_offsets']} outside the file")
    shape = tuple(int(v) for v in entry["shape"])
    return name, _TORCH_DTYPES[str(entry["dtype"])], shape, data[start + begin : start + end]
