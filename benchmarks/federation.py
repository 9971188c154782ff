"""Federation throughput and protocol latency against central plaintext labelling, in the same run.

Usage: ``.venv/bin/python benchmarks/federation.py [--format text|json] [--parties 4 --train-limit 2500
--batch-size 1024 --batches 5 ...]``. With ``--format json`` it prints one object with at least
``federation_labels_per_s``, ``central_labels_per_s``, ``ratio``, ``protocol_latency_256_s`` (the latency
batch's size in the key), ``stages``, ``mpc_bytes_per_label``, ``guardian_rss_mb`` and ``setup``.

Every party selects its examples by keyed content hash (about ``--train-limit`` each, a binomial count), so
the teachers per party are not fixed in advance: they are what the federation planner proposes for the
parties' actual example counts (:func:`capc_common.federation.propose`, ``capc federation plan``: the most
heads whose shards all hold one BatchNorm chunk, but for a 0.1 % chance), the smallest over the parties;
``--teachers-per-party`` overrides it.

What is compared (defaults: 4 teacher parties of about 2,500 examples, 25 teachers each as planned at
``bn_batch`` 64, 10 classes, batches of 1024, the default backbone, this machine):

* **central**: plaintext labelling with the same model work — for every batch each party's share of the work
  runs in its own worker process (as each party must regenerate the queries and run its own backbone pass
  and heads), then one process sums the vote histograms, draws the discrete Gaussian noise and applies
  Confident-GNMax. No secret sharing, no network, no 2PC, no ledger.
* **federation**: the same parties as real processes over mutual-TLS gRPC on loopback (``capc local``):
  sharing, transport, the garbled-circuit argmax, the durable ledger, the pipelined scheduler.

Both rates are steady-state: labels of batches 2..n over the time from the start of batch 2 (its opening) to
the end of batch n (the first batch carries process warm-up and, in the federation, the base OT). The
protocol latency of a 256-query batch is measured in a second federation that runs one batch at a time:
the batch's wall time (open → labels stored) minus the slowest party's own model work (query generation +
inference), median over batches 2..n. The guardian's resident memory is sampled after every batch of a third
federation that runs many small batches (64 queries).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import click
import httpx
import numpy as np
import psutil
from _force import benchmark_force

from capc_common.aggregation import draw_confident_noise, draw_student_noise, vote_histogram
from capc_common.errors import InputError
from capc_common.federation import FederationConfig, batch_plan, propose
from capc_common.mechanisms import confident_rule
from capc_common.privacy import SystemNoise
from capc_services.local.federation import down, ensure_provisioned, token, up
from capc_services.local.layout import Layout
from capc_services.local.provision import LocalOptions
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import party_examples, train_party_heads

_STAGE = re.compile(r'^capc_stage_seconds_(sum|count)\{stage="([^"]+)"\} ([0-9.e+-]+)$', re.MULTILINE)

# -- central: one worker process per party --------------------------------------------------------------
_party: dict[str, Any] = {}


def _init_party(backbone: str, sha256: str, heads: str, threads: int) -> None:
    import torch

    # Each federation party is its own process session (``capc local`` starts them so); with the kernel's
    # session autogroups that decides its CPU share on a busy machine, so a central worker gets the same.
    os.setsid()
    from capc_common.learn.heads import HeadEnsemble
    from capc_common.models import load_backbone

    torch.set_num_threads(threads)
    _party["backbone"] = load_backbone(backbone, sha256=sha256)
    _party["heads"] = HeadEnsemble.load(heads)


def _party_votes(spec: dict[str, Any], classes: int) -> tuple[np.ndarray, float, float]:
    """One party's work on one batch: regenerate the queries, one backbone pass, every head, sum votes."""
    from capc_common.models import extract_features
    from capc_common.synth import SyntheticSpec

    t0 = time.perf_counter()
    query = SyntheticSpec.from_dict(spec)
    images = query.images()
    t1 = time.perf_counter()
    features = extract_features(_party["backbone"], images, bn_batch=query.bn_batch, mode="current")
    votes = vote_histogram(_party["heads"].predict(features), classes=classes)
    return votes, t1 - t0, time.perf_counter() - t1


