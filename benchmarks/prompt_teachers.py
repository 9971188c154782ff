"""Does the prompt help? Prompted teachers against the same teachers without prompt training, on real images.

Trains ``--teachers`` teachers of ``--shard`` Fashion-MNIST training images each (the first ones), once per
number of prompt steps in ``--steps`` (0 = the label map alone on the blank-bordered image: a DIET-PATE
head), and scores every teacher on a validation hold-out of the *training* split (images 18,000 onward,
never the test set). Prints one JSON object with the mean teacher accuracy and the seconds per teacher.

    OMP_NUM_THREADS=1 python benchmarks/prompt_teachers.py --steps 0 3 --format json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train and score the teachers for each step count."""
    from capc_common.data import load_dataset
    from capc_common.learn.prompts import PromptRecipe, train_prompted_teachers
    from capc_common.models import default_backbone, load_backbone

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teachers", type=int, default=8)
    parser.add_argument("--shard", type=int, default=64)
    parser.add_argument("--steps", nargs="+", type=int, default=[0, 3])
    parser.add_argument("--prompt-lr", type=float, default=0.05)
    parser.add_argument("--kind", choices=("pad", "additive"), default="pad")
    parser.add_argument("--validation", type=int, default=512)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    data = load_dataset("fashion-mnist", split="train")
    backbone = load_backbone(default_backbone(28, 28, 1))
    shards = [np.arange(i * args.shard, (i + 1) * args.shard) for i in range(args.teachers)]
    held = slice(18_000, 18_000 + args.validation)
    rows = []
    for steps in args.steps:
        recipe = PromptRecipe(kind=args.kind, steps=steps, prompt_lr=args.prompt_lr)
        start = time.perf_counter()
        teachers = train_prompted_teachers(
            backbone, data.images, data.labels.astype(np.int64), shards, classes=10, recipe=recipe
        )
        seconds = (time.perf_counter() - start) / args.teachers
        acc = (teachers.predict(data.images[held]) == data.labels[held][None, :]).mean(axis=1)
        rows.append(
            {
                "steps": steps,
                "mean_teacher_accuracy": float(acc.mean()),
                "std": float(acc.std()),
                "seconds_per_teacher": seconds,
                "loss_first_last": [float(teachers.losses[:, 0].mean()), float(teachers.losses[:, -1].mean())]
                if steps
                else None,
            }
        )
    result = {"setting": vars(args), "rows": rows}
    print(json.dumps(result) if args.format == "json" else "\n".join(str(r) for r in rows))
    return result


if __name__ == "__main__":
    main()
