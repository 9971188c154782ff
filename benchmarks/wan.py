"""The federation across shaped links: labels per second, seconds per release and the round trips behind them.

Usage: ``.venv/bin/python benchmarks/wan.py --format json [--smoke] [--window 20] [--namespaces auto]``.
With ``--format json`` it prints one object: ``rows`` (one per round-trip time × bandwidth, each with
``rtt_ms``, ``mbit_s``, ``labels_per_s``, ``release_s``, ``round_trips_per_batch``,
``round_trips_per_release``, ``bytes_per_label``, the ratio to loopback and the counted round trips by
link), ``loopback`` (no delay, no cap: measured before and after the shaped rows, the faster kept),
``labels_ratio_80ms`` (labels/s at 80 ms and 100 Mbit/s over loopback: the median of ``labels_pairs_80ms``,
each pair measured back to back so that the shared machine's load cancels), ``release_overhead_80ms_s`` and
``release_target_80ms`` (a release's time at 80 ms minus its loopback time beside it — its compute — against
3 RTT, from ``release_pairs_80ms``), ``release_target`` (each row against 3 RTT + the faster loopback
release), ``lab`` (namespaces or the loopback fallback, and why) and ``config``.

Two local federations of three teacher parties each run as real processes, every party in its own network
namespace behind the lab's links (``capc_services.lab``: a veth pair per party, ``tc tbf`` for the bandwidth
of its access link, a userspace proxy per link for the one-way delay this kernel cannot add): a selection
federation (Confident-GNMax, batches of 64) and a release federation (secure-aggregation DP-SGD). Each row
shapes every link of the running federations (RTT = twice the proxy's one-way delay; the cap on every party's
uplink and downlink), lets one batch or release pass, and then measures:

* ``labels_per_s``: queries labelled per second (answered or not) over at least ``--window`` seconds, from the
  student's label store;
* ``release_s``: the median interval between releases journaled by the student;
* round trips, **counted** by the parties themselves (``capc_round_trips_total`` on their ``/metrics``: each
  call a party makes to a peer, each turn of a stream), per batch and per release. A batch's critical path is
  the student's calls and turns to the guardian (OpenBatch, the 2PC's turns), one work item out to the
  teachers and back (in parallel over the teachers) and, nested in it, each teacher's seed to the guardian. A
  release's is the student's Release call, plus half of a teacher's long poll (only its answer is on the
  path) and half of its share delivery (only its request is): the seed goes to the guardian beside the share
  and the student's deposit in the background, both off the path (counted, by call, beside it);
* ``bytes_per_label``: every byte the proxies carried (TLS records both ways, all links) over the labels.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import click
from _force import benchmark_force
from _lab import NAMESPACES, namespaces_option

from capc_services.lab.federation import LabFederation
from capc_services.local.provision import LocalOptions

ROWS = tuple((rtt, mbit) for rtt in (0.0, 20.0, 80.0, 200.0) for mbit in (10.0, 100.0))
SMOKE_ROWS = ((80.0, 100.0),)
WARM_UP = 5
"""Batches (and releases) before the first row: process warm-up, the base OT, the first caches."""
PAIRS = 3
"""Back-to-back loopback and 80 ms measurements the two targets are taken from."""
RELEASE_FLOOR_S = 0.02
"""No release is faster than this (loopback on a shared 2-core machine: 0.03-0.05 s, two round trips)."""
ROW_OVERHEAD_S = 5.0
"""Seconds a row spends beside the releases it times: shaping the links, waiting for the first release over
them, reading every party's counters, polling. The student releases back to back all the while, so a row
uses up to ``ROW_OVERHEAD_S / RELEASE_FLOOR_S`` releases more than it times: the plan is sized for that (a
plan of the releases timed plus a few ran out at loopback speed, and the benchmark waited for releases that
the finished plan would never make)."""
Say = Callable[[str], None]


def selection_options(*, smoke: bool) -> LocalOptions:
    """Three teacher parties, batches of 64 (the default of ``capc local up``), noise large enough that the
    budget outlasts the benchmark (speed is measured, not utility)."""
    return LocalOptions(
        parties=3,
        teachers_per_party=2 if smoke else 5,
        epsilon=1000.0,
        queries=64 * 20_000,
        batch_size=64,
        bn_batch=64,
        threshold=3.0,
        sigma1=80.0,
        sigma2=80.0,
        min_parties=2,
        train_limit=200 if smoke else 500,
        evaluation_images=None,
        backbone="scatter-28x28x1" if smoke else None,
        generator="dead_leaves" if smoke else None,
        torch_threads=1,
        force=benchmark_force("selection over a WAN"),
    )


def release_options(*, smoke: bool, rounds: int) -> LocalOptions:
    """Three teacher parties of secure-aggregation DP-SGD with enough rounds for every row (ε large enough
    to pay for them: speed is measured, not utility)."""
    return LocalOptions(
        parties=3,
        mechanism="secagg-dpsgd",
        epsilon=10_000.0,
        min_parties=2,
        train_limit=200,
        evaluation_images=None,
        backbone="scatter-28x28x1" if smoke else None,
        torch_threads=1,
        force=benchmark_force("releases over a WAN"),
        mechanism_params={
            "rounds": rounds,
            "noise_multiplier": 1.5,
            "sampling_rate": 0.25,
            "projection": {"dim": 32, "images": 200},
        },
    )


def release_rounds(rows: Sequence[tuple[float, float]], *, per_row: int) -> int:
    """The release federation's plan: the warm-up, then for every measurement (the loopback row twice, the
    shaped rows, the pairs) the releases it times and those made meanwhile (:data:`ROW_OVERHEAD_S`)."""
    measurements = len(rows) + 2 + 2 * PAIRS
    return WARM_UP + measurements * (per_row + round(ROW_OVERHEAD_S / RELEASE_FLOOR_S))


def _sum(counts: dict[tuple[str, str], float], before: dict[tuple[str, str], float], **match: str) -> float:
    return sum(
        n - before.get(key, 0.0)
        for key, n in counts.items()
        if all(dict(zip(("peer", "call"), key, strict=True))[k] == v for k, v in match.items())
    )


def _snapshot(fed: LabFederation) -> dict[str, Any]:
    """Every party's round-trip counters and every link's bytes, now."""
    assert fed.lab is not None
    parties = [fed.config.student, *fed.config.teacher_names]
    return {
        "time": time.monotonic(),
        "trips": {p: fed.round_trips(p) for p in parties},
        "bytes": sum(sum(fed.lab.stats(link)["bytes"]) for link in fed.lab.links),
    }


def _per(n: int, value: float) -> float:
    return round(value / n, 3) if n else float("nan")


def _calls(
    counts: dict[tuple[str, str], float], before: dict[tuple[str, str], float], n: int, *, peer: str
) -> dict[str, float]:
    """One party's calls to ``peer`` per batch or release (``n`` of them), by call."""
    return {call: _per(n, _sum(counts, before, peer=peer, call=call)) for to, call in counts if to == peer}


