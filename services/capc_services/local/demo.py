"""``capc demo``: the whole product in a few minutes — a local federation spends its privacy budget, the
student is trained and published, the budget is read back over the guardian's REST API; the same hospitals go
through secure-aggregation DP-SGD, and each hospital compares on its own holdout its best model alone, that
student and the student fine-tuned on its data, and keeps the best (what ``capc teacher personalise`` does);
and everything is shut down again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capc_common.errors import InputError, ProtocolError, UnavailableError
from capc_common.threads import threads_limited
from capc_services.local.federation import down, prepare, token, up
from capc_services.local.layout import Layout
from capc_services.local.processes import federation_of, probe
from capc_services.local.provision import LocalOptions

if TYPE_CHECKING:
    from capc_common.learn.personal import Alone, Personalised, Split

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
    # Three parties of 2,000 are near what the joining benchmark measures as not worth joining: the quick
    # demo runs the protocol anyway, and says why (the guardian logs the reason with what it overrode).
    force="capc demo --quick shows the protocol end to end on a small federation, whatever its forecast",
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
    """What the demo's steps share: the federations' directories and options, and what each step found."""

    layout: Layout
    options: LocalOptions
    say: Callable[[str], None]
    timeout: float
    keep: bool = False
    started: float = field(default_factory=time.monotonic)
    endpoints: dict[str, Any] = field(default_factory=dict)
    secret: str = ""
    student_secret: str = ""
    progress: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    compare: dict[str, Any] = field(default_factory=dict)
    second_endpoints: dict[str, Any] = field(default_factory=dict)
    second_started: float = 0.0
    compared: dict[str, Any] = field(default_factory=dict)
    local_only: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    test: tuple[dict[str, Any], Any] = ({}, None)
    splits: dict[str, Split] = field(default_factory=dict)
    alones: dict[str, Alone] = field(default_factory=dict)
    hospitals: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def second(self) -> Layout:
        """The second federation's directory: the same hospitals through secure-aggregation DP-SGD."""
        return Layout(self.layout.root / "secagg-dpsgd")


def train_teachers(run: DemoRun) -> None:
    """Provision the federation and let each hospital train its heads on its own data (all at once)."""
    prepare(run.layout.root, run.options, say=run.say)


def start_parties(run: DemoRun) -> None:
    """Start the guardian, the student and the hospitals as processes and wait until all are ready."""
    run.endpoints = up(run.layout.root, run.options, say=run.say)
    run.secret = token(run.layout)
    run.student_secret = token(run.layout, federation_of(run.layout).student)


def label(run: DemoRun) -> None:
    """Follow the student's labelling until the guardian's ledger stops it (the student then trains).

    Raises:
        ProtocolError: the student failed.
        UnavailableError: the run exceeded the demo's timeout.
    """
    run.progress = _follow(
        run, run.endpoints, run.student_secret, run.layout, until=_LABELLED, line_of=_budget_line(run)
    )


def start_second(run: DemoRun) -> None:
    """The same hospitals' data and budget through secure-aggregation DP-SGD: a second local federation (its
    own ledger, the same sites), started while the first one's student trains; its hospitals read their
    records' features from the caches they wrote when they trained their heads, and its student computes the
    public basis meanwhile (the first student trains on one core, the second federation takes the other)."""
    from capc_common.federation.sizing import dpsgd_mechanism

    run.second_started = time.monotonic()
    fields, order = dpsgd_mechanism(epsilon=run.options.epsilon, delta=run.options.delta)
    options = replace(
        run.options,
        mechanism="secagg-dpsgd",
        order=order,
        mechanism_params={"rounds": fields["rounds"], **run.compare},  # z: calibrated to these rounds
        # The same hospitals on the same machine: their records were featurised when they trained their
        # heads, into their records caches in the first federation's directory.
        records_from=str(run.layout.root),
    )
    run.say(f"the same hospitals, secure-aggregation DP-SGD at ε {run.options.epsilon:g} ({run.second.root})")
    # Its hospitals are ready once their records' features are read and on the public basis: minutes on a busy
    # machine, so the demo's own deadline bounds the wait, not a party's start-up time.
    left = run.timeout - (time.monotonic() - run.started)
    run.second_endpoints = up(run.second.root, options, say=run.say, ready_timeout=left)


