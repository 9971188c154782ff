"""``capc pretrain``: SimCLR pretraining of a backbone on synthetic images only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, format_option


@click.command("pretrain")
@click.option(
    "--generator", "-g", required=True, help="Synthetic generator (dead_leaves, fractal, stylegan, ...)."
)
@click.option(
    "--arch",
    "-a",
    default="scatter_cnn",
    show_default=True,
    help="scatter_cnn (scattering + CNN hybrid), cnn, resnet10, resnet18, or scatter (training-free).",
)
@click.option("--size", default="28x28x1", show_default=True, help="Image shape HxWxC.")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), help="Epochs of 60,000 fresh images.")
@click.option(
    "--steps", type=click.IntRange(min=1), help="Total optimisation steps (alternative to --epochs)."
)
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), help="Wall-clock budget of this run.")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output directory.",
)
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint.")
@click.option("--batch-size", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=3e-4, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=0.5, show_default=True)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the stream, init and augmentations."
)
@click.option(
    "--arch-config",
    default="{}",
    show_default=True,
    help='Architecture keywords as JSON, e.g. {"cnn_width": 64}.',
)
@click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: CUDA when available).")
@click.option(
    "--threads", type=click.IntRange(min=1), default=None, help="Torch CPU threads (default: torch's)."
)
@click.option(
    "--checkpoint-seconds",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Checkpoint interval.",
)
@format_option
def command(
    generator: str,
    arch: str,
    size: str,
    epochs: float | None,
    steps: int | None,
    minutes: float | None,
    out_dir: Path,
    resume: bool,
    batch_size: int,
    lr: float,
    temperature: float,
    seed: int,
    arch_config: str,
    device: str | None,
    threads: int | None,
    checkpoint_seconds: float,
    fmt: str,
) -> None:
    """Pretrain a backbone with SimCLR on a synthetic generator (no real data, no privacy cost).

    Stops at --epochs/--steps or after --minutes, whichever comes first; checkpoints regularly and can be
    resumed with --resume. Writes backbone.safetensors, recipe.json, losses.csv and loss.png to --out.
    For the training-free --arch scatter nothing is trained: only the running statistics of its
    standardisation are averaged over un-augmented images of the generator.

    \b
    Example:
      capc pretrain --generator dead_leaves --arch scatter_cnn --size 28x28x1 --minutes 30 --out runs/h28
    """
    import torch

    from capc_common.errors import InputError
    from capc_common.learn.pretrain import PretrainConfig, calibrate_training_free, pretrain
    from capc_common.models import build_backbone, parse_shape

    try:
        cfg: dict[str, Any] = json.loads(arch_config)
    except json.JSONDecodeError as exc:
        raise InputError(f"--arch-config must be a JSON object, got {arch_config!r} ({exc})") from exc
    if not isinstance(cfg, dict):
        raise InputError(f"--arch-config must be a JSON object, got {arch_config!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    config = PretrainConfig(
        generator=generator,
        arch=arch,
        input_shape=parse_shape(size),
        arch_config=cfg,
        batch_size=batch_size,
        lr=lr,
        temperature=temperature,
        seed=seed,
    )
    if build_backbone(arch, input_shape=config.input_shape, config=cfg).learned_dim == 0:
        result = calibrate_training_free(config, out_dir=out_dir, device=device)
    else:
        result = pretrain(
            config,
            out_dir=out_dir,
            steps=steps,
            epochs=epochs,
            minutes=minutes,
            resume=resume,
            device=device,
            progress=True,
            checkpoint_seconds=checkpoint_seconds,
        )
    emit(
        {
            "backbone": str(result.backbone_path),
            "sha256": result.sha256,
            "steps": result.steps,
            "images_seen": result.images_seen,
            "seconds": round(result.seconds, 1),
            "final_loss": round(result.final_loss, 4),
            "loss_plot": str(result.out_dir / "loss.png") if result.steps else None,
        },
        fmt,
    )
