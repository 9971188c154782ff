"""``capc demo``: the whole product in a few minutes — a local federation spends its privacy budget, the
student is trained and published, the budget is read back over the guardian's REST API, and everything is
shut down again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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


#: The second student's secagg-dpsgd fields beside the budget's (the recipe's defaults); the quick demo's
#: public basis comes from fewer synthetic images (a first look, not the measured recipe).
DEMO_COMPARE: dict[str, Any] = {}
QUICK_COMPARE: dict[str, Any] = {"rounds": 20, "projection": {"dim": 256, "images": 1000}}

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
    compare: dict[str, Any] = field(default_factory=dict)
    compared: dict[str, Any] = field(default_factory=dict)
    local_only: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


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
    budget_url = run.endpoints["guardian"]["budget"]

    def line_of(progress: dict[str, Any]) -> str | None:
        _, budget = probe(budget_url, token=run.secret)
        if not isinstance(budget, dict):
            return None
        asked = f"{progress['queries']} queries asked, {progress['answered']} answered"
        return f"{progress['state']}: {asked}, {budget_line(budget)}"

    run.progress = _wait_published(
        run, run.endpoints["student"]["progress"], run.secret, run.layout.logs, line_of=line_of
    )


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


def _wait_published(
    run: DemoRun,
    progress_url: str,
    secret: str,
    logs: Path,
    *,
    line_of: Callable[[dict[str, Any]], str | None] = lambda progress: str(progress["state"]),
) -> dict[str, Any]:
    """Follow a student's progress until it published (or failed), saying each new ``line_of`` it (None:
    not readable yet); its last progress.

    Raises:
        ProtocolError: the student failed.
        UnavailableError: the run exceeded the demo's timeout.
    """
    last = ""
    while True:
        _, progress = probe(progress_url, token=secret)
        line = line_of(progress) if isinstance(progress, dict) else None
        if line is not None:
            if line != last:
                run.say(line)
                last = line
            if progress["state"] in ("published", "failed"):
                break
        if time.monotonic() - run.started > run.timeout:
            raise UnavailableError(f"the demo did not finish within {run.timeout:.0f} s; logs in {logs}")
        time.sleep(1.0)
    if progress["state"] == "failed":
        raise ProtocolError(f"the student failed: {progress['error']} (logs in {logs})")
    return progress


def second_student(run: DemoRun) -> None:
    """The same hospitals' data and budget through secure-aggregation DP-SGD: a second local federation
    (its own ledger, the same sites), started once the first one has stopped (the cores are free)."""
    from capc_common.federation.sizing import dpsgd_mechanism

    down(run.layout.root)
    started = time.monotonic()
    fields, order = dpsgd_mechanism(epsilon=run.options.epsilon, delta=run.options.delta)
    options = replace(
        run.options,
        mechanism="secagg-dpsgd",
        order=order,
        mechanism_params={"rounds": fields["rounds"], **run.compare},  # z: calibrated to these rounds
        student_threads=run.options.torch_threads,
    )
    root = run.layout.root / "secagg-dpsgd"
    run.say(f"the same hospitals, secure-aggregation DP-SGD at ε {run.options.epsilon:g} ({root})")
    endpoints = up(root, options, say=run.say)
    try:
        layout = Layout(root)
        progress = _wait_published(run, endpoints["student"]["progress"], token(layout), layout.logs)
    finally:
        down(root)
    published = progress["published"]
    run.compared = {
        "mechanism": "secagg-dpsgd",
        "state_dir": str(root),
        "model": published["model"],
        "model_card": published["model_card"],
        "accuracy": published["accuracy"],
        "epsilon": published["epsilon"],
        "epsilon_spent": published["epsilon_spent"],
        "releases": published["releases"],
        "seconds": round(time.monotonic() - started, 1),
    }


def each_hospital_alone(run: DemoRun) -> None:
    """What each hospital gets alone: a (non-private) linear head on its own records' per-example features,
    evaluated on the students' test images — the figure a hospital weighs joining against."""
    import numpy as np

    from capc_common.data import load_dataset
    from capc_common.federation import FederationConfig, load_shared_backbone
    from capc_common.learn.featurizers import BackboneFeaturizer
    from capc_common.learn.heads import HeadRecipe, train_heads
    from capc_common.mechanisms import normalise
    from capc_common.mechanisms.central import extract_per_example
    from capc_services.teacher.settings import TeacherSettings
    from capc_services.teacher.train import party_examples

    config = FederationConfig.load(run.layout.federation)
    featurizer = BackboneFeaturizer(load_shared_backbone(config))
    test = load_dataset(run.options.dataset, split="test")
    count = run.options.evaluation_images or len(test.labels)
    test_x = normalise(extract_per_example(featurizer, test.images[:count]))
    for party in config.teacher_names:
        images, labels, _ = party_examples(TeacherSettings.load(run.layout.site(party)))
        head = train_heads(
            normalise(extract_per_example(featurizer, images)),
            labels,
            owners=np.zeros(len(labels), dtype=np.int64),
            heads=1,
            classes=config.classes,
            recipe=HeadRecipe(optimizer="adam", steps=100, lr=0.1),  # the benchmarks' local-only head
        )
        run.local_only[party] = float((head.predict(test_x)[0] == test.labels[:count]).mean())
        run.sizes[party] = len(labels)
        run.say(
            f"{party} alone (its own {len(labels)} images, not private): {100 * run.local_only[party]:.1f} %"
        )