def publish(run: DemoRun) -> None:
    """Follow the first student until it has trained and published (or failed).

    Raises:
        ProtocolError: the student failed.
        UnavailableError: the run exceeded the demo's timeout.
    """
    run.progress = _follow(run, run.endpoints, run.student_secret, run.layout, line_of=_budget_line(run))


def read_budget(run: DemoRun) -> None:
    """Read the spent budget back over the guardian's REST API, as an administrator would.

    Raises:
        UnavailableError: the guardian did not answer.
    """
    url = run.endpoints["guardian"]["budget"]
    code, budget = probe(url, token=run.secret)
    if code != 200:
        raise UnavailableError(f"GET {url} answered {code}: {budget}")
    run.say(f"GET {url} (bearer token from {run.layout.admin_token('guardian')}):")
    run.say("  " + ", ".join(f"{k}={budget[k]}" for k in (*_EPSILONS, "epsilon_limit", "delta", "order")))
    run.budget = budget


def summarise(run: DemoRun) -> None:
    """The figures ``capc demo`` prints: the budget, the published student, the federation and the time;
    the first federation is stopped (unless kept): it has published."""
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
    if not run.keep:
        down(run.layout.root)


#: Seconds between two reads of a student's progress: each step waits for one, and a second was up to a
#: second lost at each of the demo's steps.
_POLL_S = 0.25
#: Seconds between two progress lines (the last one is always said).
_SAY_EVERY_S = 1.0

#: Student states that end its labelling (it trains and publishes next).
_LABELLED = ("labelled", "training", "published")


def _budget_line(run: DemoRun) -> Callable[[dict[str, Any]], str | None]:
    """The first student's progress beside the guardian's budget, as one line (None: not readable yet)."""
    budget_url = run.endpoints["guardian"]["budget"]

    def line_of(progress: dict[str, Any]) -> str | None:
        _, budget = probe(budget_url, token=run.secret)
        if not isinstance(budget, dict):
            return None
        asked = f"{progress['queries']} queries asked, {progress['answered']} answered"
        return f"{progress['state']}: {asked}, {budget_line(budget)}"

    return line_of


def _follow(
    run: DemoRun,
    endpoints: dict[str, Any],
    secret: str,
    layout: Layout,
    *,
    until: tuple[str, ...] = ("published",),
    line_of: Callable[[dict[str, Any]], str | None] = lambda progress: str(progress["state"]),
) -> dict[str, Any]:
    """Follow a student's progress until its state is one of ``until`` (or it failed), saying each new
    ``line_of`` it (None: not readable yet); its last progress. ``secret`` is the student's admin token.

    Raises:
        ProtocolError: the student failed.
        UnavailableError: the run exceeded the demo's timeout.
    """
    last, looked = "", 0.0
    while True:
        _, progress = probe(endpoints["student"]["progress"], token=secret)
        ended = isinstance(progress, dict) and progress["state"] in (*until, "failed")
        # The line (which may read the guardian's budget too) is made at most once a second, and at the end.
        if isinstance(progress, dict) and (ended or time.monotonic() - looked >= _SAY_EVERY_S):
            looked = time.monotonic()
            line = line_of(progress)
            if line is not None:
                if line != last:
                    run.say(line)
                    last = line
                if ended:
                    break
        if time.monotonic() - run.started > run.timeout:
            raise UnavailableError(
                f"the demo did not finish within {run.timeout:.0f} s; logs in {layout.logs}"
            )
        time.sleep(_POLL_S)
    if progress["state"] == "failed":
        raise ProtocolError(f"the student failed: {progress['error']} (logs in {layout.logs})")
    return progress


