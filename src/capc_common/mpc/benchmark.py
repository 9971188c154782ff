"""``capc bench mpc``: the garbler and the evaluator in two processes over a local (Unix) socket.

The parent draws synthetic vote histograms (a seeded, non-secret generator: these are benchmark inputs),
shares them exactly as teacher parties would (``share_votes``, fresh ``os.urandom`` seeds), draws benchmark
noise (rounded Gaussians from the same seeded generator, *not* a privacy mechanism; the parties' real noise
comes from the privacy package's discrete Gaussian sampler) and the plaintext answers. The guardian process
gets the seeds and its noise (z2 and its part z1_g of the threshold noise), the student process the summed
shares and its part z1_s; each runs the real session code on a
``SocketChannel`` and reports its timings, traffic and peak RSS. Every label is checked against plaintext.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from capc_common.errors import InputError, UnavailableError
from capc_common.memory import keep_freed_memory
from capc_common.mpc.channel import SocketChannel
from capc_common.mpc.config import DEFAULT_TAILS, Mode, MpcConfig, noise_bound, ring_width
from capc_common.mpc.evaluator import EvaluatorSession
from capc_common.mpc.garbler import GarblerSession
from capc_common.mpc.plain import circuit_stats, reference_noisy_argmax
from capc_common.mpc.primitives import aes_blocks_per_second, transpose_bits
from capc_common.mpc.reveal import Reveal
from capc_common.mpc.sharing import share_votes, sum_shares

_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class _GuardianBatch:
    batch_id: str
    seeds: list[bytes]
    z2: np.ndarray
    z1: np.ndarray | None
    threshold: int | None


@dataclass(frozen=True)
class _StudentBatch:
    batch_id: str
    share_sum: np.ndarray
    z1_student: np.ndarray | None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _warm_up() -> None:
    """Load the numba kernel (compiled or from cache) before the clock starts."""
    transpose_bits(np.zeros((128, 8), dtype=np.uint8))


def _garbler_main(
    config: MpcConfig, batches: list[_GuardianBatch], path: str, ready: Any, results: Any
) -> None:
    keep_freed_memory()  # as the guardian's process does (capc_common.memory)
    try:
        _warm_up()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(_TIMEOUT_S)
        ready.put(True)
        sock, _ = listener.accept()
        listener.close()
        channel = SocketChannel(sock, timeout=_TIMEOUT_S)
        with GarblerSession(channel, config) as session:
            session.handshake()
            passes: list[np.ndarray] = []
            committed: list[Reveal] = []
            cpu0 = _cpu_s()
            for item in batches:
                passes.append(
                    session.run_batch(
                        item.batch_id,
                        seeds=item.seeds,
                        shape=(item.z2.shape[0], config.classes),
                        z2=item.z2,
                        z1=item.z1,
                        threshold=item.threshold,
                        commit=committed.append,
                    )
                )
            cpu = _cpu_s() - cpu0
        report = {"pass_bits": passes, "commits": len(committed), "cpu": cpu, "rss": _peak_rss_mb()}
        results.put(("garbler", report))
    except Exception as exc:  # reported to the parent, which raises it there
        results.put(("garbler", {"error": f"{type(exc).__name__}: {exc}"}))


def _evaluator_main(config: MpcConfig, batches: list[_StudentBatch], path: str, results: Any) -> None:
    keep_freed_memory()  # as the student's process does (capc_common.memory)
    try:
        _warm_up()
        channel = SocketChannel.connect_unix(path, timeout=_TIMEOUT_S)
        with EvaluatorSession(channel, config) as session:
            start = time.perf_counter()
            session.handshake()
            setup_s = time.perf_counter() - start
            traffic0 = channel.bytes_sent + channel.bytes_received
            labels: list[np.ndarray] = []
            start, cpu0 = time.perf_counter(), _cpu_s()
            for item in batches:
                labels.append(
                    session.run_batch(item.batch_id, share_sum=item.share_sum, z1_student=item.z1_student)
                )
                results.put(("progress", len(labels)))
            seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu0
            traffic = channel.bytes_sent + channel.bytes_received - traffic0
        report = {
            "labels": labels,
            "seconds": seconds,
            "cpu": cpu,
            "setup_s": setup_s,
            "bytes": traffic,
            "rss": _peak_rss_mb(),
        }
        results.put(("evaluator", report))
    except Exception as exc:  # reported to the parent, which raises it there
        results.put(("evaluator", {"error": f"{type(exc).__name__}: {exc}"}))


def _synthetic_votes(
    rng: np.random.Generator, *, queries: int, classes: int, parties: list[int]
) -> list[np.ndarray]:
    """Per-party histograms sharing a per-query truth and agreement level, so about half the queries pass."""
    truth = rng.integers(0, classes, queries)
    agreement = rng.uniform(0.3, 1.0, queries)
    probs = np.repeat(((1 - agreement) / classes)[:, None], classes, axis=1)
    probs[np.arange(queries), truth] += agreement
    return [np.stack([rng.multinomial(size, p) for p in probs]).astype(np.int64) for size in parties]


def _benchmark_noise(
    rng: np.random.Generator, sigma: float, shape: tuple[int, ...], *, bound: int
) -> np.ndarray:
    """Rounded Gaussian benchmark inputs, clipped to ±min(12σ, what the ring holds)."""
    bound = min(bound, int(DEFAULT_TAILS * sigma))
    return np.clip(np.rint(rng.normal(0.0, sigma, shape)), -bound, bound).astype(np.int64)


def run_benchmark(
    *,
    classes: int,
    batch: int,
    batches: int = 3,
    width: int | None = None,
    threshold: bool = True,
    teachers: int = 250,
    parties: int = 3,
    sigma1: float = 100.0,
    sigma2: float = 40.0,
    threshold_value: int = 170,
    chunk_queries: int | None = None,
    seed: int = 0,
    progress: Callable[[Iterator[int]], Iterator[int]] | None = None,
) -> dict[str, Any]:
    """Run ``batches`` batches of ``batch`` queries between two processes and report throughput.

    Args:
        classes: c.
        batch: queries per batch B.
        batches: batches K in the session (base OT once, then K batches are timed).
        width: ring width; default :func:`ring_width` of the noise parameters.
        threshold: Confident-GNMax (True) or GNMax (False).
        teachers: teachers in the federation (split over ``parties`` teacher parties).
        parties: teacher parties, i.e. share seeds per batch.
        sigma1: threshold noise σ1 of the benchmark inputs.
        sigma2: argmax noise σ2.
        threshold_value: threshold T.
        chunk_queries: override the session's chunk size.
        seed: seed of the synthetic (non-secret) votes and benchmark noise.
        progress: wraps the iterator of completed batches (e.g. a progress bar).

    Returns:
        The figures described in docs/mpc.md, including ``correct`` (every label equals plaintext).
    """
    if classes < 2 or batch < 1 or batches < 1 or parties < 1 or teachers < parties:
        raise InputError(
            f"bench mpc needs classes ≥ 2, batch ≥ 1, batches ≥ 1 and teachers ≥ parties ≥ 1; got classes="
            f"{classes}, batch={batch}, batches={batches}, teachers={teachers}, parties={parties}."
        )
    mode: Mode = "confident" if threshold else "gnmax"
    if width is None:
        width = ring_width(
            teachers=teachers,
            sigma2=sigma2,
            sigma1=sigma1 if threshold else None,
            threshold=threshold_value if threshold else None,
        )
    half = 1 << (width - 1)
    # The student's threshold noise gets its usual bound, or half of what a narrower --width leaves.
    student_bound = min(noise_bound(sigma1), max(0, (half - 1 - teachers) // 2)) if threshold else None
    room = student_bound or 0
    bound2 = half - 1 - teachers - room  # V + z2 + z1_s must stay below 2^{w−1}
    bound1 = min(half - room - threshold_value, half - 1 - teachers - room + threshold_value)  # V + z1 − T
    if bound2 < 0 or (threshold and bound1 < 0):
        raise InputError(
            f"a {width}-bit ring cannot hold {teachers} votes and T = {threshold_value}; widen it."
        )
    config = MpcConfig(
        classes,
        width,
        teachers=teachers,
        mode=mode,
        student_noise=student_bound,
        chunk_queries=chunk_queries,
    )
    stats = circuit_stats(config)
    aes_rate = aes_blocks_per_second()

    rng = np.random.default_rng(seed)
    party_sizes = [len(g) for g in np.array_split(np.arange(teachers), parties)]
    guardian, student, expected = [], [], []
    for k in range(batches):
        per_party = _synthetic_votes(rng, queries=batch, classes=classes, parties=party_sizes)
        shares = [share_votes(v, width=width) for v in per_party]
        z2 = _benchmark_noise(rng, sigma2, (batch, classes), bound=bound2)
        z1 = _benchmark_noise(rng, sigma1, (batch,), bound=bound1) if threshold else None
        z1_student = _benchmark_noise(rng, sigma1, (batch,), bound=room) if threshold else None
        t_value = threshold_value if threshold else None
        guardian.append(_GuardianBatch(f"bench-{k}", [s for s, _ in shares], z2, z1, t_value))
        share_sum = sum_shares([x for _, x in shares], width=width)
        student.append(_StudentBatch(f"bench-{k}", share_sum, z1_student))
        expected.append(
            reference_noisy_argmax(
                np.sum(per_party, axis=0), z2=z2, z1=z1, z1_student=z1_student, threshold=t_value
            )
        )

    with tempfile.TemporaryDirectory(prefix="capc-bench-mpc-") as tmp:
        reports = _run_parties(config, guardian, student, os.path.join(tmp, "mpc.sock"), progress)
    ev, ga = reports["evaluator"], reports["garbler"]
    correct = all(np.array_equal(got, exp) for got, exp in zip(ev["labels"], expected, strict=True)) and all(
        np.array_equal(p, e >= 0) for p, e in zip(ga["pass_bits"], expected, strict=True)
    )
    total = batch * batches
    seconds = ev["seconds"]
    return {
        "classes": classes,
        "batch": batch,
        "batches": batches,
        "mode": mode,
        "width": width,
        "chunk_queries": config.queries_per_chunk,
        "labels_per_s": total / seconds,
        "and_gates_per_s": total * stats.and_gates / seconds,
        "and_gates_per_label": stats.and_gates,
        "and_layers": stats.and_layers,
        "bytes_per_label": ev["bytes"] / total,
        "aes_blocks_per_s": aes_rate,
        "garbler_peak_rss_mb": ga["rss"],
        "evaluator_peak_rss_mb": ev["rss"],
        "garbler_cpu_s": ga["cpu"],
        "evaluator_cpu_s": ev["cpu"],
        # The rate when each party has a core of its own: the busier party's CPU time bounds the pipeline.
        "and_gates_per_busy_s": total * stats.and_gates / max(ga["cpu"], ev["cpu"]),
        "load_average": os.getloadavg()[0],
        "answered_fraction": float(np.mean([np.mean(e >= 0) for e in expected])),
        "seconds": seconds,
        "session_setup_s": ev["setup_s"],
        "correct": bool(correct and ga["commits"] == batches),
    }


def _run_parties(
    config: MpcConfig,
    guardian: list[_GuardianBatch],
    student: list[_StudentBatch],
    path: str,
    progress: Callable[[Iterator[int]], Iterator[int]] | None,
) -> dict[str, dict[str, Any]]:
    """Start both processes, relay progress, collect their reports (raising if either failed)."""
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    garbler = ctx.Process(target=_garbler_main, args=(config, guardian, path, ready, results), daemon=True)
    garbler.start()
    try:
        ready.get(timeout=_TIMEOUT_S)
    except Exception as exc:
        garbler.kill()
        raise UnavailableError("the garbler process did not start listening.") from exc
    evaluator = ctx.Process(target=_evaluator_main, args=(config, student, path, results), daemon=True)
    evaluator.start()
    reports: dict[str, dict[str, Any]] = {}

    def _completed() -> Iterator[int]:
        while len(reports) < 2:
            who, payload = results.get(timeout=_TIMEOUT_S)
            if who == "progress":
                yield payload
            else:
                reports[who] = payload
                if "error" in payload:
                    return

    for _ in (progress or (lambda it: it))(_completed()):
        pass
    for proc in (garbler, evaluator):
        proc.join(timeout=10 if len(reports) == 2 else 1)
        if proc.is_alive():
            proc.kill()
    errors = [f"{who}: {r['error']}" for who, r in reports.items() if "error" in r]
    if errors or len(reports) < 2:
        raise UnavailableError(
            "bench mpc failed: " + ("; ".join(errors) or "a party exited without a report.")
        )
    return reports