def _batch_trips(
    fed: LabFederation, start: dict[str, Any], end: dict[str, Any], batches: int
) -> dict[str, Any]:
    """The counted round trips per batch, by link, and the critical path they make."""
    student, teachers = fed.config.student, fed.config.teacher_names
    s1, s0 = end["trips"][student], start["trips"][student]
    guardian = _calls(s1, s0, batches, peer="guardian")
    work = _per(batches, _sum(s1, s0, peer="teacher")) / len(teachers)
    seeds = statistics.mean(
        _per(batches, _sum(end["trips"][t], start["trips"][t], peer="guardian")) for t in teachers
    )
    return {
        "critical_path": round(sum(guardian.values()) + work + seeds, 2),
        "student_to_guardian": guardian,
        "work_item_per_teacher": round(work, 3),
        "teacher_to_guardian": round(seeds, 3),
    }


def _release_trips(
    fed: LabFederation, start: dict[str, Any], end: dict[str, Any], releases: int
) -> dict[str, Any]:
    """The counted round trips per release, by link, and the critical path they make."""
    student, teachers = fed.config.student, fed.config.teacher_names
    s1, s0 = end["trips"][student], start["trips"][student]
    guardian = _calls(s1, s0, releases, peer="guardian")
    per_teacher = {
        call: statistics.mean(
            _per(releases, _sum(end["trips"][t], start["trips"][t], call=call)) for t in teachers
        )
        for call in ("NextRelease", "SubmitContribution", "SubmitContributionShare")
    }
    answered, shared = per_teacher["NextRelease"], per_teacher["SubmitContributionShare"]
    path = guardian.get("Release", 0.0) + (answered + shared) / 2
    return {
        "critical_path": round(path, 2),
        "student_to_guardian": guardian,
        "per_teacher": {k: round(v, 3) for k, v in per_teacher.items()},
    }