def second_published(run: DemoRun) -> None:
    """Follow the second student until it has published (then its federation is stopped, unless kept).

    Raises:
        ProtocolError: the student failed.
        UnavailableError: the run exceeded the demo's timeout.
    """
    layout = run.second
    progress = _follow(run, run.second_endpoints, token(layout, federation_of(layout).student), layout)
    if not run.keep:
        down(layout.root)
    published = progress["published"]
    run.compared = {
        "mechanism": "secagg-dpsgd",
        "state_dir": str(layout.root),
        "model": published["model"],
        "model_card": published["model_card"],
        "accuracy": published["accuracy"],
        "epsilon": published["epsilon"],
        "epsilon_spent": published["epsilon_spent"],
        "releases": published["releases"],
        "seconds": round(time.monotonic() - run.second_started, 1),
    }


def each_hospital_alone(run: DemoRun) -> None:
    """What each hospital gets alone: its best model alone — the linear heads of the personal recipe, chosen
    on the hospital's own holdout (:func:`~capc_common.learn.personal.fit_alone`; the demo leaves the CNN
    from scratch out, minutes on a large hospital) — evaluated on the students' test images, the figure a
    hospital weighs joining against.

    The training part's features are those the hospital's secure-aggregation DP-SGD party computed (read back
    from its own records cache), the test images' those the second student was evaluated on (that
    federation's shared cache of public features): only the small holdout is featurised again. The hospitals
    fit side by side, one thread each, while the second federation runs its releases.

    Raises:
        InputError: the demo's options evaluate no test images.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from capc_common.federation import FederationConfig, load_shared_backbone
    from capc_common.learn.personal import fit_alone, predict
    from capc_common.mechanisms import normalise
    from capc_services.student.release_app import evaluation_set
    from capc_services.student.settings import StudentSettings
    from capc_services.teacher.personal import alone_text, checked_examples, personal_recipe, site_split
    from capc_services.teacher.published import StudentSpace
    from capc_services.teacher.settings import TeacherSettings

    # one thread per hospital (a hospital per core); the caller's thread limits come back after
    with threads_limited(1):
        config = FederationConfig.load(run.second.federation)
        backbone = load_shared_backbone(config)
        evaluation = evaluation_set(StudentSettings.load(run.second.site(config.student)), backbone)
        if evaluation is None:
            raise InputError("the demo compares students and hospitals on test images: set evaluation_images")
        test_features, test_y, _ = evaluation
        test_x = normalise(test_features, dtype=np.float32)
        run.test = ({"per-example": test_x, "student": test_x}, np.asarray(test_y, dtype=np.int64))
        space = StudentSpace.of(config, backbone)

        def alone(party: str) -> tuple[Split, Alone]:
            """The hospital's split and its best model alone."""
            settings = TeacherSettings.load(run.second.site(party))
            split, _ = site_split(settings, checked_examples(settings), space, cnn=False)  # per-example
            return split, fit_alone(split, classes=config.classes, recipe=personal_recipe(cnn=False))

        parties = config.teacher_names
        # All at once, not one per core: two cores and three hospitals left the third hospital's fit alone
        # on one core for its whole fit (measured: 12 s of the full demo with a core idle).
        with ThreadPoolExecutor(max_workers=len(parties)) as pool:
            for party, (split, found) in zip(parties, pool.map(alone, parties), strict=True):
                run.splits[party], run.alones[party] = split, found
                accuracy = float((predict(found.model, run.test[0]) == run.test[1]).mean())
                run.local_only[party], run.sizes[party] = accuracy, len(split.labels)
                run.say(
                    f"{party} alone (its own {len(split.labels)} images, {len(split.holdout_labels)} of them "
                    f"held out to choose on; {alone_text(found.detail)}, no CNN from scratch in the demo; "
                    f"not private): {100 * accuracy:.1f} %"
                )


