"""Throughput of ``extract_features`` (current statistics) for every shipped backbone on the CPU.

Teachers run this on every query batch and the student on its training data, so it bounds the whole
protocol's speed on CPU-only sites. Images are uniform random bytes (content does not change the cost).

    python benchmarks/backbone_speed.py --threads 2                 # table
    python benchmarks/backbone_speed.py --threads 2 --format json   # {"<backbone>": {"images_per_s": x, ...}}
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from capc_common.models import extract_features, list_backbones, load_backbone


def measure(name: str, *, images: int, bn_batch: int, repeats: int) -> dict[str, Any]:
    """Best-of-``repeats`` images/s of extract_features on ``images`` random images (after one warm-up)."""
    backbone = load_backbone(name)
    h, w, c = backbone.input_shape
    data = np.random.default_rng(0).integers(0, 256, (images, h, w, c), dtype=np.uint8)
    extract_features(backbone, data[:bn_batch], bn_batch=bn_batch)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        extract_features(backbone, data, bn_batch=bn_batch)
        best = min(best, time.perf_counter() - started)
    return {
        "images_per_s": round(images / best, 1),
        "size": "x".join(map(str, backbone.input_shape)),
        "feature_dim": backbone.feature_dim,
        "threads": torch.get_num_threads(),
        "bn_batch": bn_batch,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--threads", type=int, default=2, help="Torch CPU threads.")
    parser.add_argument("--images", type=int, default=2048, help="Images per measurement.")
    parser.add_argument("--bn-batch", type=int, default=256, help="Query batch (BatchNorm chunk) size.")
    parser.add_argument("--repeats", type=int, default=3, help="Measurements per backbone (best is kept).")
    parser.add_argument("--backbones", nargs="*", default=None, help="Names (default: all shipped).")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {
        name: measure(name, images=args.images, bn_batch=args.bn_batch, repeats=args.repeats)
        for name in (args.backbones or list_backbones())
    }
    if args.format == "json":
        print(json.dumps(result))
    else:
        for name, row in result.items():
            print(
                f"{name:22s} {row['size']:8s} {row['images_per_s']:9.1f} images/s  "
                f"(dim {row['feature_dim']}, {row['threads']} threads, chunks of {row['bn_batch']})"
            )
    return result


if __name__ == "__main__":
    main()
