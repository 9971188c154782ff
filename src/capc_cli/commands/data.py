"""``capc data``: check a dataset loads (a site's own files included), import a site's images into the
``.npz`` its site file names, and preview a partition."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

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


def _import_text(result: dict[str, Any]) -> str:
    lines = [
        f"wrote {result['out']}: {result['examples']} examples {result['shape']}, classes "
        f"{result['classes']}, per class {result['per_class']}",
        f"  labels: {result['labelled_by']}",
    ]
    lines += [f"  pixels: {line}" for line in result["pixel_notes"]]
    for check in result["checks"]:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[check["status"]]
        lines.append(f"  {mark}  {check['check']:<15} {check['detail']}")
        if check["fix"]:
            lines.append(f"        {'':<15} fix: {check['fix']}")
    if not result["federation"]:
        lines.append("  (not checked against a federation: pass --federation federation.yaml)")
    lines.append(f"site file: data: {{dataset: {result['out']}}}")
    return "\n".join(lines)


@command.command("import")
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The .npz to write."
)
@click.option(
    "--classes",
    default=None,
    metavar="NAME,NAME,…",
    help="The federation's class names in its order (a label's index is its position); labels may be "
    "these names or indices. Default: the class_names of --federation; without it an image folder's sorted "
    "folder names, a CSV's labels as indices.",
)
@click.option(
    "--federation",
    "federation_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Check the images against this federation.yaml (its image size, classes and class names), as "
    "preflight does.",
)
@click.option("--party", default=None, help="With --federation: also check there are examples for its heads.")
@click.option(
    "--resize",
    is_flag=True,
    help="Convert every image to the federation's height x width x channels (needs --federation).",
)
@click.option(
    "--fit",
    type=click.Choice(["pad", "crop", "stretch"]),
    default=None,
    help="With --resize, an image of another aspect ratio is: padded with black (pad, the default), "
    "centre-cropped (crop) or stretched (stretch).",
)
@click.option(
    "--bit-depth",
    type=click.IntRange(8, 32),
    default=None,
    help="Scale 16-bit (and DICOM) grey images by this many bits [default: the bits their largest value "
    "needs, e.g. 12 for a 12-bit detector]; a larger value is refused, never clipped.",
)
@click.option(
    "--allow-missing-classes",
    is_flag=True,
    help="With --federation: accept a site with no examples of some of the federation's classes (otherwise "
    "refused: it more often means folders named wrong).",
)
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@format_option
def import_command(
    source: Path,
    out: Path,
    classes: str | None,
    federation_file: Path | None,
    party: str | None,
    resize: bool,
    fit: str | None,
    bit_depth: int | None,
    allow_missing_classes: bool,
    force: bool,
    fmt: str,
) -> None:
    """Turn SOURCE — an image folder (one sub-folder per class) or a CSV file of path,label rows; PNG, JPEG,
    TIFF or DICOM — into the .npz a site file names (data: {dataset: OUT}).

    Checks what `capc teacher preflight` checks of a site's data (with --federation: its image size,
    classes and, with --party, enough examples for the party's heads; always: that the images look like
    images) and writes nothing if one fails (exit 2), nor on unreadable images (each listed), mixed sizes
    (without --resize) or a label that maps onto no class.
    """
    from dataclasses import asdict

    import numpy as np

    from capc_common.data import import_images, write_npz
    from capc_common.data.importer import npz_target
    from capc_common.federation import FederationConfig
    from capc_common.federation.site_data import dataset_findings, image_findings, refuse

    if (resize or party or allow_missing_classes) and federation_file is None:
        raise click.UsageError(
            "--resize, --party and --allow-missing-classes need --federation (the federation's size, classes "
            "and parties)"
        )
    if fit is not None and not resize:
        raise click.UsageError("--fit says how --resize treats another aspect ratio: add --resize")
    config = FederationConfig.load(federation_file) if federation_file is not None else None
    names = [c.strip() for c in classes.split(",")] if classes else None
    named_by = "--classes"
    if config is not None and config.class_names is not None:
        if names is not None and tuple(names) != config.class_names:
            raise click.BadParameter(
                f"{names} differ from the class_names of {federation_file}, {list(config.class_names)}; "
                "leave --classes out (the federation's names are used)",
                param_hint="--classes",
            )
        names, named_by = list(config.class_names), f"class_names of {federation_file}"
    if config is not None and names is not None and len(names) > config.classes:
        raise click.BadParameter(
            f"names {len(names)} classes; the federation has {config.classes}", param_hint="--classes"
        )
    heads = config.teacher(party).heads if config is not None and party else None
    npz_target(out, force=force)
    q = config.queries if config is not None else None
    size = (q.height, q.width, q.channels) if resize and q else None
    imported = import_images(
        source,
        classes=names,
        named_by=named_by,
        size=size,
        fit="pad" if fit is None else fit,  # type: ignore[arg-type]  # click.Choice checked it
        bit_depth=bit_depth,
        sorted_names=config is None,
    )
    dataset = imported.dataset
    findings = [image_findings(dataset.images)]
    if config is not None:
        missing: Literal["warn", "fail"] = "warn" if allow_missing_classes else "fail"
        findings.insert(
            0,
            dataset_findings(
                dataset.images,
                dataset.labels,
                config=config,
                name=str(source),
                heads=heads,
                missing_classes=missing,
            ),
        )
    for finding in findings:
        refuse(finding)
    written = write_npz(dataset, out, force=force)
    counts = np.bincount(dataset.labels, minlength=dataset.num_classes)
    emit(
        {
            "out": str(written.resolve()),
            "examples": len(dataset),
            "shape": "x".join(map(str, dataset.shape)),
            "classes": list(dataset.class_names),
            "per_class": counts.tolist(),
            "labelled_by": imported.labelled_by,
            "pixels": asdict(imported.pixels),
            "pixel_notes": imported.pixels.lines(size=size),
            "federation": str(federation_file) if federation_file is not None else None,
            "checks": [{**asdict(f), "data": dict(f.data)} for f in findings],
        },
        fmt,
        _import_text,
    )


@command.command("verify")
@click.option(
    "--site",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The teacher's site file: its data.dataset (one .npz) and data.sha256.",
)
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until the file is there and its SHA-256 matches (while it is copied in, e.g. by `kubectl cp` "
    "into a volume) instead of checking once.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="With --wait: give up after this many seconds (exit 4) [default: wait on].",
)
def verify(site: Path, wait: bool, timeout: float | None) -> None:
    """Check a site's data file against the SHA-256 its site file pins (data.sha256).

    Exit 0 when it matches, 2 when the site pins no checksum or the file is missing, 5 when the file differs
    (a copy cut short, another file). The Kubernetes teacher runs it with --wait before it starts, so its
    volume is loaded by copying the file in (docs/operations.md, "Load a hospital's data").
    """
    from capc_common.data.checksum import await_file, dataset_file, verify_file
    from capc_common.errors import InputError
    from capc_services.teacher.settings import TeacherSettings

    settings = TeacherSettings.load(site)
    data = settings.data
    if data is None or data.sha256 is None:
        dataset = "/data/site.npz" if data is None else data.dataset
        raise InputError(
            f"site file {site} pins no data.sha256, so a copy of the site's data cannot be checked; add "
            f"it to the data section (`data: {{dataset: {dataset}, sha256: …}}`, the SHA-256 that "
            "`sha256sum FILE` prints where the file was made)"
        )
    path = dataset_file(data.dataset)
    if path is None:  # the site settings allow a checksum only for one file
        raise InputError(f"site file {site}: data.dataset {data.dataset!r} is not one file")
    if wait:
        await_file(path, data.sha256, timeout=timeout, say=lambda line: click.echo(line, err=True))
    else:
        verify_file(path, data.sha256)
    click.echo(f"ok: {path} has the SHA-256 the site file pins ({data.sha256})")
