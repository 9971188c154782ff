"""Time to train the teachers' heads, each on its own shard (``learn.heads.train_heads``), on the CPU.

Each head is fitted alone, on one thread, so that its bits depend on its own shard only (docs/privacy.md
§2); this measures what that costs. Features are random (content does not change the cost); the shape is
the default backbone's (4,225 features) and a shard of 240 images, the issue's reference point being 250
heads in about a minute on 2 cores.

    python benchmarks/heads_speed.py                                  # table
    python benchmarks/heads_speed.py --heads 250,600 --format json    # {"runs": [{"heads", "seconds", ...}]}
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from capc_common.learn.heads import HeadRecipe, train_heads


def measure(heads: int, *, rows: int, dim: int, recipe: HeadRecipe) -> dict[str, Any]:
    """Seconds for ``train_heads`` on ``heads`` shards of ``rows`` random ``dim``-d features."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((heads * rows, dim), dtype=np.float32)
    y = rng.integers(0, 10, heads * rows)
    started = time.perf_counter()
    train_heads(x, y, owners=np.arange(heads * rows) % heads, heads=heads, classes=10, recipe=recipe)
    seconds = time.perf_counter() - started
    return {"heads": heads, "rows_per_head": rows, "dim": dim, "recipe": recipe.describe(),
            "seconds": round(seconds, 1), "heads_per_s": round(heads / seconds, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heads", default="250", help="comma-separated head counts")
    parser.add_argument("--rows", type=int, default=240, help="examples per head")
    parser.add_argument("--dim", type=int, default=4225, help="feature dimension")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args()
    runs = [measure(int(h), rows=args.rows, dim=args.dim, recipe=HeadRecipe()) for h in args.heads.split(",")]
    if args.format == "json":
        print(json.dumps({"runs": runs}))
    else:
        for r in runs:
            print(f"{r['heads']} heads x {r['rows_per_head']} rows x {r['dim']}: {r['seconds']} s")


if __name__ == "__main__":
    main()
