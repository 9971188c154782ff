"""Prompted teachers (Prom-PATE): one example moves one teacher (bit for bit); the prompt acts and learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capc_common.data import load_dataset
from capc_common.errors import InputError
from capc_common.learn.heads import fixed_votes
from capc_common.learn.prompts import PromptedTeachers, PromptRecipe, prompted, train_prompted_teachers
from capc_common.models import default_backbone, load_backbone, to_tensor

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RECIPE = PromptRecipe(width=1, map_steps=20, steps=3, prompt_lr=0.05)
BN = 32


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    data = load_dataset("digits", split="train")
    return data.images, data.labels.astype(np.int64)


@pytest.fixture(scope="module")
def backbone():
    """The training-free scattering backbone for 8×8 images (digits are the fast proxy)."""
    return load_backbone(default_backbone(8, 8, 1))


def _train(backbone, images, labels, shards) -> PromptedTeachers:
    return train_prompted_teachers(backbone, images, labels, shards, classes=10, bn_batch=BN, recipe=RECIPE)


def _changed(a: PromptedTeachers, b: PromptedTeachers) -> list[int]:
    """Teachers whose prompt or label map differs in any bit."""
    return [
        t
        for t in range(a.teachers)
        if not (
            torch.equal(a.prompts[t], b.prompts[t])
            and torch.equal(a.weights[t], b.weights[t])
            and torch.equal(a.biases[t], b.biases[t])
        )
    ]


def test_editing_one_shard_leaves_every_other_teacher_bit_identical(digits, backbone):
    """Replace or remove one example of one shard: only that shard's teacher changes (docs/privacy.md §2)."""
    images, labels = digits
    # Unequal shards, one not a multiple of the chunk (its last chunk overlaps the previous one).
    shards = [np.arange(0, 64), np.arange(64, 144), np.arange(144, 208)]
    base = _train(backbone, images, labels, shards)

    replaced = images.copy()
    replaced[70] = images[500]
    assert _changed(base, _train(backbone, replaced, labels, shards)) == [1]

    removed = [shards[0], np.delete(shards[1], 5), shards[2]]
    assert _changed(base, _train(backbone, images, labels, removed)) == [1]


def test_the_prompt_changes_the_input_and_training_lowers_the_loss(digits, backbone):
    images, labels = digits
    sha = backbone.sha256
    teachers = _train(backbone, images, labels, [np.arange(0, 96), np.arange(96, 192)])
    assert backbone.sha256 == sha, "the backbone must stay frozen"
    assert all(p.requires_grad for p in backbone.parameters()) or not any(
        p.requires_grad for p in backbone.parameters()
    )
    # Every teacher's loss fell over its fixed steps, and its prompt moved off zero — on the border only.
    assert np.all(teachers.losses[:, -1] < teachers.losses[:, 0])
    mask = RECIPE.mask((8, 8, 1))
    for t in range(teachers.teachers):
        assert torch.all(teachers.prompts[t][mask > 0] != 0)
        assert torch.all(teachers.prompts[t][mask == 0] == 0)
    x = to_tensor(images[:BN])
    shown = prompted(x, teachers.prompts[0], mask=mask, kind="pad")
    assert torch.equal(shown[:, :, 1:7, 1:7], x[:, :, 1:7, 1:7])
    assert not torch.equal(shown, x * (1 - mask))
    # The prompt matters to the votes: the same maps without their prompts vote otherwise on some images.
    blank = PromptedTeachers(
        backbone,
        torch.zeros_like(teachers.prompts),
        teachers.weights,
        teachers.biases,
        RECIPE,
        BN,
        teachers.losses,
    )
    queries = images[1000:1256]
    assert np.any(teachers.predict(queries) != blank.predict(queries))
    hist = teachers.histograms(queries, batch=2 * BN)
    assert hist.shape == (256, 10) and np.all(hist.sum(axis=1) == teachers.teachers)


def test_a_short_shard_abstains_with_the_fixed_vote(digits, backbone, tmp_path):
    """Issue 25.2: a shard of bn_batch − 1 abstains rather than refusing; one more example trains it, and
    only its teacher changes."""
    images, labels = digits
    short = _train(backbone, images, labels, [np.arange(0, BN - 1), np.arange(100, 100 + BN)])
    assert short.abstaining == (0,)
    np.testing.assert_array_equal(short.predict(images[300:364])[0], fixed_votes(0, 64, classes=10))
    short.save(tmp_path / "p.safetensors")
    assert PromptedTeachers.load(tmp_path / "p.safetensors", backbone=backbone, recipe=RECIPE).abstaining == (
        0,
    )
    full = _train(backbone, images, labels, [np.arange(0, BN), np.arange(100, 100 + BN)])
    assert full.abstaining == () and _changed(short, full) == [0]


def test_bad_inputs_are_refused_before_training(digits, backbone):
    with pytest.raises(InputError, match="covers the whole"):
        PromptRecipe(width=4).mask((8, 8, 1))
    with pytest.raises(InputError, match="prompt kind"):
        PromptRecipe(kind="frame")  # type: ignore[arg-type]


def test_saved_teachers_load_bit_identical_and_vote_the_same(digits, backbone, tmp_path):
    """A party saves its prompted teachers after training and its voter loads them: nothing may change."""
    images, labels = digits
    teachers = _train(backbone, images, labels, [np.arange(0, 64), np.arange(64, 128)])
    path = tmp_path / "teachers.safetensors"
    teachers.save(path)
    loaded = PromptedTeachers.load(path, backbone=backbone, recipe=RECIPE)
    assert _changed(teachers, loaded) == [] and loaded.teachers == 2 and loaded.bn_batch == BN
    np.testing.assert_array_equal(loaded.losses, teachers.losses)
    queries = images[300:364]
    np.testing.assert_array_equal(
        loaded.histograms(queries, batch=64), teachers.histograms(queries, batch=64)
    )
    assert not list(tmp_path.glob("*.partial"))  # written atomically


def test_teachers_of_another_recipe_or_backbone_are_refused(digits, backbone, tmp_path):
    """Prompts learned under another recipe or on another backbone would vote as teachers nobody trained."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    images, labels = digits
    path = tmp_path / "teachers.safetensors"
    _train(backbone, images, labels, [np.arange(0, 64)]).save(path)
    with pytest.raises(
        InputError, match=r"prompt recipe .*'steps': 3.*federation's is .*'steps': 4.*retrain"
    ):
        PromptedTeachers.load(path, backbone=backbone, recipe=PromptRecipe(width=1, map_steps=20, steps=4))
    with safe_open(str(path), framework="pt") as handle:
        meta = {**(handle.metadata() or {}), "backbone_sha256": "0" * 64}
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    save_file(tensors, str(tmp_path / "other.safetensors"), metadata=meta)
    with pytest.raises(
        InputError,
        match=f"backbone with SHA-256 0{{64}}, but this party's backbone is {backbone.sha256}: retrain",
    ):
        PromptedTeachers.load(tmp_path / "other.safetensors", backbone=backbone, recipe=RECIPE)
    with pytest.raises(InputError, match="does not exist; train the teachers first"):
        PromptedTeachers.load(tmp_path / "missing.safetensors", backbone=backbone, recipe=RECIPE)
