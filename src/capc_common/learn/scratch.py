"""A small CNN trained from scratch on a party's own images: the strongest model alone that needs no backbone.

A hospital weighing the federation against training alone must compare against the best it can do alone,
not a straw man. On features of the shared backbone a linear head is usually that best; where the backbone
does not suit the images (another modality, another size) a small network trained end to end on the
party's own pixels can win, so the comparison includes one.

The recipe is fixed and small so that it runs at every site, on a CPU, in bounded time: two 3×3
convolutions (ReLU, BatchNorm, 2×2 max-pooling), one hidden layer, Adam (3e-3) with batches of 64 on one
thread, random shifts of up to two pixels as augmentation (no flips: a mirrored chest X-ray is not a chest
X-ray), and early stopping on an inner validation part of the training images (the epoch with the best inner
accuracy is kept). At most :attr:`CnnRecipe.max_steps` optimiser steps in all, so a party of 60,000 images
costs about as much as one of 4,000. Nothing here is private: the model never leaves its site.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = ["CnnRecipe", "ScratchCNN", "train_scratch_cnn"]


@dataclass(frozen=True)
class CnnRecipe:
    """How the from-scratch CNN is trained.

    Attributes:
        width: channels of the first convolution (the second has twice as many).
        hidden: units of the hidden layer.
        lr: Adam's learning rate.
        batch: images per step.
        max_epochs: epochs at most.
        max_steps: optimiser steps at most, over all epochs (bounds the cost for large parties).
        patience: epochs without a better inner-validation accuracy before stopping.
        shift: largest random translation in pixels (augmentation).
        validation: share of the training images held out for early stopping (at least one image).
    """

    width: int = 16
    hidden: int = 64
    lr: float = 3e-3
    batch: int = 64
    max_epochs: int = 30
    max_steps: int = 1000
    patience: int = 5
    shift: int = 2
    validation: float = 0.1

    def describe(self) -> dict[str, Any]:
        """The recipe as plain values (for model cards and reports)."""
        return asdict(self)


class ScratchCNN:
    """A trained from-scratch CNN and the pixel scaling it was trained with.

    Attributes:
        model: the torch module (evaluation mode).
        mean: mean pixel value of the training images (0..255 scale).
        std: their standard deviation.
        classes: number of classes.
        epochs: epochs trained; ``best_epoch``: the epoch kept (early stopping).
    """

    def __init__(
        self, model: Any, *, mean: float, std: float, classes: int, epochs: int, best_epoch: int
    ) -> None:
        self.model = model
        self.mean = mean
        self.std = std
        self.classes = classes
        self.epochs = epochs
        self.best_epoch = best_epoch

    def predict(self, images: npt.NDArray[np.uint8], *, chunk: int = 1024) -> npt.NDArray[np.int64]:
        """Labels ``(N,)`` of uint8 images ``(N, H, W, C)``."""
        import torch

        out = np.empty(len(images), dtype=np.int64)
        with torch.no_grad():
            for start in range(0, len(images), chunk):
                x = _tensor(images[start : start + chunk], self.mean, self.std)
                out[start : start + chunk] = self.model(x).argmax(dim=1).numpy()
        return out

    def state(self) -> dict[str, Any]:
        """The weights as numpy arrays and the scaling (what a site saves)."""
        weights = {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        return {"weights": weights, "mean": self.mean, "std": self.std}


def _network(side: int, channels: int, classes: int, recipe: CnnRecipe) -> Any:
    import torch

    w = recipe.width
    flat = 2 * w * (side // 4) ** 2
    return torch.nn.Sequential(
        torch.nn.Conv2d(channels, w, 3, padding=1),
        torch.nn.BatchNorm2d(w),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(w, 2 * w, 3, padding=1),
        torch.nn.BatchNorm2d(2 * w),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(flat, recipe.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(recipe.hidden, classes),
    )


def _tensor(images: npt.NDArray[np.uint8], mean: float, std: float) -> Any:
    import torch

    x = np.asarray(images, dtype=np.float32).transpose(0, 3, 1, 2)
    return torch.from_numpy((x - mean) / std)


def _shifted(x: Any, shift: int, generator: Any) -> Any:
    """Each image translated by its own random offset in ``[-shift, shift]²`` (zero padding)."""
    import torch

    if shift == 0:
        return x
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (shift, shift, shift, shift))
    dy = torch.randint(0, 2 * shift + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * shift + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None, :])[:, None, :, None].expand(n, x.shape[1], h, w + 2 * shift)
    picked = torch.gather(padded, 2, rows)
    cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, None, :].expand(n, x.shape[1], h, w)
    return torch.gather(picked, 3, cols)


def train_scratch_cnn(
    images: npt.NDArray[np.uint8],
    labels: npt.NDArray[np.int64],
    *,
    classes: int,
    recipe: CnnRecipe | None = None,
    seed: int = 0,
) -> ScratchCNN:
    """Train the small CNN on ``images`` (uint8 ``(N, H, W, C)``) and ``labels``, early-stopped on an inner
    validation part (a seeded share of the images; the rest trains).

    Raises:
        InputError: fewer than two images, images of the wrong rank, or labels outside ``[0, classes)``.
    """
    from capc_common.threads import threads_limited

    with threads_limited(1):
        return _train(images, labels, classes=classes, recipe=recipe or CnnRecipe(), seed=seed)


def _train(
    images: npt.NDArray[np.uint8],
    labels: npt.NDArray[np.int64],
    *,
    classes: int,
    recipe: CnnRecipe,
    seed: int,
) -> ScratchCNN:
    import torch

    x_all = np.asarray(images)
    y_all = np.asarray(labels, dtype=np.int64)
    if x_all.ndim != 4 or len(x_all) != len(y_all):
        raise InputError(f"need images (N, H, W, C) and N labels, got {x_all.shape} and {y_all.shape}")
    if len(y_all) < 2:
        raise InputError("a CNN from scratch needs at least two images (one trains, one validates)")
    if y_all.min() < 0 or y_all.max() >= classes:
        raise InputError(f"labels must lie in [0, {classes})")
    order = np.random.default_rng(seed).permutation(len(y_all))  # not secret: a local split
    held = max(1, math.floor(recipe.validation * len(y_all)))
    val, train = order[:held], order[held:]
    mean = float(x_all[train].mean())
    std = float(x_all[train].std()) or 1.0
    xt, yt = _tensor(x_all[train], mean, std), torch.from_numpy(y_all[train])
    xv, yv = _tensor(x_all[val], mean, std), y_all[val]
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = _network(x_all.shape[1], x_all.shape[3], classes, recipe)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    best, best_state, best_epoch, since, steps, epoch = -1.0, None, 0, 0, 0, 0
    batch = min(recipe.batch, len(yt))
    for epoch in range(1, recipe.max_epochs + 1):
        model.train()
        perm = torch.randperm(len(yt), generator=generator)
        for start in range(0, len(yt) - batch + 1, batch):
            rows = perm[start : start + batch]
            optimizer.zero_grad()
            loss_fn(model(_shifted(xt[rows], recipe.shift, generator)), yt[rows]).backward()
            optimizer.step()
            steps += 1
            if steps >= recipe.max_steps:
                break
        model.eval()
        with torch.no_grad():
            score = float((model(xv).argmax(dim=1).numpy() == yv).mean())
        if score > best:
            best, best_state, best_epoch, since = score, copy.deepcopy(model.state_dict()), epoch, 0
        else:
            since += 1
        if since >= recipe.patience or steps >= recipe.max_steps:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return ScratchCNN(model, mean=mean, std=std, classes=classes, epochs=epoch, best_epoch=best_epoch)
