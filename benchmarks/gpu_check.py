"""GPU check of the student's accelerated paths: current-statistics features and SimCLR pretraining.

The student party extracts features of the answered queries on a GPU when one is present
(``train.device: auto``) and ``capc pretrain`` trains on one; neither can run in CI (no GPU there), so this
script checks them on a lent machine and prints one JSON object:

* ``features``: the shipped default backbone on 2,048 synthetic queries in current-statistics chunks, on the
  CPU and on the GPU: images/s each and the largest difference between the two (the same model must give the
  same features, up to float32 reduction order);
* ``pretrain``: a short SimCLR run (``--steps``) of a ResNet-18 on 32×32×3 ``shaders`` images on the GPU:
  steps/s, images/s and the first and last losses.

Usage: ``python benchmarks/gpu_check.py [--steps 60] [--format json]`` (exits 2 without a GPU).
``--device cpu`` runs the same code with the CPU in the GPU's place (the suite's smoke test: no GPU in CI);
``--images`` and ``--batch-size`` shrink it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import torch

from capc_common.learn.pretrain import PretrainConfig, pretrain
from capc_common.models import default_backbone, extract_features, load_backbone
from capc_common.synth import generate


def _features(images: np.ndarray, *, device: str, bn_batch: int) -> tuple[np.ndarray, float]:
    backbone = load_backbone(default_backbone(28, 28, 1)).to(device)
    extract_features(backbone, images[: 2 * bn_batch], bn_batch=bn_batch, mode="current")  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    feats = extract_features(backbone, images, bn_batch=bn_batch, mode="current")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return feats, images.shape[0] / (time.perf_counter() - start)


@click.command()
@click.option("--steps", type=click.IntRange(min=2), default=60, show_default=True)
@click.option("--device", default="cuda", show_default=True, help="Accelerator checked (cpu: smoke test).")
@click.option("--images", type=click.IntRange(min=128), default=2048, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def main(steps: int, device: str, images: int, batch_size: int, fmt: str) -> None:
    """Run both checks on the first GPU and print the figures."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        click.echo("no GPU visible to torch: this check needs one", err=True)
        sys.exit(2)
    queries = generate("dead_leaves", seed=1, start=0, count=images, height=28, width=28, channels=1)
    cpu, cpu_rate = _features(queries, device="cpu", bn_batch=64)
    gpu, gpu_rate = _features(queries, device=device, bn_batch=64)
    diff = float(np.max(np.abs(cpu - gpu)))
    scale = float(np.max(np.abs(cpu)))
    config = PretrainConfig(
        generator="shaders", arch="resnet18", input_shape=(32, 32, 3), batch_size=batch_size
    )
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        result = pretrain(config, out_dir=Path(out), steps=steps, device=device, progress=False)
        seconds = time.perf_counter() - start
        losses = np.loadtxt(Path(out) / "losses.csv", delimiter=",", skiprows=1, ndmin=2)[:, 1]
    report = {
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else device,
        "torch": torch.__version__,
        "features": {
            "backbone": default_backbone(28, 28, 1),
            "images": int(queries.shape[0]),
            "cpu_images_per_s": round(cpu_rate, 1),
            "gpu_images_per_s": round(gpu_rate, 1),
            "max_abs_diff": diff,
            "max_abs_feature": scale,
            "agree": bool(diff <= 1e-3 * max(scale, 1.0)),
        },
        "pretrain": {
            "arch": "resnet18",
            "size": "32x32x3",
            "batch_size": config.batch_size,
            "steps": steps,
            "seconds_with_calibration": round(seconds, 2),
            "steps_per_s": round(steps / seconds, 2),
            "train_seconds": round(result.seconds, 2),
            "images_per_s": round(result.images_seen / result.seconds, 1),
            "first_losses": [round(float(x), 4) for x in losses[:5]],
            "last_losses": [round(float(x), 4) for x in losses[-5:]],
        },
    }
    click.echo(json.dumps(report) if fmt == "json" else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