def each_hospital_keeps(run: DemoRun) -> None:
    """What each hospital keeps: on its own holdout it compares its model alone, the secure-aggregation
    student (the recommended federation) and that student fine-tuned on its own training part, and keeps the
    best (:func:`~capc_common.learn.personal.personalise`, as ``capc teacher personalise`` does); the three
    figures on the test images, and which it kept. Nothing of this leaves a hospital (the demo plays them
    all on one machine). The hospitals fine-tune side by side, one thread each."""
    from concurrent.futures import ThreadPoolExecutor

    from capc_common.federation import FederationConfig
    from capc_common.learn.personal import personalise
    from capc_services.teacher.personal import personal_recipe, scores
    from capc_services.teacher.published import load_published

    with threads_limited(1):
        config = FederationConfig.load(run.second.federation)
        student = load_published(Path(run.compared["model"]), config)

        def keep(party: str) -> Personalised:
            return personalise(
                run.splits[party],
                classes=config.classes,
                shared=student.head,
                alone=run.alones[party],
                recipe=personal_recipe(cnn=False),
            )

        parties = config.teacher_names
        with ThreadPoolExecutor(max_workers=len(parties)) as pool:
            for party, found in zip(parties, pool.map(keep, parties), strict=True):
                test = scores(found, *run.test)
                run.hospitals[party] = {
                    **test,
                    "kept": found.kept,
                    "kept_accuracy": test[found.kept],
                    "records": run.sizes[party],
                    "holdout": {name: found.holdout[name] for name in test},
                }
                figures = ", ".join(f"{name} {100 * value:.1f} %" for name, value in test.items())
                run.say(
                    f"{party}: {figures} on the test images; keeps {found.kept} (chosen on its "
                    f"{len(run.splits[party].holdout_labels)} held-out images)"
                )


def which_to_use(run: DemoRun) -> None:
    """Side by side: both students with their ε, each hospital alone, and which to use."""
    students = {"diet-capc": run.summary["student"], "secagg-dpsgd": run.compared}
    best = max(students, key=lambda name: students[name]["accuracy"] or 0.0)
    alone = max(run.local_only.values())
    run.summary["compared"] = run.compared
    run.summary["local_only"] = run.local_only
    run.summary["hospitals"] = run.hospitals
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
    from capc_common.federation import FederationConfig
    from capc_common.federation.recommend import recommend

    classes = FederationConfig.load(run.second.federation).classes
    run.summary["plan"] = recommend(list(run.sizes.values()), classes=classes, epsilon=run.options.epsilon)
    run.summary["seconds"] = round(time.monotonic() - run.started, 1)


#: The demo, step by step. A step reads what earlier ones left in the :class:`DemoRun` and adds its own. The
#: second federation starts once the first has labelled, while its student trains, and each hospital fits its
#: models alone while the second federation runs its releases (on two cores, neither waits for idle ones);
#: once that student is published each hospital fine-tunes it and keeps the best.
STEPS: tuple[Callable[[DemoRun], None], ...] = (
    train_teachers,
    start_parties,
    label,
    start_second,
    publish,
    read_budget,
    summarise,
    each_hospital_alone,
    second_published,
    each_hospital_keeps,
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

    Args:
        root: the first federation's state directory (the second one's is inside it).
        options: the first federation's options (the second one takes its hospitals and budget).
        compare: the second federation's secure-aggregation DP-SGD fields beside the budget's.
        keep: leave both federations running (``capc local down`` stops them).
        say: receives one-line progress messages.
        timeout: seconds the whole demo may take.

    Raises:
        ProtocolError: a student failed (its error is in the message).
        UnavailableError: a party did not come up, or the run exceeded ``timeout`` seconds.
    """
    layout = Layout(Path(root).resolve())
    second = Layout(layout.root / "secagg-dpsgd")
    if second.state.exists():  # a demo kept with --keep runs two federations: stop the nested one first
        down(second.root)
    if layout.federation.exists():
        down(layout.root, purge=True)
    run = DemoRun(
        layout=layout, options=options, say=say, timeout=timeout, keep=keep, compare=dict(compare or {})
    )
    try:
        for step in STEPS:
            step(run)
    finally:
        started = [each for each in (run.second, layout) if each.state.exists()]
        if not keep and started:
            for each in started:
                down(each.root)
            say(f"federations stopped; their state (ledgers, labels, models, logs) is kept in {layout.root}")
    return run.summary
