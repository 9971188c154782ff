"""``capc demo``: the whole product in a few minutes — a local federation spends its privacy budget, the
student is trained and published, the budget is read back over the guardian's REST API, and everything is
shut down again."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capc_common.errors import ProtocolError, UnavailableError
from capc_services.local.federation import down, token, up
from capc_services.local.layout import Layout
from capc_services.local.processes import probe, read_state
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


def _admin(layout: Layout, party: str) -> str:
    for proc in read_state(layout)["processes"]:
        if proc["party"] == party:
            return str(proc["admin_url"])
    raise UnavailableError(f"{party} is not part of the running federation in {layout.root}")


def run_demo(
    root: str | Path,
    *,
    options: LocalOptions = DEMO_OPTIONS,
    keep: bool = False,
    say: Callable[[str], None],
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run the demo in ``root`` (a previous demo there is removed first); returns the summary.

    Raises:
        ProtocolError: the student failed (its error is in the message).
        UnavailableError: a party did not come up, or the run exceeded ``timeout`` seconds.
    """
    layout = Layout(Path(root).resolve())
    if layout.federation.exists():
        down(layout.root, purge=True)
    start = time.monotonic()
    endpoints = up(layout.root, options, say=say)
    secret = token(layout)
    student = endpoints["student"]["progress"]
    budget_url = endpoints["guardian"]["budget"]
    try:
        last = ""
        while True:
            _, progress = probe(student, token=secret)
            _, budget = probe(budget_url, token=secret)
            if isinstance(progress, dict) and isinstance(budget, dict):
                asked = f"{progress['queries']} queries asked, {progress['answered']} answered"
                line = f"{progress['state']}: {asked}, {budget_line(budget)}"
                if line != last:
                    say(line)
                    last = line
                if progress["state"] in ("published", "failed"):
                    break
            if time.monotonic() - start > timeout:
                raise UnavailableError(
                    f"the demo did not finish within {timeout:.0f} s; logs in {layout.logs}"
                )
            time.sleep(1.0)
        if progress["state"] == "failed":
            raise ProtocolError(f"the student failed: {progress['error']} (logs in {layout.logs})")
        code, budget = probe(budget_url, token=secret)
        if code != 200:
            raise UnavailableError(f"GET {budget_url} answered {code}: {budget}")
        say(f"GET {budget_url} (bearer token from {layout.token}):")
        say("  " + ", ".join(f"{k}={budget[k]}" for k in (*_EPSILONS, "epsilon_limit", "delta", "order")))
        published = progress["published"]
        summary = {
            "state_dir": str(layout.root),
            "budget": {
                k: budget[k] for k in (*_EPSILONS, "epsilon_limit", "delta", "order", "queries", "answered")
            },
            "stopped_reason": progress["stopped_reason"],
            "student": {
                "model": published["model"],
                "model_card": published["model_card"],
                "accuracy": published["accuracy"],
                "epsilon": published["epsilon"],
                "epsilon_spent": published["epsilon_spent"],
                "answered": published["answered"],
            },
            "parties": options.parties,
            "teachers_per_party": options.teachers_per_party,
            "seconds": round(time.monotonic() - start, 1),
        }
    finally:
        if not keep:
            down(layout.root)
            say(f"federation stopped; its state (ledger, labels, model, logs) is kept in {layout.root}")
    return summary