def which_to_use(run: DemoRun) -> None:
    """Side by side: both students with their ε, each hospital alone, and which to use."""
    students = {"diet-capc": run.summary["student"], "secagg-dpsgd": run.compared}
    best = max(students, key=lambda name: students[name]["accuracy"] or 0.0)
    alone = max(run.local_only.values())
    run.summary["compared"] = run.compared
    run.summary["local_only"] = run.local_only
    worse = min(s["accuracy"] or 0.0 for s in students.values())
    gain = (students[best]["accuracy"] or 0.0) - alone
    run.summary["recommendation"] = {
        "mechanism": best,
        "accuracy": students[best]["accuracy"],
        "gain_over_best_hospital": gain,
        "why": (
            f"at the same guaranteed ε {run.options.epsilon:g} on the same hospitals' data, {best} published "
            f"the better student ({100 * (students[best]['accuracy'] or 0.0):.1f} % against "
            f"{100 * worse:.1f} %); "
            + (
                f"it beats the best hospital alone ({100 * alone:.1f} %) by {100 * gain:.1f} points"
                if gain > 0
                else f"but the best hospital alone gets {100 * alone:.1f} % ({100 * -gain:.1f} points more): "
                "with this little data per hospital the federation does not pay at this budget "
                "(`capc federation plan` says where it does)"
            )
        ),
    }
    # What the measurements say for hospitals of these sizes (the joining benchmark's table, not this run).
    from capc_common.federation.recommend import recommend

    run.summary["plan"] = recommend(list(run.sizes.values()), epsilon=run.options.epsilon)
    run.summary["seconds"] = round(time.monotonic() - run.started, 1)


#: The demo, step by step. A step reads what earlier ones left in the :class:`DemoRun` and adds its own.
STEPS: tuple[Callable[[DemoRun], None], ...] = (
    train_teachers,
    start_parties,
    label_and_publish,
    read_budget,
    summarise,
    second_student,
    each_hospital_alone,
    which_to_use,
)


def run_demo(
    root: str | Path,
    *,
    options: LocalOptions = DEMO_OPTIONS,
    compare: dict[str, Any] | None = None,
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
    run = DemoRun(layout=layout, options=options, say=say, timeout=timeout, compare=dict(compare or {}))
    try:
        for step in STEPS:
            step(run)
    finally:
        if not keep and layout.state.exists():
            down(layout.root)
            say(f"federation stopped; its state (ledger, labels, model, logs) is kept in {layout.root}")
    return run.summary
