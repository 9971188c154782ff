"""Checkpoints: safetensors round trip, content hash, tamper detection, shipped names, determinism."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from capc_common.errors import InputError, IntegrityError
from capc_common.models import (
    backbone_sha256,
    build_backbone,
    default_backbone,
    extract_features,
    list_backbones,
    load_backbone,
    save_backbone,
    verify_backbone,
)


def test_round_trip_preserves_everything(tmp_path):
    original = build_backbone(
        "scatter_cnn", input_shape="28x28x1", seed=5, config={"cnn_width": 16}, recipe={"steps": 3}
    )
    path = tmp_path / "b.safetensors"
    digest = save_backbone(original, path)
    assert digest == original.sha256 and len(digest) == 64
    loaded = load_backbone(path, sha256=digest)
    assert loaded.metadata == original.metadata
    assert loaded.metadata["recipe"] == {"steps": 3} and loaded.input_shape == (28, 28, 1)
    images = np.random.default_rng(0).integers(0, 256, (8, 28, 28, 1), dtype=np.uint8)
    np.testing.assert_array_equal(
        extract_features(original.eval(), images, bn_batch=8), extract_features(loaded, images, bn_batch=8)
    )


def test_tampered_file_is_refused(tmp_path):
    path = tmp_path / "b.safetensors"
    save_backbone(build_backbone("cnn", input_shape="28x28x1", config={"width": 8}), path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # flip one bit of the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its recorded SHA-256"):
        load_backbone(path)


def test_pinned_hash_mismatch(tmp_path):
    path = tmp_path / "b.safetensors"
    save_backbone(build_backbone("cnn", input_shape="28x28x1", config={"width": 8}), path)
    with pytest.raises(IntegrityError, match="was expected"):
        load_backbone(path, sha256="0" * 64)


def test_verify_backbone_checks_the_file_as_loading_does_without_building_it(tmp_path):
    path = tmp_path / "b.safetensors"
    digest = save_backbone(build_backbone("cnn", input_shape="32x32x3", config={"width": 8}), path)
    shape, dim = verify_backbone(path, sha256=digest)
    assert shape == (32, 32, 3) and dim == load_backbone(path).feature_dim
    for name in list_backbones():  # the file's hash is the hash of the loaded model, its shapes the model's
        loaded = load_backbone(name)
        assert verify_backbone(name, sha256=loaded.sha256) == (loaded.input_shape, loaded.feature_dim)
    scatter = verify_backbone("scatter-16x16x1", sha256=None)  # no file: built to hash it
    assert scatter == ((16, 16, 1), load_backbone("scatter-16x16x1").feature_dim)
    with pytest.raises(IntegrityError, match="was expected"):
        verify_backbone(path, sha256="0" * 64)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its recorded SHA-256"):
        verify_backbone(path, sha256=digest)


def test_backbone_sha256_is_the_loaded_models_hash_and_checks_the_file(tmp_path):
    path = tmp_path / "b.safetensors"
    digest = save_backbone(build_backbone("cnn", input_shape="32x32x3", config={"width": 8}), path)
    assert backbone_sha256(path) == digest
    for name in [*list_backbones(), "scatter-16x16x1"]:  # shipped files, and a scattering built to hash it
        assert backbone_sha256(name) == load_backbone(name).sha256
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its recorded SHA-256"):
        backbone_sha256(path)


def test_a_file_whose_hash_is_not_its_models_is_refused(tmp_path):
    """A hand-made file may hash correctly as a file and still load to another model (float64 tensors that
    ``load_state_dict`` converts): the file's hash, which provisioning pins, must be the loaded model's."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from capc_common.models.files import _header, _tensor, tensor_digest

    path, wide = tmp_path / "b.safetensors", tmp_path / "wide.safetensors"
    save_backbone(build_backbone("cnn", input_shape="28x28x1", config={"width": 8}), path)
    with safe_open(str(path), "pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if k != "sha256"}
        state = {k: handle.get_tensor(k).double() for k in handle.keys()}  # noqa: SIM118 (safe_open is not a dict)
    save_file(state, str(wide), metadata=metadata)  # then its own hash, as read_checkpoint computes it
    data = wide.read_bytes()
    header, entries, start = _header(wide, data)
    digest = tensor_digest(header, [_tensor(data, start, name, entry) for name, entry in entries.items()])
    save_file(state, str(wide), metadata={**metadata, "sha256": digest})
    assert backbone_sha256(wide) == digest  # a sound file
    with pytest.raises(InputError, match="the model it loads to has SHA-256"):
        load_backbone(wide)


def test_provisioning_a_federation_pins_the_backbone_without_torch(tmp_path):
    # `capc local up` and the demo provision a federation before any party starts: importing torch there
    # held every hospital's training back by its import. torch is made unimportable in the probe.
    code = (
        "import sys\n"
        "class Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch imported while provisioning')\n"
        "sys.meta_path.insert(0, Blocker())\n"
        "from capc_services.local.provision import provision\n"
        "from capc_services.local.demo import QUICK_OPTIONS\n"
        f"layout, config, _ = provision({str(tmp_path / 'fed')!r}, QUICK_OPTIONS)\n"
        "print(config.backbone.name, config.backbone.sha256)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    name, pinned = done.stdout.split()
    assert load_backbone(name).sha256 == pinned  # what the parties will load


def test_bad_names_and_files(tmp_path):
    with pytest.raises(InputError, match="not a shipped name"):
        load_backbone("resnet-9000")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(InputError, match="not a readable safetensors"):
        load_backbone(junk)
    with pytest.raises(InputError, match=r"\.safetensors"):
        save_backbone(build_backbone("cnn", input_shape="8x8x1"), tmp_path / "b.pt")


def test_shipped_names_load():
    names = list_backbones()
    assert {"scatter-28x28x1", "scatter-32x32x3"} <= set(names)
    for h, w, c in ((28, 28, 1), (32, 32, 3)):
        name = default_backbone(h, w, c)
        assert name in names
        backbone = load_backbone(name)
        assert backbone.input_shape == (h, w, c) and not backbone.training
    assert load_backbone("scatter-28x28x1").feature_dim == 81 * 7 * 7
    assert default_backbone(8, 8, 1) == "scatter-8x8x1"
    with pytest.raises(InputError, match="multiples of 4"):
        default_backbone(30, 30, 1)


def test_init_is_seeded_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a = build_backbone("resnet10", input_shape="32x32x3", seed=1)
    assert torch.equal(state, torch.random.get_rng_state())
    assert a.sha256 == build_backbone("resnet10", input_shape="32x32x3", seed=1).sha256
    assert a.sha256 != build_backbone("resnet10", input_shape="32x32x3", seed=2).sha256


def test_bad_architecture_and_config():
    with pytest.raises(InputError, match="unknown architecture"):
        build_backbone("vit", input_shape="28x28x1")
    with pytest.raises(InputError, match="bad configuration"):
        build_backbone("cnn", input_shape="28x28x1", config={"depth": 3})
    with pytest.raises(InputError, match="bad image shape"):
        build_backbone("cnn", input_shape="28x28")
