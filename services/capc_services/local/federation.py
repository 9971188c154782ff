"""``capc local up|status|down`` as functions (the CLI, the demo, the e2e tests and the benchmark use them).

``up`` provisions a state directory on first use (certificates, configs, ports, token), trains each teacher
party's heads from its own data if they are missing, starts every party as its own process and waits for
all of them to be ready. Run again on the same directory it resumes the same federation: the ledger, the
label store and every party's cap record carry on.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from capc_common.errors import InputError
from capc_common.federation import FederationConfig, ReleaseMember, mechanism_of
from capc_services.guardian.settings import GuardianSettings
from capc_services.local.layout import Layout
from capc_services.local.processes import (
    PartyProcess,
    Placement,
    federation_of,
    is_ours,
    not_started,
    probe,
    processes_of,
    read_state,
    start_party,
    stop_processes,
    token,
    train_parties,
    wait_ready,
    write_state,
)
from capc_services.local.provision import (
    RESTATED,
    ROLES,
    Endpoints,
    LocalOptions,
    options_record,
    provision,
    recorded_options,
    restate_force,
)

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    """Default progress sink: say nothing."""


def _flag(name: str, value: Any) -> str:
    """``--batch-size 64``: an option as ``capc local up`` spells it."""
    if name == "mechanism_params":
        pairs = [f"--mechanism-param {k}={v}" for k, v in (value or {}).items()]
        return " ".join(pairs) or "no --mechanism-param"
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return f"--{name.replace('_', '-')} {shown}"


def check_resume(layout: Layout, options: LocalOptions, *, given: Collection[str] | None = None) -> None:
    """Refuse to resume the federation in ``layout`` with options other than those it was provisioned with.

    Its federation.yaml, ledger, label store and every party's cap record are bound to those options, and
    none of them is safe to change in place: raising the ledger's limit, above all, would change the
    guarantee of what the federation already released. So a difference is refused, with the way to get it.
    ``--force``'s reason is the operator's word, bound to none of them (:data:`RESTATED`): it is not compared.

    Args:
        layout: a provisioned state directory.
        options: the options of this ``up``.
        given: the options the user set explicitly (the rest are defaults, not requests); None: all.

    Raises:
        InputError: an option differs from the recorded one, or options were given for a federation
            provisioned before options were recorded.
    """
    wanted = options_record(options)
    names = [name for name in wanted if name not in RESTATED and (given is None or name in given)]
    recorded = recorded_options(layout)
    if recorded is None:
        if names and given is not None:
            config = federation_of(layout)
            asked = ", ".join(_flag(n, wanted[n]) for n in names)
            raise InputError(
                f"the federation in {layout.root} was provisioned before `capc local up` recorded its "
                f"options, so {asked} cannot be checked against it (its "
                f"federation.yaml: ε {config.budget.epsilon:g}, δ {config.budget.delta:g}, "
                f"{len(config.teachers)} parties); resume it without options: `{layout.command('up')}`"
            )
        return
    changed = [name for name in names if recorded.get(name) != wanted[name]]
    if not changed:
        return
    was = ", ".join(_flag(n, recorded.get(n)) for n in changed)
    now = " ".join(_flag(n, wanted[n]) for n in changed)
    budget = any(n in ("epsilon", "delta", "order") for n in changed)
    raise InputError(
        f"the federation in {layout.root} was provisioned with {was}; this `up` asked for {now}. A local "
        "federation resumes with the options it was provisioned with: its federation.yaml, ledger and every "
        "party's cap record are bound to them"
        + (
            ", and changing the budget of a ledger that already charged batches would change the guarantee "
            "of what it released"
            if budget
            else ""
        )
        + f". To run with {now}, provision a new federation in another directory: `capc local up "
        f"--state-dir NEW_DIR {now}`; or delete this one (ledger, labels, certificates) and start over: "
        f"`{layout.command('down')} --purge`. To resume this one: `{layout.command('up')}` without those "
        "options."
    )


def ensure_provisioned(
    root: str | Path, options: LocalOptions, *, given: Collection[str] | None = None, say: Say = _quiet
) -> tuple[Layout, FederationConfig]:
    """The federation in ``root``, provisioned from ``options`` first if there is none.

    Args:
        root: the state directory.
        options: the options to provision with; a federation already there must have been provisioned
            with the same ones (:func:`check_resume`), but for ``force``, which a resumed one takes as the
            new reason to run it (:func:`~capc_services.local.provision.restate_force`).
        given: the options the user set explicitly (None: all of them count).
        say: receives one-line progress messages.

    Returns:
        The layout and the federation config.

    Raises:
        InputError: the federation in ``root`` is running or was provisioned with other options, or the
            options are invalid.
    """
    layout = Layout(Path(root).resolve())
    if layout.state.exists():
        running = [p.party for p in processes_of(read_state(layout)) if is_ours(p)]
        if running:
            raise InputError(
                f"the federation in {layout.root} is already running ({running}); "
                f"`{layout.command('down')}` it first"
            )
    if layout.federation.exists():
        check_resume(layout, options, given=given)
        say(f"resuming the federation in {layout.root}")
        config = federation_of(layout)
        if options.force is not None and (given is None or "force" in given):
            restate_force(layout, config, options.force)
        return layout, config
    say(f"provisioning a new federation in {layout.root}")
    layout, config, endpoints = provision(layout.root, options)
    write_state(layout, endpoints=endpoints, processes=[])
    return layout, config


def prepare(
    root: str | Path, options: LocalOptions, *, given: Collection[str] | None = None, say: Say = _quiet
) -> tuple[Layout, FederationConfig]:
    """The federation in ``root`` (provisioned from ``options`` first if there is none), with every teacher
    party's heads trained.

    Teacher parties without a heads file train theirs (``capc teacher train``, each in its own process, all at
    once) when the mechanism votes with heads; heads placed in ``parties/<name>/heads.safetensors`` beforehand
    are used as they are. Under Private-kNN a party votes with its own records (featurised when it starts) and
    trains nothing.

    Raises:
        InputError: the federation in ``root`` is already running or was provisioned with other options
            (``given``: the options the user set explicitly, :func:`check_resume`), or the options are
            invalid.
        CapcError: a party's training failed.
    """
    layout, config = ensure_provisioned(root, options, given=given, say=say)
    # Release federations' parties contribute per-example features and Private-kNN's vote with their records:
    # only PATE mechanisms train heads.
    trains = not isinstance(config.mechanism, ReleaseMember) and mechanism_of(config).trains_heads
    untrained = [n for n in config.teacher_names if not (layout.party_dir(n) / "heads.safetensors").exists()]
    if trains and untrained:
        for name in untrained:
            say(f"training {name}'s {config.teacher(name).heads} teacher heads on its own data")
        for name, result in train_parties(layout, untrained).items():
            say(f"  {name}: {result['summary']}")
    return layout, config


def up(
    root: str | Path,
    options: LocalOptions,
    *,
    given: Collection[str] | None = None,
    say: Say = _quiet,
    ready_timeout: float = 180.0,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """Bring a local federation up (:func:`prepare` first) and wait until every party is ready.

    Args:
        root: the state directory.
        options: used when provisioning a new federation; a federation already there must have been
            provisioned with the same ones.
        given: the options the user set explicitly (None: all of them count).
        say: receives one-line progress messages.
        ready_timeout: seconds to wait for every party's ``/readyz``.
        placement: where each party runs (default: this machine's loopback; a lab's namespaces).

    Returns:
        The endpoints summary (what ``capc local up --format json`` prints).

    Raises:
        InputError: the federation in ``root`` is already running, or was provisioned with other options.
        UnavailableError: a party did not become ready (the processes started are stopped again).
    """
    layout, config = prepare(root, options, given=given, say=say)
    start_all(layout, config, say=say, ready_timeout=ready_timeout, placement=placement)
    return summary(layout)


def start_all(
    layout: Layout,
    config: FederationConfig,
    *,
    say: Say = _quiet,
    ready_timeout: float,
    placement: Placement | None = None,
) -> None:
    """Start every party of ``config`` (guardian, student, teachers) where ``placement`` puts it (default:
    this machine's loopback), record them in ``state.json`` and wait until each is ready.

    Raises:
        InputError: a party has no admin port in ``state.json`` (it was not added with ``capc local``).
        UnavailableError: a party did not become ready (the processes started are stopped again).
    """
    endpoints = Endpoints.from_dict(read_state(layout)["endpoints"])
    missing = [p for p in config.party_names if p not in endpoints.admin]
    if missing:
        raise InputError(
            f"{missing} of the federation in {layout.root} have no admin port in its state.json: a party "
            f"added by hand; add parties with `{layout.command('add-party')} NAME`"
        )
    processes = []
    for p in config.party_names:
        role = str(config.role_of(p))
        launch = placement(p, role) if placement else None
        processes.append(
            start_party(layout, party=p, role=role, admin_port=endpoints.admin[p], launch=launch)
        )
    write_state(layout, endpoints=endpoints, processes=processes)
    say(f"started {len(processes)} processes; waiting for readiness")
    try:
        wait_ready(layout, processes, timeout=ready_timeout, on_ready=lambda p: say(f"  {p.party} ready"))
    except Exception:
        stop_processes(processes, grace=5)
        raise


def summary(layout: Layout) -> dict[str, Any]:
    """Endpoints of a started federation (the ``up`` output)."""
    state = read_state(layout)
    endpoints = state["endpoints"]
    processes = processes_of(state)
    by_party = {p.party: p for p in processes}
    config = federation_of(layout)
    return {
        "state_dir": str(layout.root),
        "federation": config.name,
        "config_hash": config.config_hash(),
        "admin_tokens": {role: str(layout.admin_token(role)) for role in ROLES},
        "guardian": {
            "grpc": f"127.0.0.1:{endpoints['guardian_grpc']}",
            "admin": by_party[config.guardian].admin_url if config.guardian in by_party else None,
            "budget": f"{by_party[config.guardian].admin_url}/api/v1/budget"
            if config.guardian in by_party
            else None,
            "dashboard": f"{by_party[config.guardian].admin_url}/dashboard"
            if config.guardian in by_party
            else None,
            "ledger": str(GuardianSettings.load(layout.site(config.guardian)).ledger),
        },
        "student": {
            "grpc": f"127.0.0.1:{endpoints['student_grpc']}",
            "admin": by_party[config.student].admin_url if config.student in by_party else None,
            "progress": f"{by_party[config.student].admin_url}/api/v1/progress"
            if config.student in by_party
            else None,
        },
        "teachers": {
            name: {"admin": by_party[name].admin_url if name in by_party else None}
            for name in config.teacher_names
        },
        "logs": str(layout.logs),
        "pids": {p.party: p.pid for p in processes},
    }


def party_state(proc: PartyProcess, secret: str, *, ca: Path | None = None) -> dict[str, Any]:
    """One party's ``status`` entry: ``state`` is ``running`` only when its process lives *and* it reports
    ready; ``failed`` when it lives but a readiness check says it failed for good (e.g. the student's
    labelling loop); ``not ready`` while it starts or reconnects; ``not running`` when the process is gone.
    ``secret`` is the party's admin token: with it ``/readyz`` says why a check fails; ``ca`` verifies an
    ``https://`` party."""
    entry: dict[str, Any] = {"role": proc.role, "pid": proc.pid, "process": "alive", "ready": False}
    if not is_ours(proc):
        return {**entry, "process": "not running", "state": "not running", "running": False}
    code, body = probe(f"{proc.admin_url}/readyz", token=secret, ca=ca, party=proc.party)
    failing = {}
    if isinstance(body, dict):
        failing = {name: c.get("detail") for name, c in body.get("checks", {}).items() if not c.get("ok")}
    failed = any(isinstance(d, dict) and d.get("state") == "failed" for d in failing.values())
    state = "running" if code == 200 else ("failed" if failed else "not ready")
    entry.update(ready=code == 200, state=state, running=state == "running")
    if failing:
        entry["failing"] = failing
    elif code != 200:
        entry["failing"] = {"admin": body}
    return entry


def status(root: str | Path) -> dict[str, Any]:
    """Each party's process and readiness (every party of the federation.yaml in force, started or not),
    the guardian's budget and the student's progress."""
    layout = Layout(Path(root).resolve())
    state = read_state(layout)
    config = federation_of(layout)
    recorded = {proc.party: proc for proc in processes_of(state)}
    ca = layout.certs / "ca.crt"
    parties = {
        name: party_state(recorded[name], token(layout, name), ca=ca)
        if name in recorded
        else _never_started(config, name)
        for name in config.party_names
    }
    admin = {p.party: p.admin_url for p in processes_of(state)}
    result: dict[str, Any] = {"state_dir": str(layout.root), "parties": parties}
    if parties.get(config.guardian, {}).get("process") == "alive":
        guardian = token(layout, config.guardian)
        result["budget"] = probe(
            f"{admin[config.guardian]}/api/v1/budget", token=guardian, ca=ca, party=config.guardian
        )[1]
    if parties.get(config.student, {}).get("process") == "alive":
        student = token(layout, config.student)
        result["progress"] = probe(
            f"{admin[config.student]}/api/v1/progress", token=student, ca=ca, party=config.student
        )[1]
    return result


def _never_started(config: FederationConfig, party: str) -> dict[str, Any]:
    """The ``status`` entry of a party no process was started for yet (e.g. added while the federation was
    down)."""
    role = config.role_of(party)
    return {"role": role, "pid": None, "process": "not running", "ready": False, "state": "not running",
            "running": False}  # fmt: skip


def _party(layout: Layout, party: str) -> tuple[str, int, PartyProcess | None]:
    """A party's role, admin port and recorded process (None: never started).

    Raises:
        InputError: ``party`` is not a party of the federation.yaml in force, or has no admin port.
    """
    config, state = federation_of(layout), read_state(layout)
    role = config.role_of(party)
    if role is None:
        raise InputError(
            f"{party!r} is not a party of the federation in {layout.root}; parties: "
            f"{list(config.party_names)}"
        )
    port = Endpoints.from_dict(state["endpoints"]).admin.get(party)
    if port is None:
        raise InputError(
            f"{party} has no admin port in {layout.state}: it was added by hand; add parties with "
            f"`{layout.command('add-party')} NAME`"
        )
    recorded = {p.party: p for p in processes_of(state)}
    return role, port, recorded.get(party)


def _record(layout: Layout, process: PartyProcess) -> None:
    """Put ``process`` into ``state.json`` in place of the party's earlier one."""
    state = read_state(layout)
    others = [p for p in processes_of(state) if p.party != process.party]
    write_state(layout, endpoints=Endpoints.from_dict(state["endpoints"]), processes=[*others, process])


def restart(
    root: str | Path,
    party: str,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout: float | None = None,
) -> PartyProcess:
    """Start one party of a started federation again (stopping it first if it still runs), where it ran
    before (its :class:`~capc_services.local.processes.Launch`); its new process id goes into ``state.json``,
    so ``status`` and ``down`` see it.

    Args:
        root: the state directory.
        party: the party to start.
        env: extra environment for the process.
        ready_timeout: wait this many seconds for its ``/readyz`` (None: return once started; a chaos run
            restarts parties that are meant to die).

    Raises:
        InputError: no such party.
        UnavailableError: with ``ready_timeout``, the process exited (the reason from its log) or was not
            ready in time.
    """
    layout = Layout(Path(root).resolve())
    role, port, old = _party(layout, party)
    if old is not None and is_ours(old):
        stop_processes([old])
    launch = old.launch() if old is not None else None
    new = start_party(layout, party=party, role=role, admin_port=port, env=env, launch=launch)
    _record(layout, new)
    if ready_timeout is not None:
        wait_ready(layout, [new], timeout=ready_timeout)
    return new


def stop(root: str | Path, party: str, *, grace: float = 15.0) -> dict[str, str]:
    """Stop one party of a started federation (SIGTERM, then SIGKILL after ``grace`` seconds); the others
    carry on, and ``restart`` starts it again.

    Returns:
        ``party`` and ``outcome`` (``stopped``, ``killed`` or ``not running``).

    Raises:
        InputError: no such party.
    """
    layout = Layout(Path(root).resolve())
    _, _, old = _party(layout, party)
    outcome = stop_processes([old], grace=grace)[party] if old is not None else "not running"
    return {"party": party, "outcome": outcome}


def down(root: str | Path, *, purge: bool = False) -> dict[str, Any]:
    """Stop every process ``up`` started; with ``purge`` also delete the state directory.

    Returns:
        ``state_dir``, ``processes`` (party → ``stopped``, ``killed`` or ``not running``) and ``purged``.

    Raises:
        InputError: no federation was started in ``root`` (nothing is stopped: a federation started from
            another state directory keeps running), or ``purge`` of a directory that is not a local
            federation.
    """
    layout = Layout(Path(root).resolve())
    if purge and not layout.federation.exists():
        raise InputError(f"{layout.root} holds no local federation (no federation.yaml); not deleting it")
    outcome: dict[str, str] = {}
    if layout.state.exists():
        outcome = stop_processes(processes_of(read_state(layout)))
    elif not purge:
        raise not_started(layout)
    if purge:
        shutil.rmtree(layout.root)
    return {"state_dir": str(layout.root), "processes": outcome, "purged": purge}
