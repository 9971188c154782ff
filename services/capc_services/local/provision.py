"""Provision a complete local federation in one state directory: CA and certificates, federation.yaml,
one site file per party, free loopback ports and one admin token per role.

The files are the same a real deployment uses (see deploy/ and docs/operations.md); only the addresses
(loopback, so the admin APIs speak plain HTTP) and the teacher parties' one shared token are local
conveniences.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from capc_common.errors import InputError
from capc_common.federation import (
    FederationConfig,
    ReleaseMember,
    cap_cover,
    cap_order,
    check_runnable,
    exposure_of,
    mechanism_of,
    scaled_mechanism,
)
from capc_common.federation.refusals import Change, SpendPlan, enforce, pre_spend_refusals
from capc_common.federation.releases import ReleaseProtocol
from capc_common.federation.sizing import ANSWER_RATE, DPSGD_ROUNDS
from capc_services.local.flags import flag_names, in_flag_units, speaking_flags, training_part
from capc_services.local.layout import Layout
from capc_services.teacher.cap import LocalCap
from capc_services.tls import init_ca, issue_certificate, write_admin_token


@dataclass(frozen=True)
class LocalOptions:
    """Knobs of ``capc local up`` (everything else follows from them).

    Attributes:
        parties: teacher parties.
        teachers_per_party: teacher heads per party (PATE mechanisms; prompted teachers under Prom-PATE;
            a Private-kNN party casts ``neighbours`` votes instead).
        mechanism: ``confident-gnmax`` (the default), ``gnmax``, ``private-knn``, ``prom-pate``, ``dppl``
            or ``secagg-dpsgd`` (:data:`MECHANISMS`).
        dataset: the teachers' private data (split disjointly between parties).
        epsilon / delta / order: the federation's budget (order None, the default: under a selection
            mechanism the order that buys it the most queries at the budget, ``capc budget plan``'s rule;
            under a release mechanism 10, the order its noise is calibrated at).
        queries / batch_size / bn_batch: the synthetic query stream.
        threshold / sigma1 / sigma2: Confident-GNMax parameters (None: scaled to the number of heads by
            :data:`capc_common.federation.MECHANISM_RATIOS`).
        sigma: σ of GNMax's and Private-kNN's argmax noise (None: σ2's ratio times the votes per query).
        neighbours / sampling_rate: Private-kNN's ``k`` per party and Poisson rate ``q``.
        min_parties: quorum (None: all but one party, at least one).
        train_limit: about this many examples per party (None: the party's whole part): each site keeps
            the fraction ``train_limit · parties / N`` of its part's hash range, so the count varies a little
            (binomial) but one example never changes another's selection (``data.fraction``). Each site holds
            :func:`~capc_common.data.holdout_fraction` of them out of the federation (``holdout.fraction``,
            from this planned size: :func:`site_holdout`); the federation sees the rest.
        teacher_cap: each party's local worst-case ε cap (None: :func:`default_cap`).
        force: the operator's reason to run a federation the pre-spend checks refuse as a judgement
            (:mod:`capc_common.federation.refusals`); it goes to the guardian's site file, which logs it.
        generator / backbone: query generator and shared backbone (None: the library defaults).
        seed: seed of the query stream and of the data partition.
        insecure_noise_seed: seeded (non-private) guardian and student noise (federation.yaml's
            ``mechanism.insecure_noise_seed``; each party derives its own stream from it, as
            ``capc dietpate run`` does from ``mechanism.noise_seed``), for comparisons with the central run.
            The teacher sites opt in (``allow_insecure_noise: true``).
        torch_threads: CPU threads per party process.
        student_threads: CPU threads the student trains with (None: torch's default, every core). It runs
            torch only once it has stopped labelling, when the hospitals are idle; the default keeps it to
            ``torch_threads`` beside other federations (the test suite).
        evaluation_images: held-out test images the student is evaluated on (None: no evaluation).
        pipeline_depth: the student's pipelining (0: one batch at a time).
        vote_deadline_s / share_deadline_s: quorum deadlines.
        mechanism_params: fields of that mechanism set explicitly (the rest: :data:`MECHANISMS`' defaults).
        records_from: the state directory of another local federation of the same hospitals (None: this
            one): each site keeps its records cache in that federation's directory of the same party, as a
            hospital in two federations keeps one on its machine, so its records are featurised once.
    """

    parties: int = 3
    teachers_per_party: int = 25
    mechanism: str = "confident-gnmax"
    dataset: str = "fashion-mnist"
    epsilon: float = 10.0
    delta: float = 1e-5
    order: float | None = None
    queries: int = 2048
    batch_size: int = 64
    bn_batch: int = 64
    threshold: float | None = None
    sigma1: float | None = None
    sigma2: float | None = None
    sigma: float | None = None
    neighbours: int = 50
    sampling_rate: float = 0.2
    min_parties: int | None = None
    train_limit: int | None = 3000
    teacher_cap: float | None = None
    force: str | None = None
    generator: str | None = None
    backbone: str | None = None
    seed: int = 0
    insecure_noise_seed: str | None = None
    torch_threads: int = 1
    student_threads: int | None = 1
    evaluation_images: int | None = 2000
    pipeline_depth: int = 1
    vote_deadline_s: float = 60.0
    share_deadline_s: float = 30.0
    mechanism_params: Mapping[str, Any] | None = None
    records_from: str | None = None


def options_record(options: LocalOptions) -> dict[str, Any]:
    """The options as plain JSON values (what ``options.json`` holds and a resumed ``up`` compares)."""
    record: dict[str, Any] = json.loads(json.dumps(asdict(options)))
    return record


def recorded_options(layout: Layout) -> dict[str, Any] | None:
    """The options the federation in ``layout`` was provisioned with (None: provisioned before they were
    recorded)."""
    if not layout.options.is_file():
        return None
    record: dict[str, Any] = json.loads(layout.options.read_text())
    return record


#: Ledger order when the budget cannot pay for a single query at any order (the run is refused anyway).
_FALLBACK_ORDER = 10.0


def _confident(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """The options' Confident-GNMax parameters; unset ones scaled to the heads (the library's ratios)."""
    scaled = scaled_mechanism(options.parties * options.teachers_per_party)
    fields = {
        k: v if (v := getattr(options, k)) is not None else scaled[k]
        for k in ("threshold", "sigma1", "sigma2")
    }
    return fields, options.teachers_per_party


def _argmax_sigma(options: LocalOptions, votes: int) -> float:
    """The options' σ, or σ2's ratio to the votes per query (vote margins grow with the votes)."""
    return options.sigma if options.sigma is not None else scaled_mechanism(votes)["sigma2"]


def _gnmax(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """GNMax over the parties' heads."""
    sigma = _argmax_sigma(options, options.parties * options.teachers_per_party)
    return {"name": "gnmax", "sigma": sigma}, options.teachers_per_party


def _private_knn(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """Private-kNN: every party casts ``neighbours`` votes, so that is its ``heads``."""
    fields = {
        "name": "private-knn",
        "sigma": _argmax_sigma(options, options.parties * options.neighbours),
        "neighbours": options.neighbours,
        "sampling_rate": options.sampling_rate,
    }
    return fields, options.neighbours


#: The prompt recipe of ``capc local up --mechanism prom-pate``: few joint steps, since each costs a forward
#: and a backward pass of the party's whole data through the backbone (the rest: the library's recipe).
PROMPATE_DEFAULTS = {"steps": 1}


def _prom_pate(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """Prom-PATE: Confident-GNMax (scaled to the heads, as for DIET-PATE) over prompted teachers."""
    fields, per_party = _confident(options)
    return {"name": "prom-pate", **fields, **PROMPATE_DEFAULTS}, per_party


def _planned_order(config: FederationConfig) -> float:
    """The Rényi order that buys the federation's own selection mechanism the most queries at the planner's
    answer rate (the rule of ``capc budget plan``, :func:`~capc_common.privacy.budget.plan_budget`)."""
    from capc_common.privacy.budget import plan_budget

    b = config.budget
    try:
        budget = plan_budget(
            mechanism_of(config),
            epsilon=b.epsilon,
            delta=b.delta,
            expected_answer_rate=ANSWER_RATE,
            smallest_batch=config.queries.batch_size,
        )
    except InputError:
        return _FALLBACK_ORDER  # the budget buys nothing: the batch check says how to fix it
    return float(budget.filter.order)


def _budget_rdp(options: LocalOptions) -> float:
    """The Rényi filter's budget at the ledger's order (the release defaults spend it whole)."""
    from capc_common.privacy.analysis import rdp_budget_at_order

    return float(
        rdp_budget_at_order(
            epsilon=options.epsilon, delta=options.delta, order=options.order or _FALLBACK_ORDER
        )
    )


def _one_release_rho(options: LocalOptions) -> float:
    """The zCDP ρ of a single release spending the whole budget: ``ρ·λ`` = the budget at order λ."""
    return 0.999 * _budget_rdp(options) / (options.order or _FALLBACK_ORDER)


def _dppl(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """DP prototypes spending the whole budget in its one release."""
    return {"name": "dppl", "rho": _one_release_rho(options)}, options.teachers_per_party


def _dppl_public(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """DPPL-Public (noisy nearest-candidate votes) spending the whole budget in its one release; the pool
    and prototypes per class are the member's defaults (docs/mechanisms.md)."""
    return {"name": "dppl-public", "rho": _one_release_rho(options)}, options.teachers_per_party


#: Rounds and sampling rate of ``capc local up --mechanism secagg-dpsgd``: the planner's rounds, full batch
#: (every record in every round, so a round costs the discrete Gaussian's own RDP, with no subsampling bound
#: and its floor at small ε); its step is the planner's too
#: (:data:`~capc_common.federation.sizing.DPSGD_RECIPE`), the projection federation.yaml's default.
DPSGD_DEFAULTS = {"rounds": DPSGD_ROUNDS, "sampling_rate": 1.0, "statistics": True}


def _dataset_size(options: LocalOptions) -> int:
    """Examples in the training split the simulated sites share."""
    return _split_size(options.dataset)


@cache
def _split_size(dataset: str) -> int:
    """Examples in ``dataset``'s training split, read once per process: the sites' fractions, their holdouts
    and federation.yaml's planned counts all derive from it (a second or more per read of Fashion-MNIST)."""
    from capc_common.data import load_dataset

    return len(load_dataset(dataset, split="train").labels)


def site_fraction(options: LocalOptions, *, total: int | None = None) -> float:
    """Each simulated site's ``data.fraction``: ``train_limit`` examples per party on average (``total``: the
    split's size when the caller has it; reading it decompresses the whole split)."""
    if options.train_limit is None:
        return 1.0
    return min(1.0, options.train_limit * options.parties / (total or _dataset_size(options)))


def planned_examples(options: LocalOptions) -> int:
    """The examples each simulated site holds on average (its count is binomial around it), its holdout
    included. A planned figure, from the options and the split's size alone — never a count of the data a
    site selected."""
    total = _dataset_size(options)
    return round(site_fraction(options, total=total) * total / options.parties)


def site_holdout(options: LocalOptions) -> float:
    """Each simulated site's ``holdout.fraction``: :func:`~capc_common.data.holdout_fraction` of its planned
    size (:func:`planned_examples`) — a public, planned number, never the count of the site's data (which
    would let one example move others between the training part and the holdout)."""
    from capc_common.data import holdout_fraction

    return holdout_fraction(max(1, planned_examples(options)))


def planned_training(options: LocalOptions) -> int:
    """The examples each simulated site's heads train on, on average: its planned size less its holdout.
    What its ``federation.yaml`` entry declares, so every party can check before the first charge that its
    heads can vote (:mod:`capc_common.federation.refusals`), with the count preflight sees at the site (its
    training part)."""
    return training_part(planned_examples(options))


def _secagg_dpsgd(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """Secure-aggregation DP-SGD whose noise multiplier is the smallest that fits all its releases (the
    statistics release and the gradient rounds) in the budget.

    The step is the planner's heavy ball (:data:`~capc_common.federation.sizing.DPSGD_RECIPE`) unless
    ``mechanism_params`` names another optimizer: then the schema's own step for it (Adam's recipe: clip 1,
    lr 0.3, records of norm 1) fills what is not given, since the heavy ball's clip, step cap and step rule
    mean nothing to Adam (its lr 250 would diverge, and ``step_noise`` is refused with it)."""
    from capc_common.federation.sizing import DPSGD_RECIPE
    from capc_common.mechanisms import calibrate
    from capc_common.privacy.analysis import rdp_subsampled_discrete_gaussian

    given = {**DPSGD_DEFAULTS, **dict(options.mechanism_params or {})}
    heavy_ball = given.get("optimizer", DPSGD_RECIPE["optimizer"]) == DPSGD_RECIPE["optimizer"]
    step = DPSGD_RECIPE if heavy_ball else {}
    releases = int(given["rounds"]) + int(bool(given["statistics"]))
    rate = float(given["sampling_rate"])
    order = options.order or _FALLBACK_ORDER
    budget = 0.999 * _budget_rdp(options)
    z = calibrate(
        lambda z: (
            releases
            * float(rdp_subsampled_discrete_gaussian([order], sampling_rate=rate, noise_multiplier=z)[0])
        ),
        target=budget,
    )
    return {
        "name": "secagg-dpsgd",
        "rounds": int(given["rounds"]),
        "noise_multiplier": z,
        "sampling_rate": rate,
        "statistics": bool(given["statistics"]),
        **step,  # mechanism_dict lays mechanism_params over these
    }, options.teachers_per_party


#: ``capc local up --mechanism NAME``: the mechanism's default federation.yaml fields (from the options) and
#: each party's heads.
MECHANISMS: dict[str, Callable[[LocalOptions], tuple[dict[str, Any], int]]] = {
    "confident-gnmax": _confident,
    "gnmax": _gnmax,
    "private-knn": _private_knn,
    "prom-pate": _prom_pate,
    "dppl": _dppl,
    "dppl-public": _dppl_public,
    "secagg-dpsgd": _secagg_dpsgd,
}


def mechanism_dict(options: LocalOptions) -> tuple[dict[str, Any], int]:
    """federation.yaml's ``mechanism`` for the options (defaults, then ``mechanism_params``) and the heads
    of every party.

    Raises:
        InputError: an unknown mechanism name.
    """
    build = MECHANISMS.get(options.mechanism)
    if build is None:
        raise InputError(f"unknown mechanism {options.mechanism!r}; choose one of {sorted(MECHANISMS)}")
    fields, per_party = build(options)
    return {
        **fields,
        **dict(options.mechanism_params or {}),
        "insecure_noise_seed": options.insecure_noise_seed,
    }, per_party


def default_cap(config: FederationConfig, options: LocalOptions) -> float:
    """Each simulated hospital's local ε cap unless ``teacher_cap`` sets one: under a selection mechanism,
    the cap that covers the federation's limit with its plan (:func:`~capc_common.federation.cap_cover`,
    the figure ``capc teacher preflight`` checks a cap against); under a release mechanism, whose charges
    are fixed in advance and add up to at most the limit, 3 × ε of headroom."""
    if isinstance(config.mechanism, ReleaseMember):
        return 3 * options.epsilon
    return cap_cover(exposure_of(config), delta=config.budget.delta).cap


def site_cap(config: FederationConfig, options: LocalOptions) -> float:
    """A simulated hospital's local ε cap: ``teacher_cap``, else :func:`default_cap` of ``config``."""
    return options.teacher_cap if options.teacher_cap is not None else default_cap(config, options)


def free_port() -> int:
    """A TCP port that is free on loopback right now, below the kernel's ephemeral range.

    A port the OS picks (``bind(port 0)``) comes from the ephemeral range, from which the kernel also takes
    the local port of every outgoing connection: between this call and the party binding the port, a
    connection anywhere on the machine (a teacher reconnecting, a probe, another test) could take it, and the
    party then failed to start ("Address already in use", seen in the suite). Below that range only a
    process binding that very port can take it. The candidates are drawn by ``random.SystemRandom``, not the
    ``random`` module, which a test runner may seed alike in every worker.
    """
    low = _ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(_PORT_TRIES if low > _PORTS_FROM + 1000 else 0):
        port = draw.randrange(_PORTS_FROM, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no room below it: the OS picks
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


ROLES = ("guardian", "student", "teacher")
"""The roles of a federation, one admin token each."""
_PORTS_FROM = 10_000  # above the well-known and most registered service ports
_PORT_TRIES = 50


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768, its default, elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def teacher_names(parties: int) -> list[str]:
    """Names of the simulated organisations: hospital-1, hospital-2, ..."""
    return [f"hospital-{i + 1}" for i in range(parties)]


def federation_dict(options: LocalOptions) -> dict[str, Any]:
    """The federation.yaml of a local federation, as a mapping."""
    from capc_common.models import backbone_sha256, default_backbone
    from capc_common.synth import DEFAULT_GENERATOR, image_shape_for

    if options.parties < 1 or options.teachers_per_party < 1:
        raise InputError(
            "need at least one party and one teacher per party, got "
            f"{options.parties} × {options.teachers_per_party}"
        )
    mechanism, per_party = mechanism_dict(options)
    height, width, channels = image_shape_for(options.dataset)
    backbone = options.backbone or default_backbone(height, width, channels)
    examples = planned_training(options)
    data: dict[str, Any] = {
        "name": "capc-local",
        "classes": 10,
        "teachers": [
            {"name": n, "heads": per_party, "examples": examples} for n in teacher_names(options.parties)
        ],
        "mechanism": mechanism,
        "budget": {
            "epsilon": options.epsilon,
            "delta": options.delta,
            "order": options.order or _FALLBACK_ORDER,
        },
        "queries": {
            "generator": options.generator or DEFAULT_GENERATOR,
            "seed": options.seed,
            "total": options.queries,
            "batch_size": options.batch_size,
            "bn_batch": options.bn_batch,
            "height": height,
            "width": width,
            "channels": channels,
        },
        "backbone": {"name": backbone, "sha256": backbone_sha256(backbone)},
        "quorum": {
            "min_parties": options.min_parties or max(1, options.parties - 1),
            "vote_deadline_s": options.vote_deadline_s,
            "share_deadline_s": options.share_deadline_s,
        },
    }
    if options.order is None:  # a release mechanism's noise is calibrated at the fallback order: it stays
        provisional = FederationConfig.from_dict(data, source="local federation options")
        if not isinstance(provisional.mechanism, ReleaseMember):
            data["budget"]["order"] = _planned_order(provisional)
    return data


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@dataclass(frozen=True)
class Endpoints:
    """Loopback ports of one local federation."""

    guardian_grpc: int
    student_grpc: int
    admin: dict[str, int]

    @property
    def guardian_address(self) -> str:
        """The guardian's gRPC address."""
        return f"127.0.0.1:{self.guardian_grpc}"

    @property
    def student_address(self) -> str:
        """The student's gRPC address."""
        return f"127.0.0.1:{self.student_grpc}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (stored in state.json)."""
        return {"guardian_grpc": self.guardian_grpc, "student_grpc": self.student_grpc, "admin": self.admin}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Endpoints:
        """Inverse of :meth:`to_dict`."""
        return cls(
            guardian_grpc=int(data["guardian_grpc"]),
            student_grpc=int(data["student_grpc"]),
            admin={k: int(v) for k, v in data["admin"].items()},
        )


def provision(root: str | Path, options: LocalOptions) -> tuple[Layout, FederationConfig, Endpoints]:
    """Create a fresh local federation in ``root`` (which must not hold one already).

    Returns:
        The layout, the federation config and the chosen ports.

    Raises:
        InputError: ``root`` already holds a federation, or an option is invalid.
        PreconditionError: the federation would spend privacy for nothing (:func:`refuse_before_spending`).
    """
    layout = Layout(Path(root).resolve())
    if layout.federation.exists():
        raise InputError(
            f"{layout.root} already holds a federation; `{layout.command('down')} --purge` it first"
        )
    with speaking_flags(mechanism=options.mechanism):
        config = FederationConfig.from_dict(federation_dict(options), source="local federation options")
        # The backbone's file against its pinned hash, without torch (as the guardian checks it): the
        # parties that run the model load it when they start, and a federation's first step, its hospitals'
        # training, no longer waits for torch here (a release mechanism's protocol still builds it).
        runnable = check_runnable(config, model=False)
    cap = site_cap(config, options)
    if cap > 0:  # a cap ≤ 0 is refused when the teachers' site files are read back, naming cap.epsilon
        config = with_declared_caps(config, cap=cap)
    refuse_before_spending(config, options)
    existing = set(layout.root.iterdir()) if layout.root.is_dir() else None
    try:
        config = pin_basis(config, layout.root / "feature-cache")
        endpoints = _write_federation(layout, config, options, runnable.protocol)
        _load_sites(layout, config)
        layout.options.write_text(json.dumps(options_record(options), indent=2))
    except BaseException:
        # Leave the directory as it was: a half-provisioned federation would block the next `up`.
        if existing is None:
            shutil.rmtree(layout.root, ignore_errors=True)
        else:
            for path in set(layout.root.iterdir()) - existing:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        raise
    return layout, config, endpoints


def refuse_before_spending(config: FederationConfig, options: LocalOptions) -> None:
    """Refuse, before anything is written, a federation that would spend privacy for nothing (the pre-spend
    checks on its planned figures and the caps it declares, :mod:`capc_common.federation.refusals`), naming
    the flags to change; ``options.force`` overrides a judgement (the guardian's site file then carries the
    reason, and the guardian logs it with what it overrode).

    Raises:
        PreconditionError: a refusal stands.
    """
    # in the flags' units (a party's training part as the --train-limit that gives it), then only the ways
    # out that get past every check
    refusals = [in_flag_units(r) for r in pre_spend_refusals(SpendPlan.declared(config))]
    enforce(
        [replace(r, changes=tuple(c for c in r.changes if _gets_past(options, c))) for r in refusals],
        force=options.force,
        names=flag_names(options.mechanism),
        force_with='--force "REASON"',
    )


#: Options that are the operator's word about the federation, not part of it: a resumed ``up`` restates them
#: instead of comparing them with the recorded ones (:func:`restate_force`).
RESTATED = frozenset({"force"})


def restate_force(layout: Layout, config: FederationConfig, force: str) -> None:
    """Make ``force`` the reason to run the federation in ``layout`` whatever the pre-spend checks judge.

    The reason binds nothing the ledger, label store or cap records hold (a certain refusal stays refused,
    and the judgements are re-made by the guardian each time it starts, from federation.yaml alone), so a
    resumed ``up`` may state a new one — the way to go on with a federation a newer forecast judges below
    its parties alone. It goes where the guardian reads it, its site file, and to ``options.json``.

    Raises:
        InputError: ``force`` is blank.
    """
    enforce((), force=force, force_with='--force "REASON"')  # a blank reason is refused, as at provisioning
    site = layout.site(config.guardian)
    document: dict[str, Any] = yaml.safe_load(site.read_text())
    if document.get("force") != force:
        _write_yaml(site, {**document, "force": force})
    record = recorded_options(layout)
    if record is not None and record.get("force") != force:
        layout.options.write_text(json.dumps({**record, "force": force}, indent=2))


def with_declared_caps(config: FederationConfig, *, cap: float) -> FederationConfig:
    """``config`` with every simulated hospital declaring ``cap`` (``teachers[].cap``), the cap its site
    file sets: the guardian checks before the first charge that the declared caps cover the plan."""
    data = config.model_dump(mode="json")
    data["teachers"] = [{**party, "cap": cap} for party in data["teachers"]]
    return FederationConfig.from_dict(data, source="local federation options")


def _gets_past(options: LocalOptions, change: Change) -> bool:
    """Whether ``change``, made by its flag, gives a federation ``capc local up`` provisions and the checks
    before spending pass. A way out that holds for ``federation.yaml`` need not hold here: ``capc local up``
    scales the mechanism's noise to the heads, so fewer heads may fill their shards yet leave a budget that
    cannot pay for one batch. A field set by ``--mechanism-param`` is not tried (offered as it is)."""
    option = flag_names(options.mechanism).get(change.field, "").removeprefix("--").replace("-", "_")
    if option not in LocalOptions.__dataclass_fields__:
        return True
    value: Any = int(change.value) if float(change.value).is_integer() else change.value
    changed = replace(options, **{option: value})
    try:
        config = FederationConfig.from_dict(federation_dict(changed), source="local federation options")
        check_runnable(config, model=False)
    except InputError:
        return False
    return not pre_spend_refusals(SpendPlan.declared(config))


def pin_basis(config: FederationConfig, cache: Path) -> FederationConfig:
    """``config`` with its public basis pinned by digest (secure-aggregation DP-SGD with a projection that
    pins none; any other config as it is): the basis is computed here into the parties' shared feature
    ``cache``, where every party then reads it, and a party that computes another one refuses to train in
    other coordinates."""
    from capc_common.federation import SecAggDPSGDMechanism

    mechanism = config.mechanism
    if not isinstance(mechanism, SecAggDPSGDMechanism) or mechanism.projection is None:
        return config
    if mechanism.projection.sha256 is not None:
        return config
    # only here torch: a federation with no basis to pin is provisioned without it
    from capc_services.common.basis import basis_file

    digest = basis_file(config, cache).pin
    data = config.model_dump(mode="json", exclude_unset=True)
    data["mechanism"]["projection"] = {**mechanism.projection.model_dump(mode="json"), "sha256": digest}
    return FederationConfig.from_dict(data, source="local federation options")


def _load_sites(layout: Layout, config: FederationConfig) -> None:
    """Read every site file back as its party will (so invalid options fail here, not at start-up)."""
    from capc_services.guardian.settings import GuardianSettings
    from capc_services.student.settings import StudentSettings
    from capc_services.teacher.settings import TeacherSettings

    GuardianSettings.load(layout.site(config.guardian))
    StudentSettings.load(layout.site(config.student))
    for name in config.teacher_names:
        TeacherSettings.load(layout.site(name))


def _write_federation(
    layout: Layout, config: FederationConfig, options: LocalOptions, protocol: ReleaseProtocol | None
) -> Endpoints:
    """Write the CA, certificates, token, federation.yaml and site files; returns the chosen ports."""
    layout.root.mkdir(parents=True, exist_ok=True)
    config.save(layout.federation)
    init_ca(layout.certs, name=config.name)
    parties = [config.guardian, config.student, *config.teacher_names]
    for party in parties:
        issue_certificate(layout.certs, party, out_dir=layout.certs)
    for role in ROLES:
        write_admin_token(layout.admin_token(role))
    endpoints = Endpoints(
        guardian_grpc=free_port(), student_grpc=free_port(), admin={p: free_port() for p in parties}
    )
    guardian_address, student_address = endpoints.guardian_address, endpoints.student_address

    def common(party: str) -> dict[str, Any]:
        return _common_site(party, role=str(config.role_of(party)), admin_port=endpoints.admin[party])

    guardian_site = {
        **common(config.guardian),
        "grpc": {"bind": guardian_address},
        "ledger": f"../parties/{config.guardian}/ledger.sqlite",
        # the operator's reason to run what the pre-spend checks refuse as a judgement (the guardian logs it)
        **({"force": options.force} if options.force is not None else {}),
        # the dashboard and `capc budget watch` relay the student's progress from its admin API, with the
        # student's token (over loopback here; across machines over HTTPS)
        "student_admin": {
            "url": f"http://127.0.0.1:{endpoints.admin[config.student]}",
            "token_file": "../tokens/student.token",
        },
    }
    _write_yaml(layout.site(config.guardian), guardian_site)
    student_site: dict[str, Any] = {
        **common(config.student),
        "grpc": {"bind": student_address},
        "guardian_address": guardian_address,
        "store": f"../parties/{config.student}/labels.sqlite",
        "output_dir": f"../parties/{config.student}/published",
        "torch_threads": options.student_threads,
        "feature_cache": "../feature-cache",  # the parties share one machine: public features once
        "pipeline_depth": options.pipeline_depth,
        "train": {
            "device": "auto",
            "evaluate": None
            if options.evaluation_images is None
            else {"dataset": options.dataset, "limit": options.evaluation_images},
        },
    }
    _write_yaml(layout.site(config.student), student_site)
    fraction, cap = site_fraction(options), site_cap(config, options)
    for index, name in enumerate(config.teacher_names):
        data = {"dataset": options.dataset, "shard": index, "shards": options.parties, "seed": options.seed,
                "fraction": fraction}  # fmt: skip
        write_teacher_site(
            layout, config, options, name=name, endpoints=endpoints, data=data, cap=cap, protocol=protocol
        )
    for party in parties:
        layout.party_dir(party).mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    return endpoints


def _common_site(party: str, *, role: str, admin_port: int) -> dict[str, Any]:
    """The site-file fields every party of a local federation has (paths relative to ``sites/``; the admin
    token is its role's)."""
    return {
        "party": party,
        "federation": "../federation.yaml",
        "tls": {"ca": "../certs/ca.crt", "cert": f"../certs/{party}.crt", "key": f"../certs/{party}.key"},
        "admin": {"bind": f"127.0.0.1:{admin_port}", "token_file": f"../tokens/{role}.token"},
    }


def write_teacher_site(
    layout: Layout,
    config: FederationConfig,
    options: LocalOptions,
    *,
    name: str,
    endpoints: Endpoints,
    data: Mapping[str, Any],
    cap: float,
    protocol: ReleaseProtocol | None = None,
) -> None:
    """Write simulated hospital ``name``'s site file and create its cap record under ``config`` (the
    explicit init a real site makes with ``capc teacher init-cap``), at the order a new record charges at
    (:func:`~capc_common.federation.cap_order`).

    Args:
        layout: the state directory.
        config: the federation the hospital is a teacher party of.
        options: the federation's options (threads, records cache).
        name: the hospital.
        endpoints: the federation's ports (its own admin port included).
        data: its ``data:`` section.
        cap: its local ε cap (:func:`site_cap`).
        protocol: the federation's release protocol, under a release mechanism (what a release costs).
    """
    records = ".." if options.records_from is None else os.path.relpath(options.records_from, layout.sites)
    _write_yaml(
        layout.site(name),
        {
            **_common_site(name, role="teacher", admin_port=endpoints.admin[name]),
            "student_address": endpoints.student_address,
            "guardian_address": endpoints.guardian_address,
            "heads": f"../parties/{name}/heads.safetensors",
            "cap": {"epsilon": cap, "record": f"../parties/{name}/cap.jsonl"},
            # The simulated hospitals opt in to what the options asked for (a real site decides itself).
            "allow_insecure_noise": config.insecure_noise,
            "torch_threads": options.torch_threads,
            "feature_cache": "../feature-cache",
            "records_cache": f"{records}/parties/{name}/records",
            "data": dict(data),
            # compared on after the federation (`capc teacher personalise`); the federation never sees it
            "holdout": {"fraction": site_holdout(options)},
        },
    )
    layout.party_dir(name).mkdir(parents=True, exist_ok=True)
    order = cap_order(exposure_of(config, protocol=protocol), delta=config.budget.delta)
    LocalCap.init(layout.party_dir(name) / "cap.jsonl", config=config, order=order)