def _done_batches(fed: LabFederation) -> list[tuple[str, int, float]]:
    with sqlite3.connect(f"file:{fed.store}?mode=ro", uri=True, timeout=30) as db:
        rows = db.execute(
            "SELECT batch_id, count, updated FROM batches WHERE state = 'done' ORDER BY updated"
        )
        return [(str(b), int(c), float(u)) for b, c, u in rows]


def _totals(fed: LabFederation) -> list[Path]:
    """The student's journaled totals (not the halves it keeps before)."""
    return list(fed.store.parent.glob("releases-*/*.total.npy"))


def _journal(fed: LabFederation) -> list[float]:
    """The times the student journaled each release's total, in order."""
    return sorted(path.stat().st_mtime for path in _totals(fed))


def _released(fed: LabFederation) -> int:
    """How many releases the student journaled (what the waits poll: no file is read)."""
    return len(_totals(fed))


def _wait(
    condition: Callable[[], bool], *, timeout: float, what: str, ended: Callable[[], bool] = lambda: False
) -> None:
    """Until ``condition()``; a precise error after ``timeout`` seconds, or at once when ``ended()`` says it
    never will be (the federation finished its plan)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if ended() and not condition():
            raise click.ClickException(f"waiting for {what}: the federation finished its plan first")
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


def measure_selection(
    fed: LabFederation, *, rtt_ms: float, mbit: float | None, window: float, min_batches: int = 3
) -> dict[str, Any]:
    """One row of the selection path: shape the links, let a batch pass, measure over ``window`` seconds."""
    assert fed.lab is not None
    fed.lab.shape(rtt_ms=rtt_ms, mbit=mbit)
    first = len(_done_batches(fed))
    _wait(lambda: len(_done_batches(fed)) > first, timeout=300, what="a batch over the new links")
    before, start = _done_batches(fed), _snapshot(fed)
    _wait(
        lambda: (
            time.monotonic() - start["time"] >= window
            and len(_done_batches(fed)) - len(before) >= min_batches
        ),
        timeout=window + 600,
        what=f"{min_batches} batches at {rtt_ms:g} ms",
    )
    after, end = _done_batches(fed), _snapshot(fed)
    new = after[len(before) :]
    labels = sum(count for _, count, _ in new)
    # Labels of the batches done after the first timestamp, over the time between the first and last.
    span = new[-1][2] - before[-1][2]
    return {
        "labels_per_s": round(labels / span, 2),
        "batches": len(new),
        "round_trips": _batch_trips(fed, start, end, len(new)),
        "bytes_per_label": round((end["bytes"] - start["bytes"]) / labels, 1),
    }


def measure_releases(
    fed: LabFederation, *, rtt_ms: float, mbit: float | None, window: float, releases: int, planned: int
) -> dict[str, Any]:
    """One row of the release path: shape the links, let a release pass, then time the releases of
    ``window`` seconds (at least 3, at most ``releases``). ``planned``: the federation's releases (a wait
    ends with an error once they are all journaled)."""
    assert fed.lab is not None
    fed.lab.shape(rtt_ms=rtt_ms, mbit=mbit)
    first = _released(fed)

    def spent() -> bool:
        return _released(fed) >= planned

    _wait(lambda: _released(fed) > first, timeout=300, what="a release over the new links", ended=spent)
    before, start = _released(fed), _snapshot(fed)

    def enough() -> bool:
        done = _released(fed) - before
        return done >= releases or (done >= 3 and time.monotonic() - start["time"] >= window)

    _wait(enough, timeout=window + 600, what=f"3 releases at {rtt_ms:g} ms", ended=spent)
    times, end = _journal(fed), _snapshot(fed)
    gaps = [b - a for a, b in zip(times[before - 1 : -1], times[before:], strict=True)]
    return {
        "release_s": round(statistics.median(gaps), 3),
        "releases": len(gaps),
        "round_trips": _release_trips(fed, start, end, len(gaps)),
    }


def _both(first: dict[str, Any], again: dict[str, Any], key: str) -> dict[str, Any]:
    """The loopback row measured before and after the shaped rows: the faster of the two (a process still
    warming up must not flatter the shaped rows' ratios), and both."""
    runs = [first[key], again[key]]
    best = max(runs) if key == "labels_per_s" else min(runs)
    return {**(first if best == first[key] else again), key: best, f"{key}_runs": runs}


def run(
    *, smoke: bool, window: float, namespaces: bool | None, state_dir: Path | None, say: Say
) -> dict[str, Any]:
    """Both federations across every row; returns the benchmark's JSON object."""
    rows = SMOKE_ROWS if smoke else ROWS
    root = state_dir or Path(tempfile.mkdtemp(prefix="capc-wan-"))
    per_row = 10 if smoke else 50  # releases timed per row, at most
    result: dict[str, Any] = {"config": {"smoke": smoke, "window_s": window}}
    say("selection federation (Confident-GNMax, batches of 64, 3 teacher parties)")
    selection: dict[tuple[float, float | None], dict[str, Any]] = {}
    fed = LabFederation(root / "selection", selection_options(smoke=smoke), namespaces=namespaces, say=say)
    try:
        assert fed.lab is not None
        result["lab"] = {"mode": fed.lab.mode, "note": fed.lab.note, "links": sorted(fed.lab.links)}
        # Warm up first (the base OT, the first batches' caches): the loopback row is steady state too.
        _wait(lambda: len(_done_batches(fed)) >= WARM_UP, timeout=600, what="the first batches")
        for rtt, mbit in ((0.0, None), *rows):
            selection[(rtt, mbit)] = measure_selection(fed, rtt_ms=rtt, mbit=mbit, window=window)
            say(f"  {rtt:g} ms, {mbit or '∞'} Mbit/s: {selection[(rtt, mbit)]['labels_per_s']} labels/s")
        again = measure_selection(fed, rtt_ms=0.0, mbit=None, window=window)  # loopback before and after
        say(f"  0 ms again: {again['labels_per_s']} labels/s")
        selection[(0.0, None)] = _both(selection[(0.0, None)], again, "labels_per_s")
        pairs = []
        for _ in range(
            PAIRS
        ):  # loopback and 80 ms / 100 Mbit/s back to back: the shared machine's load cancels
            near = measure_selection(fed, rtt_ms=0.0, mbit=None, window=window)["labels_per_s"]
            far = measure_selection(fed, rtt_ms=80.0, mbit=100.0, window=window)["labels_per_s"]
            pairs.append((near, far))
            say(f"  pair: {near} labels/s on loopback, {far} at 80 ms")
        result["labels_pairs_80ms"] = pairs
    finally:
        fed.close()
    say("release federation (secure-aggregation DP-SGD, 3 teacher parties)")
    releases: dict[tuple[float, float | None], dict[str, Any]] = {}
    options = release_options(smoke=smoke, rounds=release_rounds(rows, per_row=per_row))
    fed = LabFederation(root / "releases", options, namespaces=namespaces, say=say)
    try:
        _wait(lambda: _released(fed) >= WARM_UP, timeout=600, what="the first releases")
        planned = int(fed.get(fed.config.student, "/api/v1/progress")["rounds"])
        measure = partial(measure_releases, fed, window=window, releases=per_row, planned=planned)
        for rtt, mbit in ((0.0, None), *rows):
            releases[(rtt, mbit)] = measure(rtt_ms=rtt, mbit=mbit)
            say(f"  {rtt:g} ms, {mbit or '∞'} Mbit/s: {releases[(rtt, mbit)]['release_s']} s per release")
        again = measure(rtt_ms=0.0, mbit=None)
        say(f"  0 ms again: {again['release_s']} s per release")
        releases[(0.0, None)] = _both(releases[(0.0, None)], again, "release_s")
        pairs = []
        for _ in range(PAIRS):
            near = measure(rtt_ms=0.0, mbit=None)["release_s"]
            far = measure(rtt_ms=80.0, mbit=100.0)["release_s"]
            pairs.append((near, far))
            say(f"  pair: {near} s per release on loopback, {far} at 80 ms")
        result["release_pairs_80ms"] = pairs
    finally:
        fed.close()
    figures = table(rows, selection, releases)
    # The targets, from the back-to-back pairs (medians): labels/s at 80 ms over loopback; a release's time
    # at 80 ms minus the same federation's loopback time (its compute, measured beside it) against 3 RTT.
    figures["labels_ratio_80ms"] = round(statistics.median(f / n for n, f in result["labels_pairs_80ms"]), 3)
    overhead = statistics.median(f - n for n, f in result["release_pairs_80ms"])
    figures["release_overhead_80ms_s"] = round(overhead, 3)
    figures["release_target_80ms"] = overhead <= 3 * 0.080
    return {**result, **figures}


def table(
    rows: Sequence[tuple[float, float]],
    selection: dict[tuple[float, float | None], dict[str, Any]],
    releases: dict[tuple[float, float | None], dict[str, Any]],
) -> dict[str, Any]:
    """The benchmark's figures from each row's measurements (the loopback row under ``(0.0, None)``)."""
    result: dict[str, Any] = {"rows": []}
    loop_s, loop_r = selection[(0.0, None)], releases[(0.0, None)]
    result["loopback"] = {
        "labels_per_s": loop_s["labels_per_s"],
        "labels_per_s_runs": loop_s.get("labels_per_s_runs", [loop_s["labels_per_s"]]),
        "release_s": loop_r["release_s"],
        "release_s_runs": loop_r.get("release_s_runs", [loop_r["release_s"]]),
        "round_trips_per_batch": loop_s["round_trips"]["critical_path"],
        "round_trips_per_release": loop_r["round_trips"]["critical_path"],
        "bytes_per_label": loop_s["bytes_per_label"],
    }
    for rtt, mbit in rows:
        s, r = selection[(rtt, mbit)], releases[(rtt, mbit)]
        result["rows"].append(
            {
                "rtt_ms": rtt,
                "mbit_s": mbit,
                "labels_per_s": s["labels_per_s"],
                "release_s": r["release_s"],
                "round_trips_per_batch": s["round_trips"]["critical_path"],
                "round_trips_per_release": r["round_trips"]["critical_path"],
                "bytes_per_label": s["bytes_per_label"],
                "labels_ratio": round(s["labels_per_s"] / loop_s["labels_per_s"], 3),
                "release_budget_s": round(3 * rtt / 1000 + loop_r["release_s"], 3),
                "batch_round_trips": s["round_trips"],
                "release_round_trips": r["round_trips"],
            }
        )
    at80 = [row for row in result["rows"] if row["rtt_ms"] == 80.0]
    best = max(at80, key=lambda row: row["mbit_s"] or 0.0)
    result["labels_ratio_80ms"] = best["labels_ratio"]  # the run's run() replaces it by the paired median
    result["labels_ratio_80ms_mbit_s"] = best["mbit_s"]
    result["release_target"] = {
        f"{row['rtt_ms']:g}ms/{row['mbit_s']:g}Mbit": row["release_s"] <= row["release_budget_s"]
        for row in result["rows"]
    }
    return result


@click.command()
@click.option("--smoke", is_flag=True, help="One shaped row and short windows (the suite's version).")
@click.option("--window", type=float, default=None, help="Seconds each row measures (default 20, smoke 4).")
@namespaces_option
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def main(smoke: bool, window: float | None, namespaces: str, state_dir: Path | None, fmt: str) -> None:
    """Measure the federation across shaped links: labels/s, seconds per release, counted round trips."""
    result = run(
        smoke=smoke,
        window=window if window is not None else (4.0 if smoke else 20.0),
        namespaces=NAMESPACES[namespaces],
        state_dir=state_dir,
        say=lambda line: click.echo(line, err=True),
    )
    if fmt == "json":
        click.echo(json.dumps(result))
        return
    if result["lab"]["note"]:
        click.echo(f"note: {result['lab']['note']}")
    columns = ("rtt_ms", "mbit_s", "labels_per_s", "labels_ratio", "release_s", "round_trips_per_batch",
               "round_trips_per_release", "bytes_per_label")  # fmt: skip
    click.echo(" ".join(f"{c:>12}" for c in columns))
    loopback = {"rtt_ms": 0, "mbit_s": "∞", "labels_ratio": 1, **result["loopback"]}
    for row in (loopback, *result["rows"]):
        click.echo(" ".join(f"{row[c]:>12}" for c in columns))
    click.echo(f"labels_ratio_80ms {result['labels_ratio_80ms']} (target ≥ 0.5)")


if __name__ == "__main__":
    sys.exit(main())
