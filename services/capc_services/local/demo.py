"""``capc demo``: the whole product in a few minutes — a local federation spends its privacy budget, the
student is trained and published, the budget is read back over the guardian's REST API, and everything is
shut down again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capc_common.errors import ProtocolError, UnavailableError
from capc_services.local.federation import down, prepare, token, up
from capc_services.local.layout import Layout
from capc_services.local.processes import probe
from capc_services.local.provision import LocalOptions

# Three hospitals sharing Fashion-MNIST's 60,000 training images, 189 teachers each (about 106 images per
# teacher, what `capc federation plan --examples 20000 --examples 20000 --examples 20000 --classes 10
# --epsilon 6` proposes); the budget, not the stream, ends the run.
DEMO_OPTIONS = LocalOptions(
    parties=3,
    teachers_per_party=189,
    dataset="fashion-mnist",
    epsilon=6.0,
    queries=16896,
    batch_size=512,
    bn_batch=64,
    train_limit=None,
    order=None,  # the order capc budget plan picks for this mechanism and budget
    student_threads=None,  # it trains once the hospitals are done: every core
)

# `capc demo --quick`: the same code on 3 × 2,000 images, 33 teachers each (what `capc federation plan
# --examples 2000 --examples 2000 --examples 2000 --classes 10 --epsilon 8 --bn-batch 32` proposes), for
# the test suite and a first look: about a minute, and a weak student (a few hundred answers).
QUICK_OPTIONS = LocalOptions(
    parties=3,
    teachers_per_party=33,
    dataset="fashion-mnist",
    epsilon=8.0,
    queries=1024,
    batch_size=64,
    bn_batch=32,
    train_limit=2000,  # per party
    order=None,
)


_EPSILONS = ("epsilon_settled", "epsilon_reserved", "epsilon_spent")


def budget_line(budget: dict[str, Any]) -> str:
    """``ε settled S (+ R reserved) of L``: the settled figure only grows, so the line never seems to fall
    when an open batch's worst-case reservation settles lower."""
    reserved = f" (+{budget['epsilon_reserved']:.3f} reserved)" if budget["epsilon_reserved"] > 0 else ""
    return f"ε settled {budget['epsilon_settled']:.3f}{reserved} of {budget['epsilon_limit']:g}"


@dataclass
class DemoRun:
    """What the demo's steps share: the federation's directory and options, and what each step found."""

    layout: Layout
    options: LocalOptions
    say: Callable[[str], None]
    timeout: float
    started: float = field(default_factory=time.monotonic)
    endpoints: dict[str, Any] = field(default_factory=dict)
    secret: str = ""
    progress: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def train_teachers(run: DemoRun) -> None:
    """Provision the federation and let each hospital train its heads on its own data (all at once)."""
    prepare(run.layout.root, run.options, say=run.say)


def start_parties(run: DemoRun) -> None:
    """Start the guardian, the student and the hospitals as processes and wait until all are ready."""
    run.endpoints = up(run.layout.root, run.options, say=run.say)
    run.secret = token(run.layout)


def label_and_publish(run: DemoRun) -> None:
    """Follow the student's progress until it has spent the budget, trained and published (or failed).

    Raises:
        ProtocolError: the student failed.
        UnavailableError: the run exceeded the demo's timeout.
    """
    student, budget_url = run.endpoints["student"]["progress"], run.endpoints["guardian"]["budget"]
    last = ""
    while True:
        _, progress = probe(student, token=run.secret)
        _, budget = probe(budget_url, token=run.secret)
        if isinstance(progress, dict) and isinstance(budget, dict):
            asked = f"{progress['queries']} queries asked, {progress['answered']} answered"
            line = f"{progress['state']}: {asked}, {budget_line(budget)}"
            if line != last:
                run.say(line)
                last = line
            if progress["state"] in ("published", "failed"):
                break
        if time.monotonic() - run.started > run.timeout:
            raise UnavailableError(
                f"the demo did not finish within {run.timeout:.0f} s; logs in {run.layout.logs}"
            )
        time.sleep(1.0)
    if progress["state"] == "failed":
        raise ProtocolError(f"the student failed: {progress['error']} (logs in {run.layout.logs})")
    run.progress = progress


def read_budget(run: DemoRun) -> None:
    """Read the spent budget back over the guardian's REST API, as an administrator would.

    Raises:
        UnavailableError: the guardian did not answer.
    """
    url = run.endpoints["guardian"]["budget"]
    code, budget = probe(url, token=run.secret)
    if code != 200:
        raise UnavailableError(f"GET {url} answered {code}: {budget}")
    run.say(f"GET {url} (bearer token from {run.layout.token}):")
    run.say("  " + ", ".join(f"{k}={budget[k]}" for k in (*_EPSILONS, "epsilon_limit", "delta", "order")))
    run.budget = budget


def summarise(run: DemoRun) -> None:
    """The figures ``capc demo`` prints: the budget, the published student, the federation and the time."""
    published = run.progress["published"]
    run.summary = {
        "state_dir": str(run.layout.root),
        "budget": {
            k: run.budget[k] for k in (*_EPSILONS, "epsilon_limit", "delta", "order", "queries", "answered")
        },
        "stopped_reason": run.progress["stopped_reason"],
        "student": {
            "model": published["model"],
            "model_card": published["model_card"],
            "accuracy": published["accuracy"],
            "epsilon": published["epsilon"],
            "epsilon_spent": published["epsilon_spent"],
            "answered": published["answered"],
        },
        "parties": run.options.parties,
        "teachers_per_party": run.options.teachers_per_party,
        "seconds": round(time.monotonic() - run.started, 1),
    }


#: The demo, step by step. A step reads what earlier ones left in the :class:`DemoRun` and adds its own; a
#: further student of the same federation (another mechanism side by side) is one more step and one more
#: entry in the summary.
STEPS: tuple[Callable[[DemoRun], None], ...] = (
    train_teachers,
    start_parties,
    label_and_publish,
    read_budget,
    summarise,
)


def run_demo(
    root: str | Path,
    *,
    options: LocalOptions = DEMO_OPTIONS,
    keep: bool = False,
    say: Callable[[str], None],
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run the demo's :data:`STEPS` in ``root`` (a previous demo there is removed first); returns the summary.

    Raises:
        ProtocolError: the student failed (its error is in the message).
        UnavailableError: a party did not come up, or the run exceeded ``timeout`` seconds.
    """
    layout = Layout(Path(root).resolve())
    if layout.federation.exists():
        down(layout.root, purge=True)
    run = DemoRun(layout=layout, options=options, say=say, timeout=timeout)
    try:
        for step in STEPS:
            step(run)
    finally:
        if not keep and layout.state.exists():
            down(layout.root)
            say(f"federation stopped; its state (ledger, labels, model, logs) is kept in {layout.root}")
    return run.summary