def central_run(layout: Layout, config: FederationConfig, *, batches: int, threads: int) -> dict[str, Any]:
    """Label ``batches`` batches centrally (parties as worker processes, no protocol); returns figures."""
    names = config.teacher_names
    heads = [str(layout.party_dir(n) / "heads.safetensors") for n in names]
    # Fresh interpreters (spawn), like the federation's party processes: no state inherited from this one.
    context = multiprocessing.get_context("spawn")
    args = (config.backbone.name, config.backbone.sha256)
    pools = [
        ProcessPoolExecutor(1, mp_context=context, initializer=_init_party, initargs=(*args, h, threads))
        for h in heads
    ]
    noise, student_noise, m = SystemNoise(), SystemNoise(), config.mechanism
    starts, ends, generation, inference, aggregation = [], [], [], [], []
    try:
        for pool in pools:  # load every party's backbone and heads before timing
            pool.submit(time.sleep, 0).result()
        for k in range(batches):
            spec = batch_plan(
                config, first_index=k * config.queries.batch_size, count=config.queries.batch_size
            ).spec
            starts.append(time.perf_counter())
            futures = [pool.submit(_party_votes, spec.to_dict(), config.classes) for pool in pools]
            results = [f.result() for f in futures]
            t0 = time.perf_counter()
            hist = np.sum([r[0] for r in results], axis=0)
            z1, z2 = draw_confident_noise(
                noise, batch=spec.count, classes=config.classes, sigma1=m.sigma1, sigma2=m.sigma2
            )
            z1_s = draw_student_noise(student_noise, batch=spec.count, sigma1=m.sigma1)
            confident_rule(hist, threshold=m.threshold, z1=z1 + z1_s, z2=z2)
            aggregation.append(time.perf_counter() - t0)
            generation.append(max(r[1] for r in results))
            inference.append(max(r[2] for r in results))
            ends.append(time.perf_counter())
    finally:
        for pool in pools:
            pool.shutdown()
    size = config.queries.batch_size
    return {
        "labels_per_s": size * (batches - 1) / (ends[-1] - starts[1]),
        "stages": {
            "query_generation_s": statistics.mean(generation[1:]),
            "inference_s": statistics.mean(inference[1:]),
            "aggregation_s": statistics.mean(aggregation[1:]),
        },
    }


