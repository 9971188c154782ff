"""SimCLR pretraining on synthetic images only (no real data, so no privacy cost), resumable.

Recipe (DIET-PATE, after Chen et al. 2020): each step draws ``batch_size`` fresh images from a synthetic
generator *by index* (step ``s`` uses images ``[s·B, (s+1)·B)`` of the generator's stream, so no image is
ever repeated and any step can be regenerated), makes two augmented views of each
(:mod:`capc_common.learn.augment`), embeds them with the backbone's learnable features and a projection MLP
(``ssl_dim → proj_hidden → proj_dim``, ReLU), and minimises the NT-Xent loss with Adam (lr 3e-4, batch 256,
projection dimension 128, as in the paper).

Reproducibility and resumption: all randomness is explicit — weight init from ``seed``, images from
``(generator, seed, index)``, augmentation parameters from a generator seeded by ``(seed, step)`` — and a
checkpoint (``pretrain_state.pt``: weights, projection head, optimiser, step, loss history) is written
atomically every ``checkpoint_seconds`` and at the end. Resuming replays nothing and continues exactly where
the last checkpoint stopped. At the end every BatchNorm layer's running statistics are recomputed as exact
averages over ``calibration_batches`` batches of un-augmented synthetic images (stream ``seed + 1``),
which is what ``running`` mode uses; current-statistics inference does not depend on them. Outputs in
``out_dir``: ``backbone.safetensors`` (with the recipe in its metadata), ``recipe.json``, ``losses.csv`` and
``loss.png``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from capc_common.errors import InputError
from capc_common.learn.augment import AugmentConfig, augment
from capc_common.models import (
    Backbone,
    build_backbone,
    format_shape,
    recalibrate_running_stats,
    save_backbone,
    to_tensor,
)

__all__ = [
    "EPOCH_IMAGES",
    "PretrainConfig",
    "PretrainResult",
    "calibrate_training_free",
    "nt_xent",
    "pretrain",
]

# Synthetic data is an endless stream; an "epoch" is this many fresh images (the size of Fashion-MNIST's
# training set), so ``--epochs`` reads like it does for a real dataset.
EPOCH_IMAGES = 60_000
STATE_FILE = "pretrain_state.pt"
BACKBONE_FILE = "backbone.safetensors"


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that determines a pretraining run (a resumed run must use the same).

    Attributes:
        generator: synthetic generator name (see ``capc_common.synth.GENERATOR_NAMES``).
        arch: backbone architecture (see ``capc_common.models.ARCHITECTURES``).
        input_shape: ``(H, W, C)``.
        arch_config: architecture keywords (e.g. ``{"cnn_width": 128}``).
        batch_size: images per step (two views each).
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
        temperature: NT-Xent temperature.
        proj_hidden: hidden width of the projection MLP.
        proj_dim: output dimension of the projection MLP.
        seed: seed of the synthetic stream, the initialisation and the augmentations.
        augment: augmentation strengths.
    """

    generator: str
    arch: str
    input_shape: tuple[int, int, int]
    arch_config: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 256
    lr: float = 3e-4
    weight_decay: float = 1e-6
    temperature: float = 0.5
    proj_hidden: int = 512
    proj_dim: int = 128
    seed: int = 0
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        if self.batch_size < 2:
            raise InputError(
                f"batch_size must be at least 2 (NT-Xent needs negatives), got {self.batch_size}"
            )
        if not (self.lr > 0 and self.temperature > 0):
            raise InputError(f"lr and temperature must be positive, got {self.lr} and {self.temperature}")
        if self.proj_dim < 1 or self.proj_hidden < 1:
            raise InputError("projection dimensions must be positive")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (stored in checkpoints and in the backbone's recipe)."""
        out = asdict(self)
        out["input_shape"] = format_shape(self.input_shape)
        return out


@dataclass(frozen=True)
class PretrainResult:
    """What a run produced.

    Attributes:
        out_dir: output directory.
        backbone_path: the pretrained backbone (safetensors).
        sha256: its content hash.
        steps: total optimisation steps so far (including resumed ones).
        images_seen: synthetic images consumed (``steps · batch_size``).
        seconds: total training wall time, including resumed runs.
        final_loss: mean NT-Xent loss over the last 20 steps.
    """

    out_dir: Path
    backbone_path: Path
    sha256: str
    steps: int
    images_seen: int
    seconds: float
    final_loss: float


def nt_xent(z: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """NT-Xent loss of ``z`` ``(2n, d)``, where rows ``i`` and ``i + n`` are the two views of one image."""
    n2 = z.shape[0]
    if n2 % 2 or n2 < 4:
        raise InputError(f"NT-Xent needs an even number (>= 4) of embeddings, got {n2}")
    n = n2 // 2
    z = F.normalize(z, dim=1)
    sim = z @ z.T / temperature
    sim = sim.masked_fill(torch.eye(n2, dtype=torch.bool, device=z.device), float("-inf"))
    targets = torch.cat([torch.arange(n, n2), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, targets)


def _projection(config: PretrainConfig, ssl_dim: int) -> nn.Module:
    generator = torch.Generator().manual_seed(config.seed + 1)
    with torch.random.fork_rng(devices=[]):
        head = nn.Sequential(
            nn.Linear(ssl_dim, config.proj_hidden),
            nn.ReLU(inplace=True),
            nn.Linear(config.proj_hidden, config.proj_dim),
        )
    for layer in head:
        if isinstance(layer, nn.Linear):
            bound = 1.0 / math.sqrt(layer.in_features)
            nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
            nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return head


def _step_generator(seed: int, step: int) -> torch.Generator:
    state = np.random.SeedSequence([seed, step]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _atomic_torch_save(obj: dict[str, Any], path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_loss_outputs(out_dir: Path, losses: list[float], config: PretrainConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(out_dir / "losses.csv", "w", encoding="utf-8") as fh:
        fh.write("step,loss\n")
        fh.writelines(f"{i + 1},{loss:.6f}\n" for i, loss in enumerate(losses))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.6, alpha=0.5, label="per step")
    window = min(50, max(1, len(losses) // 10))
    if len(losses) >= window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, lw=1.5, label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("NT-Xent loss")
    ax.set_title(
        f"SimCLR {config.arch} on {config.generator} {format_shape(config.input_shape)}, "
        f"batch {config.batch_size}"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "loss.png", dpi=120)
    plt.close(fig)


def _calibrate(
    backbone: Backbone,
    config: PretrainConfig,
    *,
    batches: int,
    images_fn: Callable[..., np.ndarray],
    device: torch.device,
) -> dict[str, Any]:
    """Recompute all running statistics on fresh, un-augmented synthetic images (stream ``seed + 1``)."""
    h, w, c = config.input_shape
    size = config.batch_size
    stream = (
        to_tensor(
            images_fn(
                config.generator,
                seed=config.seed + 1,
                start=i * size,
                count=size,
                height=h,
                width=w,
                channels=c,
            ),
            device=device,
        )
        for i in range(batches)
    )
    recalibrate_running_stats(backbone, stream)
    return {"generator": config.generator, "seed": config.seed + 1, "batches": batches, "batch": size}


def _stream_check(config: PretrainConfig, images_fn: Callable[..., np.ndarray]) -> str:
    """SHA-256 of the first training batch, so anyone can check they regenerate the same stream."""
    h, w, c = config.input_shape
    first = images_fn(
        config.generator, seed=config.seed, start=0, count=config.batch_size, height=h, width=w, channels=c
    )
    return hashlib.sha256(np.ascontiguousarray(first).tobytes()).hexdigest()


def _plan_steps(*, steps: int | None, epochs: float | None, batch_size: int) -> int | None:
    if steps is not None and epochs is not None:
        raise InputError("give either steps or epochs, not both")
    if epochs is not None:
        if epochs <= 0:
            raise InputError(f"epochs must be positive, got {epochs}")
        return max(1, math.ceil(epochs * EPOCH_IMAGES / batch_size))
    if steps is not None and steps < 1:
        raise InputError(f"steps must be at least 1, got {steps}")
    return steps


def _load_state(
    path: Path, config: PretrainConfig, backbone: Backbone, head: nn.Module, opt: torch.optim.Optimizer
) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        raise InputError(
            f"pretraining checkpoint {path} cannot be read ({exc}); delete it to start over"
        ) from exc
    saved = json.loads(state["config"])
    wanted = json.loads(json.dumps(config.as_dict(), sort_keys=True))
    if saved != wanted:
        diff = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
        raise InputError(
            f"cannot resume {path}: it was started with different settings ({', '.join(diff)}); "
            f"resume with the original ones or use a new output directory"
        )
    backbone.load_state_dict(state["backbone"])
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["optimizer"])
    return state


def pretrain(
    config: PretrainConfig,
    *,
    out_dir: str | Path,
    steps: int | None = None,
    epochs: float | None = None,
    minutes: float | None = None,
    resume: bool = False,
    device: str | None = None,
    progress: bool = True,
    checkpoint_seconds: float = 120.0,
    calibration_batches: int = 16,
    images_fn: Callable[..., np.ndarray] | None = None,
) -> PretrainResult:
    """Run (or resume) SimCLR pretraining until ``steps``/``epochs`` are reached or ``minutes`` elapse.

    Args:
        config: the run's settings.
        out_dir: where checkpoints and outputs go.
        steps: total optimisation steps to reach (counting resumed ones).
        epochs: alternatively, total epochs of :data:`EPOCH_IMAGES` fresh images.
        minutes: wall-clock budget of *this* invocation (combine with steps/epochs or use alone).
        resume: continue from ``out_dir/pretrain_state.pt`` (required when it exists).
        device: ``"cpu"``, ``"cuda"``...; default: CUDA when available.
        progress: show a progress bar on stderr.
        checkpoint_seconds: interval between checkpoints.
        calibration_batches: un-augmented synthetic batches (of ``batch_size``) the final running
            statistics are averaged over.
        images_fn: image source ``f(name, *, seed, start, count, height, width, channels)``; default
            :func:`capc_common.synth.generate`.

    Returns:
        A :class:`PretrainResult`.

    Raises:
        InputError: no stopping rule, conflicting settings, an existing run without ``resume`` (or ``resume``
            without a run), or a checkpoint made with other settings.
    """
    target = _plan_steps(steps=steps, epochs=epochs, batch_size=config.batch_size)
    if target is None and minutes is None:
        raise InputError("pretraining needs a stopping rule: steps, epochs or minutes")
    if minutes is not None and minutes <= 0:
        raise InputError(f"minutes must be positive, got {minutes}")
    if calibration_batches < 1:
        raise InputError(f"calibration_batches must be at least 1, got {calibration_batches}")
    images_fn = _image_source(config, images_fn)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    backbone = build_backbone(
        config.arch, input_shape=config.input_shape, seed=config.seed, config=config.arch_config
    )
    if backbone.learned_dim == 0:
        raise InputError(
            f"architecture {config.arch!r} has nothing to learn (it is training-free); "
            "use calibrate_training_free"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / STATE_FILE
    if state_path.exists() and not resume:
        raise InputError(
            f"{out} already holds a pretraining run; pass resume to continue it or pick a new directory"
        )
    if resume and not state_path.exists():
        raise InputError(f"nothing to resume: {state_path} does not exist")

    head = _projection(config, backbone.ssl_dim)
    backbone.to(dev).train()
    head.to(dev).train()
    params = [p for p in backbone.parameters() if p.requires_grad] + list(head.parameters())
    opt = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    step, losses, seconds = 0, [], 0.0
    if resume:
        state = _load_state(state_path, config, backbone, head, opt)
        step, losses, seconds = int(state["step"]), list(state["losses"]), float(state["seconds"])

    def checkpoint() -> None:
        _atomic_torch_save(
            {
                "config": json.dumps(config.as_dict(), sort_keys=True),
                "step": step,
                "losses": losses,
                "seconds": seconds,
                "backbone": backbone.state_dict(),
                "head": head.state_dict(),
                "optimizer": opt.state_dict(),
            },
            state_path,
        )

    h, w, c = config.input_shape
    run_start = last_save = time.monotonic()
    base_seconds = seconds
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=target,
            initial=step,
            desc="simclr",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
        )
    try:
        while target is None or step < target:
            if minutes is not None and time.monotonic() - run_start >= minutes * 60.0:
                break
            images = images_fn(
                config.generator,
                seed=config.seed,
                start=step * config.batch_size,
                count=config.batch_size,
                height=h,
                width=w,
                channels=c,
            )
            x = to_tensor(images, device=dev)
            gen = _step_generator(config.seed, step)
            views = torch.cat([augment(x, config=config.augment, generator=gen) for _ in range(2)])
            loss = nt_xent(head(backbone.ssl_features(views)), temperature=config.temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            losses.append(float(loss.detach()))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if time.monotonic() - last_save >= checkpoint_seconds:
                seconds = base_seconds + time.monotonic() - run_start
                checkpoint()
                last_save = time.monotonic()
    finally:
        if bar is not None:
            bar.close()
    seconds = base_seconds + time.monotonic() - run_start
    checkpoint()
    calibration = _calibrate(backbone, config, batches=calibration_batches, images_fn=images_fn, device=dev)
    recipe = {
        "method": "simclr",
        "steps": step,
        "images_seen": step * config.batch_size,
        "train_seconds": round(seconds, 1),
        **_provenance(config, images_fn, dev),
        "running_stats": calibration,
    }
    return _finish(backbone, recipe, out, losses=losses, config=config, seconds=seconds)


def calibrate_training_free(
    config: PretrainConfig,
    *,
    out_dir: str | Path,
    calibration_batches: int = 16,
    device: str | None = None,
    images_fn: Callable[..., np.ndarray] | None = None,
) -> PretrainResult:
    """ "Pretrain" a training-free backbone (scattering): only its running statistics come from the generator.

    The scattering front end has no weights; its per-channel standardisation keeps running statistics for
    ``running`` mode. This sets them to exact averages over un-augmented synthetic images and writes the
    same outputs as :func:`pretrain` (without a loss curve).

    Raises:
        InputError: the architecture has learnable weights (use :func:`pretrain`) or calibration_batches < 1.
    """
    images_fn = _image_source(config, images_fn)
    if calibration_batches < 1:
        raise InputError(f"calibration_batches must be at least 1, got {calibration_batches}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    backbone = build_backbone(
        config.arch, input_shape=config.input_shape, seed=config.seed, config=config.arch_config
    ).to(dev)
    if backbone.learned_dim:
        raise InputError(f"architecture {config.arch!r} has learnable weights; pretrain it with pretrain()")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    calibration = _calibrate(backbone, config, batches=calibration_batches, images_fn=images_fn, device=dev)
    recipe = {
        "method": "training-free",
        "generator": config.generator,
        "seed": config.seed,
        "running_stats": calibration,
        "device": str(dev),
        "torch": torch.__version__,
    }
    return _finish(backbone, recipe, out, losses=[], config=config, seconds=0.0)


def _image_source(
    config: PretrainConfig, images_fn: Callable[..., np.ndarray] | None
) -> Callable[..., np.ndarray]:
    if images_fn is not None:
        return images_fn
    from capc_common.synth import GENERATOR_NAMES, generate

    if config.generator not in GENERATOR_NAMES:
        raise InputError(
            f"unknown generator {config.generator!r}; expected one of {', '.join(GENERATOR_NAMES)}"
        )
    return generate


def _provenance(
    config: PretrainConfig, images_fn: Callable[..., np.ndarray], device: torch.device
) -> dict[str, Any]:
    return {
        "generator": config.generator,
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "stream_sha256": _stream_check(config, images_fn),
        **{
            k: v
            for k, v in config.as_dict().items()
            if k not in ("arch", "input_shape", "arch_config", "generator")
        },
    }


def _finish(
    backbone: Backbone,
    recipe: dict[str, Any],
    out: Path,
    *,
    losses: list[float],
    config: PretrainConfig,
    seconds: float,
) -> PretrainResult:
    """Save the backbone (recipe in its metadata), ``recipe.json`` and, after training, the loss curve."""
    backbone.recipe = recipe
    backbone_path = out / BACKBONE_FILE
    digest = save_backbone(backbone.to("cpu"), backbone_path)
    (out / "recipe.json").write_text(
        json.dumps({"sha256": digest, **recipe}, indent=2, sort_keys=True) + "\n"
    )
    if losses:
        _write_loss_outputs(out, losses, config)
    tail = losses[-20:]
    steps = int(recipe.get("steps", 0))
    return PretrainResult(
        out_dir=out,
        backbone_path=backbone_path,
        sha256=digest,
        steps=steps,
        images_seen=steps * config.batch_size,
        seconds=seconds,
        final_loss=float(np.mean(tail)) if tail else float("nan"),
    )
