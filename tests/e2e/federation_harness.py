"""End-to-end harness: the central reference config, the mirrored federation, and a started federation."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from protocol_force import protocol_force

from capc_common.federation import FederationConfig
from capc_common.learn.heads import HeadEnsemble
from capc_services.local.federation import down, ensure_provisioned, token, up
from capc_services.local.layout import Layout
from capc_services.local.provision import LocalOptions

PARTIES, HEADS = 3, 3
NOISE_SEED = "e2e-differential"
# Small enough to run in seconds, large enough for the budget to end the stream (9 teachers, noisy votes).
CENTRAL = {
    "name": "e2e",
    "seed": 0,
    "dataset": {"name": "fashion-mnist", "train_limit": PARTIES * HEADS * 64, "test_limit": 64},
    "teachers": {"count": PARTIES * HEADS},
    "backbone": {"name": "scatter-28x28x1", "bn_batch": 32},
    "queries": {"generator": "dead_leaves", "seed": 5, "batch_size": 64, "max_queries": 256},
    "mechanism": {"threshold": 5, "sigma1": 3, "sigma2": 2.5, "noise_seed": NOISE_SEED},
    "budget": {"epsilon": 300.0, "delta": 1e-5, "order": 10},
    "student": {"eval_bn_batch": 32, "curve_points": 1, "pseudo_labels": False},
    "plots": False,
    "save_teachers": True,
}


def federation_options(**overrides: Any) -> LocalOptions:
    """The local federation that mirrors :data:`CENTRAL` (same queries, mechanism, budget, noise seed)."""
    q, m, b = CENTRAL["queries"], CENTRAL["mechanism"], CENTRAL["budget"]
    base = LocalOptions(
        parties=PARTIES,
        teachers_per_party=HEADS,
        dataset="fashion-mnist",
        epsilon=b["epsilon"],
        delta=b["delta"],
        order=b["order"],
        queries=q["max_queries"],
        batch_size=q["batch_size"],
        bn_batch=CENTRAL["backbone"]["bn_batch"],
        threshold=m["threshold"],
        sigma1=m["sigma1"],
        sigma2=m["sigma2"],
        min_parties=PARTIES,
        generator=q["generator"],
        seed=q["seed"],
        backbone=CENTRAL["backbone"]["name"],
        insecure_noise_seed=NOISE_SEED,
        evaluation_images=None,
        vote_deadline_s=30,
        share_deadline_s=15,
        force=protocol_force("mechanics end to end"),
    )
    return LocalOptions(**{**base.__dict__, **overrides})


def install_heads(layout: Layout, config: FederationConfig, teachers: Path) -> None:
    """Give party p the central run's heads [p·K, (p+1)·K): the federation then votes exactly as it did."""
    ensemble = HeadEnsemble.load(teachers)
    start = 0
    for name in config.teacher_names:
        count = config.teacher(name).heads
        part = HeadEnsemble(
            ensemble.kind,
            {k: v[start : start + count].clone() for k, v in ensemble.params.items()},
            ensemble.classes,
        )
        part.save(layout.party_dir(name) / "heads.safetensors")
        start += count


class Running:
    """A started local federation and helpers to read it.

    Args:
        root: the state directory.
        options: the federation.
        teachers: the central run's heads to install (None: the parties need none, or train their own).
    """

    def __init__(self, root: Path, options: LocalOptions, teachers: Path | None) -> None:
        layout, config = ensure_provisioned(root, options)
        if teachers is not None:
            install_heads(layout, config, teachers)
        self.endpoints = up(root, options, ready_timeout=240)
        self.layout, self.config, self.root = layout, config, root
        self.token = token(layout)  # the guardian's
        self.student_token = token(layout, config.student)
        self.teacher_token = token(layout, config.teacher_names[0])

    def get(self, url: str, *, secret: str) -> Any:
        response = httpx.get(url, headers={"Authorization": f"Bearer {secret}"}, timeout=10)
        response.raise_for_status()
        return response.json()

    def progress(self) -> dict[str, Any]:
        return dict(self.get(self.endpoints["student"]["progress"], secret=self.student_token))

    def budget(self) -> dict[str, Any]:
        return dict(self.get(self.endpoints["guardian"]["budget"], secret=self.token))

    def wait(self, done: Callable[[dict[str, Any]], bool], *, timeout: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            progress = self.progress()
            if done(progress):
                return progress
            if progress["state"] == "failed" or time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-3000:] for p in self.layout.logs.glob("*.log")}
                raise AssertionError(
                    f"federation did not get there: {progress}\n{json.dumps(logs, indent=1)}"
                )
            time.sleep(0.2)

    def labels(self) -> np.ndarray:
        """The labels in the student's store, in query order (−1: unanswered); checks none is missing."""
        db = sqlite3.connect(self.layout.party_dir("student") / "labels.sqlite")
        try:
            rows = db.execute("SELECT query_index, label FROM labels ORDER BY query_index").fetchall()
        finally:
            db.close()
        indices, labels = np.asarray(rows, dtype=np.int64).T
        np.testing.assert_array_equal(indices, np.arange(len(indices)))
        return labels

    def close(self) -> None:
        down(self.root)