# -- federation ----------------------------------------------------------------------------------------
def _get(url: str, secret: str) -> Any:
    response = httpx.get(url, headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    response.raise_for_status()
    return response.json() if "json" in response.headers.get("content-type", "") else response.text


def _stage_means(metrics_text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for kind, stage, value in _STAGE.findall(metrics_text):
        (sums if kind == "sum" else counts)[stage] = float(value)
    return {f"{stage}_s": sums[stage] / counts[stage] for stage in sums if counts.get(stage)}


def federation_run(
    root: Path, options: LocalOptions, *, heads_from: Layout | None, say: Any
) -> dict[str, Any]:
    """Start a local federation, let it label every planned batch, collect its figures, stop it."""
    layout, config = ensure_provisioned(root, options)
    if heads_from is not None:
        for name in config.teacher_names:
            shutil.copy(
                heads_from.party_dir(name) / "heads.safetensors", layout.party_dir(name) / "heads.safetensors"
            )
    endpoints = up(root, options, say=say, ready_timeout=600)
    secret, guardian_secret = token(layout, config.student), token(layout, config.guardian)
    guardian = psutil.Process(endpoints["pids"][config.guardian])
    rss: list[float] = []
    seen = 0
    try:
        while True:
            progress = _get(endpoints["student"]["progress"], secret)
            done = progress["batches_done"]
            if done > seen:
                rss.extend([guardian.memory_info().rss / 2**20] * (done - seen))
                seen = done
            if progress["state"] not in ("starting", "labelling"):
                break
            time.sleep(0.2)
        if progress["error"]:
            raise click.ClickException(f"the federation failed: {progress['error']}")
        recent = progress["recent_batches"]
        student_metrics = _get(f"{endpoints['student']['admin']}/metrics", secret)
        guardian_metrics = _get(f"{endpoints['guardian']['admin']}/metrics", guardian_secret)
    finally:
        down(root)
    # From the opening of batch 2 (while batch 1 may still be in its 2PC) to the end of the last batch.
    labels = sum(b["count"] for b in recent[1:])
    return {
        "labels_per_s": labels / (recent[-1]["completed"] - recent[1]["completed"] + recent[1]["wall_s"]),
        "protocol_latency_s": statistics.median(b["protocol_s"] for b in recent[1:]),
        "batches": len(recent),
        "mpc_bytes_per_label": statistics.mean(b["mpc_bytes"] / b["count"] for b in recent[1:]),
        "per_batch": {
            "wall_s": statistics.mean(b["wall_s"] for b in recent[1:]),
            "slowest_party_model_work_s": statistics.mean(b["model_work_s"] for b in recent[1:]),
            "protocol_s": statistics.mean(b["protocol_s"] for b in recent[1:]),
        },
        "stages": {
            "student": _stage_means(student_metrics),
            "guardian": _stage_means(guardian_metrics),
        },
        "guardian_rss_mb": rss,
    }


def planned_heads(root: Path, options: LocalOptions) -> tuple[int, dict[str, Any]]:
    """Teachers per party as the planner proposes them for the parties' actual example counts.

    The counts are read from a probe federation provisioned with these options (the sites' own data
    sections: their hash part and fraction), so they are the examples each party will train on; only its
    site files are read (its one head per party and its noise just make it a valid federation).

    Returns:
        ``(the smallest proposal over the parties, {"examples": [...], "heads": [...]})``.
    """
    probe = dataclasses.replace(options, teachers_per_party=1, threshold=1.0, sigma1=1e3, sigma2=1e3)
    layout, config = ensure_provisioned(root, probe)
    examples = [len(party_examples(TeacherSettings.load(layout.site(n)))[1]) for n in config.teacher_names]
    plan = propose(examples, classes=config.classes, epsilon=options.epsilon, bn_batch=options.bn_batch)
    shutil.rmtree(root, ignore_errors=True)
    return min(plan["heads"]), {"examples": examples, "heads": plan["heads"]}


def _rss_summary(samples: list[float], *, warm_up: int) -> dict[str, Any]:
    """Guardian memory across batches: after ``warm_up`` batches, at the end, and the least-squares slope
    in between (buffers are sized by the first batches; what matters is growth after that)."""
    steady = samples[warm_up - 1 :]
    slope = float(np.polyfit(np.arange(len(steady), dtype=float), steady, 1)[0]) if len(steady) >= 2 else 0.0
    return {
        f"after_batch_{warm_up}": steady[0],
        "last": steady[-1],
        "batches": len(samples),
        "slope_mb_per_100_batches": 100 * slope,
    }


@click.command()
@click.option("--parties", type=click.IntRange(min=2), default=4, show_default=True)
@click.option(
    "--teachers-per-party",
    type=click.IntRange(min=1),
    default=None,
    help="Heads per party [default: what `capc federation plan` proposes for the parties' examples].",
)
@click.option("--batch-size", type=click.IntRange(min=16), default=1024, show_default=True)
@click.option("--batches", type=click.IntRange(min=2), default=5, show_default=True)
@click.option("--bn-batch", type=click.IntRange(min=16), default=64, show_default=True)
@click.option("--latency-batch", type=click.IntRange(min=16), default=256, show_default=True)
@click.option("--latency-batches", type=click.IntRange(min=3), default=12, show_default=True)
@click.option(
    "--memory-batches",
    type=click.IntRange(min=3),
    default=120,
    show_default=True,
    help="Batches of 64 queries in the guardian-memory run (memory is read after the first tenth).",
)
@click.option(
    "--train-limit",
    type=click.IntRange(min=1),
    default=2500,
    show_default=True,
    help="Examples/party (on average: each site keeps a hash-selected fraction).",
)
@click.option(
    "--threads", type=click.IntRange(min=1), default=1, show_default=True, help="torch threads/party."
)
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def main(
    parties: int,
    teachers_per_party: int | None,
    batch_size: int,
    batches: int,
    bn_batch: int,
    latency_batch: int,
    latency_batches: int,
    memory_batches: int,
    train_limit: int,
    threads: int,
    work_dir: Path | None,
    fmt: str,
) -> None:
    """Measure the federation against central labelling and print the figures."""

    def say(line: str) -> None:
        click.echo(line, err=True)

    root = Path(work_dir or tempfile.mkdtemp(prefix="capc-bench-federation-"))
    common = {
        "parties": parties,
        "epsilon": 1000.0,  # the benchmark measures speed; the budget must not stop it
        "bn_batch": bn_batch,
        "train_limit": train_limit,
        "torch_threads": threads,
        "evaluation_images": None,
        "min_parties": parties,
        "force": benchmark_force("throughput, latency and memory"),
    }
    plan: dict[str, Any] = {}
    if teachers_per_party is None:
        try:
            teachers_per_party, plan = planned_heads(root / "plan", LocalOptions(**common))
        except InputError as exc:
            raise click.ClickException(f"cannot plan the parties' teachers: {exc}") from None
        say(f"planned {teachers_per_party} heads per party for {plan['examples']} examples")
    common["teachers_per_party"] = teachers_per_party
    throughput = LocalOptions(**common, queries=batch_size * batches, batch_size=batch_size)
    latency = LocalOptions(
        **common, queries=latency_batch * latency_batches, batch_size=latency_batch, pipeline_depth=0
    )
    memory = LocalOptions(**{**common, "bn_batch": 32}, queries=64 * memory_batches, batch_size=64)
    start = time.monotonic()
    load_before = os.getloadavg()
    # Teacher heads are trained once (not timed) and shared by every measurement.
    layout, config = ensure_provisioned(root / "throughput", throughput, say=say)
    for name in config.teacher_names:
        if not (layout.party_dir(name) / "heads.safetensors").exists():
            say(train_party_heads(TeacherSettings.load(layout.site(name)))["summary"])
    say("central plaintext labelling (one worker process per party)")
    central = central_run(layout, config, batches=batches, threads=threads)
    say(f"  {central['labels_per_s']:.1f} labels/s")
    say("federation throughput run")
    fed = federation_run(root / "throughput", throughput, heads_from=None, say=say)
    say(f"  {fed['labels_per_s']:.1f} labels/s")
    say(f"federation latency run ({latency_batch}-query batches, one at a time)")
    lat = federation_run(root / "latency", latency, heads_from=layout, say=say)
    say(f"  protocol latency {lat['protocol_latency_s']:.3f} s")
    say(f"guardian memory run ({memory_batches} batches of 64 queries)")
    mem = federation_run(root / "memory", memory, heads_from=layout, say=say)
    warm_up = max(1, min(10, memory_batches // 10))
    rss = _rss_summary(mem["guardian_rss_mb"], warm_up=warm_up)
    say(f"  guardian RSS {rss[f'after_batch_{warm_up}']:.1f} → {rss['last']:.1f} MB")
    result = {
        "federation_labels_per_s": fed["labels_per_s"],
        "central_labels_per_s": central["labels_per_s"],
        "ratio": fed["labels_per_s"] / central["labels_per_s"],
        f"protocol_latency_{latency_batch}_s": lat["protocol_latency_s"],
        "stages": {
            "central": central["stages"],
            "federation": {**fed["per_batch"], **fed["stages"]},
            "latency_run": {**lat["per_batch"], **lat["stages"]},
        },
        "mpc_bytes_per_label": fed["mpc_bytes_per_label"],
        "guardian_rss_mb": rss,
        "setup": {
            "parties": parties,
            "teachers_per_party": teachers_per_party,
            "planned": plan or None,
            "train_limit": train_limit,
            "classes": config.classes,
            "batch_size": batch_size,
            "batches": batches,
            "bn_batch": bn_batch,
            "latency_batch": latency_batch,
            "latency_batches": latency_batches,
            "memory_batches": memory_batches,
            "backbone": config.backbone.name,
            "torch_threads_per_party": threads,
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before[0],
            "load_average_after": os.getloadavg()[0],
            "seconds": round(time.monotonic() - start, 1),
        },
    }
    if work_dir is None:
        shutil.rmtree(root, ignore_errors=True)
    if fmt == "json":
        click.echo(json.dumps(result))
        return
    click.echo(
        f"federation {result['federation_labels_per_s']:.1f} labels/s vs central "
        f"{result['central_labels_per_s']:.1f} labels/s: ratio {result['ratio']:.3f} (target ≥ 0.8)\n"
        f"protocol latency of a {latency_batch}-query batch: {lat['protocol_latency_s']:.3f} s "
        "(target ≤ 0.5 s)\n"
        f"guardian RSS: {rss[f'after_batch_{warm_up}']:.1f} MB after batch {warm_up}, "
        f"{result['guardian_rss_mb']['last']:.1f} MB after batch {result['guardian_rss_mb']['batches']} "
        f"(slope {result['guardian_rss_mb']['slope_mb_per_100_batches']:+.2f} MB / 100 batches)\n"
        f"stages: {json.dumps(result['stages'], indent=1)}\n"
        f"load average {load_before[0]:.1f} → {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    sys.exit(main())
