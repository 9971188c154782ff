"""Backbone checkpoints: safetensors files with metadata and a verified content hash; shipped backbones.

Importing this module costs no torch (the model code loads inside the functions that build one), so
:func:`verify_backbone` checks a pinned backbone in a party that never runs it.

A checkpoint stores the trunk's state (weights and BatchNorm buffers; the fixed scattering filters are
rebuilt from the configuration) and string metadata: format, architecture, input shape, feature size,
configuration, pretraining recipe and the SHA-256 content hash. Loading recomputes the hash and refuses a file
whose content does not match it, or whose hash differs from the one a federation pinned.

Shipped backbones live in ``capc_common/models/weights/NAME.safetensors`` (package data). Training-free
scattering backbones ``scatter-HxWxC`` need no file and are built for any supported shape; a shipped file of
that name (with running statistics calibrated on synthetic data) takes precedence.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from capc_common.errors import InputError
from capc_common.models.files import (
    backbone_file,
    check_pinned,
    list_backbones,
    parse_shape,
    read_checkpoint,
    shipped_files,
)

if TYPE_CHECKING:
    from capc_common.models.backbone import Backbone

__all__ = [
    "backbone_sha256",
    "default_backbone",
    "list_backbones",
    "load_backbone",
    "save_backbone",
    "verify_backbone",
]

# Preference order of the default for an input shape: a learned hybrid when shipped, else scattering.
_DEFAULT_ORDER = ("hybrid", "scatter")


def default_backbone(height: int, width: int, channels: int) -> str:
    """Name of the shipped default backbone for ``(height, width, channels)`` images.

    The learned hybrid for that shape when one is shipped, otherwise the training-free scattering backbone.

    Raises:
        InputError: no backbone can take that shape (scattering needs sides that are multiples of 4, > 4).
    """
    shape = f"{int(height)}x{int(width)}x{int(channels)}"
    shipped = shipped_files()
    for family in _DEFAULT_ORDER:
        if f"{family}-{shape}" in shipped:
            return f"{family}-{shape}"
    from capc_common.models.backbone import build_backbone  # torch: only when no file is shipped

    name = f"scatter-{shape}"
    build_backbone("scatter", input_shape=shape)  # raises InputError for an unsupported shape
    return name


def save_backbone(backbone: Backbone, path: str | Path) -> str:
    """Write ``backbone`` to a safetensors file atomically; return its SHA-256 content hash.

    The file appears complete or not at all (written to a temporary file in the same directory, then
    renamed), so a crash never leaves a half-written checkpoint behind.
    """
    from safetensors.torch import save_file

    from capc_common.models.backbone import content_hash

    path = Path(path)
    if path.suffix != ".safetensors":
        raise InputError(f"backbone checkpoints are .safetensors files, got {path}")
    state = {k: v.detach().to("cpu").contiguous() for k, v in backbone.state_dict().items()}
    header = backbone.header()
    digest = content_hash(state, header)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(state, tmp, metadata={**header, "sha256": digest})
        os.chmod(tmp, 0o644)  # weights are public; mkstemp gives 0600, unreadable as shipped package data
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest


def _load_file(path: Path) -> tuple[Backbone, str]:
    """The backbone of a checkpoint file and its content hash, verified on the bytes its tensors load from
    and equal to the loaded model's (hashed once here: a party's start-up pays it)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    from capc_common.models.backbone import build_backbone

    checkpoint = read_checkpoint(path)
    meta = checkpoint.metadata
    try:
        state = load(checkpoint.data)
        config, recipe = json.loads(meta["config"]), json.loads(meta["recipe"])
        backbone = build_backbone(
            meta["arch"], input_shape=parse_shape(meta["input_shape"]), config=config, recipe=recipe
        )
        backbone.load_state_dict(state, strict=True)
    except (SafetensorError, KeyError, json.JSONDecodeError, RuntimeError) as exc:
        raise InputError(f"backbone {path}: metadata and tensors do not fit together ({exc})") from exc
    loaded = backbone.sha256
    if loaded != checkpoint.sha256:
        # e.g. tensors of another dtype (load_state_dict converts them) or metadata save_backbone does not
        # write: the file's hash (what provisioning pins, what the guardian checks) must be the model's
        raise InputError(
            f"backbone {path}: the model it loads to has SHA-256 {loaded}, not the file's "
            f"{checkpoint.sha256}; write it with save_backbone (`capc pretrain` does)"
        )
    return backbone, loaded


def load_backbone(name_or_path: str | Path, *, sha256: str | None = None) -> Backbone:
    """Load a shipped backbone by name (see :func:`list_backbones`) or a ``.safetensors`` checkpoint.

    Args:
        name_or_path: ``scatter-28x28x1``, ``hybrid-28x28x1``, ... or a file path.
        sha256: expected content hash (e.g. pinned in ``federation.yaml``); checked when given.

    Returns:
        The backbone in ``eval()`` mode, on the CPU.

    Raises:
        InputError: unknown name, missing or unreadable file.
        IntegrityError: the file does not match its own hash, or not the expected one.
    """
    from capc_common.models.backbone import build_backbone

    path = backbone_file(name_or_path)
    if path is None:  # training-free scattering: built from its configuration
        shape = parse_shape(str(name_or_path).removeprefix("scatter-"))
        backbone = build_backbone("scatter", input_shape=shape, recipe={"kind": "training-free"})
        digest = backbone.sha256
    else:
        backbone, digest = _load_file(path)
    check_pinned(name_or_path, actual=digest, expected=sha256)
    return backbone.eval()


def backbone_sha256(name_or_path: str | Path) -> str:
    """A backbone's content hash (what ``federation.yaml`` pins), verified against its file: from the file
    alone where it has one (no torch, no model built: provisioning a federation needs only this); a
    scattering backbone without a file is built to hash it.

    Raises:
        InputError: unknown name, missing or unreadable file.
        IntegrityError: the file does not match its own hash.
    """
    path = backbone_file(name_or_path)
    if path is None:
        return load_backbone(name_or_path).sha256
    return read_checkpoint(path).sha256


def verify_backbone(name_or_path: str | Path, *, sha256: str | None) -> tuple[tuple[int, int, int], int]:
    """Check a backbone against its pinned hash without building it; returns the ``(H, W, C)`` it takes and
    its feature dimension.

    From its file alone where it has one (no torch); a scattering backbone without a file is built to hash
    it (it has no weights: a few filters).

    Raises:
        InputError: unknown name, missing or unreadable file.
        IntegrityError: the file does not match its own hash, or not the pinned one.
    """
    path = backbone_file(name_or_path)
    if path is None:
        backbone = load_backbone(name_or_path, sha256=sha256)
        return backbone.input_shape, backbone.feature_dim
    checkpoint = read_checkpoint(path)
    check_pinned(name_or_path, actual=checkpoint.sha256, expected=sha256)
    return checkpoint.input_shape, checkpoint.feature_dim
