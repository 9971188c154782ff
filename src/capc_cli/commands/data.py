"""``capc data``: check a dataset loads (a site's own files included) and preview its partition."""

from __future__ import annotations

from typing import Any

import click

from capc_cli.output import emit, format_option


@click.group("data")
def command() -> None:
    """Datasets: load and validate them, preview teacher shards."""


@command.command("show")
@click.argument("name")
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True)
@format_option
def show(name: str, split: str, fmt: str) -> None:
    """Load dataset NAME and print its size, image shape and class counts.

    NAME is fashion-mnist, digits, idx:<dir>, npz:<file> or folder:<dir>. A file problem (missing,
    truncated, mislabelled, unreadable image) exits with code 2 and names the file.
    """
    import numpy as np

    from capc_common.data import load_dataset

    ds = load_dataset(name, split=split)
    counts = np.bincount(ds.labels, minlength=ds.num_classes)
    emit(
        {
            "name": ds.name,
            "examples": len(ds),
            "shape": "x".join(map(str, ds.shape)),
            "classes": ds.num_classes,
            "class_counts": {n: int(c) for n, c in zip(ds.class_names, counts, strict=True)},
        },
        fmt,
    )


@command.command("partition")
@click.argument("name")
@click.option("--shards", type=click.IntRange(min=1), required=True, help="Number of shards (teachers).")
@click.option(
    "--scheme", type=click.Choice(["iid", "imbalanced", "dirichlet"]), default="iid", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--imbalance-ratio", type=float, default=None, help="imbalanced: most/least frequent class.")
@click.option("--alpha", type=float, default=None, help="dirichlet: concentration (small = skewed).")
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True)
@format_option
def partition_cmd(
    name: str,
    shards: int,
    scheme: str,
    seed: int,
    imbalance_ratio: float | None,
    alpha: float | None,
    split: str,
    fmt: str,
) -> None:
    """Split dataset NAME into disjoint shards and print each shard's size and class counts."""
    import numpy as np

    from capc_common.data import load_dataset, partition

    ds = load_dataset(name, split=split)
    parts = partition(
        ds.labels, shards=shards, scheme=scheme, seed=seed, imbalance_ratio=imbalance_ratio, alpha=alpha
    )
    per_shard = [np.bincount(ds.labels[p], minlength=ds.num_classes) for p in parts]
    result: dict[str, Any] = {
        "name": ds.name,
        "scheme": scheme,
        "seed": seed,
        "sizes": [len(p) for p in parts],
        "class_counts": [c.tolist() for c in per_shard],
    }
    if fmt == "json":
        emit(result, fmt)
        return
    lines = [f"{ds.name}: {len(ds)} examples in {shards} {scheme} shards (seed {seed})"]
    lines += [
        f"  shard {k:4d}: {len(p):6d}  {c.tolist()}"
        for k, (p, c) in enumerate(zip(parts, per_shard, strict=True))
    ]
    click.echo("\n".join(lines))
