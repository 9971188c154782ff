"""The federation across real, shaped, failing links and disks: the short versions of ``benchmarks/wan.py``
and ``benchmarks/chaos.py --faults network,disk``, on one lab federation (``capc_services.lab``): every
party a real process in its own network namespace behind a proxied link, the guardian's ledger and the
student's label store each on a small volume of its own.

Namespaces need root; where the lab cannot make them it runs the parties on loopback behind the same proxies
(and says so) — except under ``CI=true``, which expects them (``require``). The volumes need root too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from capc_services.lab import netns
from capc_services.lab.federation import LabFederation
from capc_services.lab.volumes import mounts_allowed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import wan  # the WAN benchmark's measurements
from _faults import VOLUME_BYTES, FaultCampaign
from chaos import campaign_options  # the chaos benchmark's federation

pytestmark = pytest.mark.slow
#: Batches each row measures at least: few enough to be quick, enough that a batch cut off at either end of
#: the window moves a per-batch figure by a third at most.
BATCHES = 6
Require = Callable[[bool, str], None]


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory, require: Require) -> Iterator[LabFederation]:
    require(mounts_allowed(), "the ledger's and the label store's volumes are tmpfs mounts: root is needed")
    permitted, why = netns.available()
    if os.environ.get("CI", "").strip().lower() == "true":
        require(permitted, why)
    # Two parties of one head each, a quorum of one: the smallest federation in which a teacher's link can
    # fail while the student goes on labelling.
    options = dataclasses.replace(campaign_options(), parties=2, teachers_per_party=1, min_parties=1)
    running = LabFederation(
        tmp_path_factory.mktemp("links") / "state",
        options,
        volumes={"ledger": VOLUME_BYTES, "store": VOLUME_BYTES},
        ready_timeout=300,
    )
    try:
        yield running
    finally:
        running.close()


def test_the_wan_benchmarks_short_version(fed: LabFederation) -> None:
    """Labels per second and the counted round trips of a batch, on loopback and at 80 ms / 100 Mbit/s: the
    rows' figures well formed and consistent with what the parties counted (speed targets are the benchmark's
    to report, not this test's to assert)."""
    assert fed.lab is not None and (fed.lab.mode == "namespaces" or fed.lab.note)
    loopback = wan.measure_selection(fed, rtt_ms=0.0, mbit=None, window=1.0, min_batches=BATCHES)
    far = wan.measure_selection(fed, rtt_ms=80.0, mbit=100.0, window=1.0, min_batches=BATCHES)
    for row in (loopback, far):
        n, trips = row["batches"], row["round_trips"]
        assert n >= BATCHES, row
        guardian = trips["student_to_guardian"]
        # The window's counts, back from the per-batch figures (rounded to 3 decimals: a ratio of two rounded
        # figures is not the ratio of the counts — 84 turns over 28 batches opened read 2.897 / 0.966).
        opened, turns = round(guardian["OpenBatch"] * n), round(guardian["ComputeTurn"] * n)
        # The window cuts batches at both ends: the two-stage pipeline has at most two batches opened and not
        # yet stored, and one computed and not yet stored, at either end.
        assert abs(opened - n) <= 2, (n, trips)
        assert turns >= 3 * (n - 1), (n, trips)  # the Compute stream's three turns per batch, as counted
        assert round(trips["work_item_per_teacher"] * n) == pytest.approx(n, abs=2), (n, trips)
        assert round(trips["teacher_to_guardian"] * n) == pytest.approx(n, abs=2), (n, trips)
        # The critical path is the sum of its parts (each rounded to 3 decimals, the sum to 2).
        parts = sum(guardian.values()) + trips["work_item_per_teacher"] + trips["teacher_to_guardian"]
        assert trips["critical_path"] == pytest.approx(parts, abs=0.01), trips
        assert row["labels_per_s"] > 0 and row["bytes_per_label"] > 1000
    figures = wan.table(
        [(80.0, 100.0)],
        {(0.0, None): loopback, (80.0, 100.0): far},
        {(0.0, None): _release(0.05, 3.0), (80.0, 100.0): _release(0.2, 3.0)},
    )
    (row,) = figures["rows"]
    assert set(row) >= {"rtt_ms", "mbit_s", "labels_per_s", "release_s", "round_trips_per_batch",
                        "round_trips_per_release", "bytes_per_label"}  # fmt: skip
    assert row["round_trips_per_batch"] == far["round_trips"]["critical_path"]
    assert figures["loopback"]["round_trips_per_batch"] == loopback["round_trips"]["critical_path"]
    assert figures["labels_ratio_80ms"] == pytest.approx(far["labels_per_s"] / loopback["labels_per_s"], 1e-2)
    assert row["release_budget_s"] == pytest.approx(3 * 0.080 + 0.05)
    assert figures["release_target"] == {"80ms/100Mbit": True}  # 0.2 s within 3 RTT + the loopback release
    json.dumps(figures, allow_nan=False)  # what `--format json` prints: plain JSON, no NaN


def _release(seconds: float, trips: float) -> dict[str, object]:
    return {"release_s": seconds, "releases": 3, "round_trips": {"critical_path": trips}}


@pytest.mark.parametrize(
    ("kind", "target", "seconds"),
    [
        ("partition", "hospital-1->student", 3.0),
        ("reset", "student->guardian", 0.5),
        ("disk_full", "ledger", 3.0),
        ("read_only", "ledger", 3.0),
    ],
)
def test_the_fault_campaigns_short_version(
    fed: LabFederation, kind: str, target: str, seconds: float
) -> None:
    """One fault at a time: nothing lost or mis-charged, labelling resumes by itself, and a full or read-only
    ledger volume is refused precisely while the guardian serves its budget."""
    campaign = FaultCampaign(fed, rng=np.random.default_rng(0), resume_timeout=90, say=lambda _: None)
    injection = campaign.inject(kind, target, seconds)
    assert injection.resumed and injection.ledger_ok, injection
    assert (injection.lost, injection.mischarged, injection.half_written, injection.tracebacks) == (
        0,
        0,
        0,
        0,
    )
    if kind in ("disk_full", "read_only"):
        assert injection.reads_served, injection
        assert str(fed.volumes["ledger"].path) in injection.refusal, injection
        assert ("is full" if kind == "disk_full" else "is read-only") in injection.refusal
        assert "backup" not in injection.refusal and "DATA_LOSS" not in injection.refusal
