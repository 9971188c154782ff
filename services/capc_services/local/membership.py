"""``capc local add-party`` / ``retire-party``: a local consortium's membership change in one command.

The flow is the documented one (docs/operations.md, "Add or retire a hospital"), each step by the library
call its manual command makes: the new ``federation.yaml`` (:func:`capc_common.federation.add_party`), the new
hospital's certificate, site file, cap record (``capc teacher init-cap``'s call) and heads (``capc teacher
train``, under the new file); then the student stops asking, the guardian records the change on its ledger
(``capc guardian membership``'s request: one admin-authorised entry, after which it stops), the new file is
installed in the state directory, and every party starts again under it. ``state.json`` and
``options.json`` follow, so ``status``, ``down`` and ``up`` see the new membership.

Until the guardian has recorded the change nothing of the running federation is touched, and what was
prepared for it is removed again if a step fails. Once recorded, the ledger has moved on: the new file is
installed at once, so a later failure (a party that does not start) is finished by ``capc local up``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from capc_common.errors import InputError, UnavailableError
from capc_common.federation import FederationConfig, add_party, mechanism_of, retire_party
from capc_services.guardian.membership_client import record_membership
from capc_services.local.federation import start_all
from capc_services.local.layout import Layout
from capc_services.local.processes import (
    PartyProcess,
    federation_of,
    is_ours,
    pid_alive,
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
    Endpoints,
    LocalOptions,
    free_port,
    recorded_options,
    site_cap,
    write_teacher_site,
)
from capc_services.tls import certificate_info, issue_certificate

Say = Callable[[str], None]

#: Seconds the guardian has to stop by itself once it recorded the change.
_GUARDIAN_STOPS_S = 30.0
#: The finest split of the dataset's hash range :func:`free_slice` tries.
_MAX_PARTS = 4096
#: Room left between a new site's share of the hash range and its neighbours' (their bounds are floats; the
#: selection compares integers, so two shares that touch could round into one another).
_GAP = 1e-9


def _quiet(_: str) -> None:
    """Default progress sink: say nothing."""


def add(
    root: str | Path,
    *,
    name: str,
    heads: int | None = None,
    min_parties: int | None = None,
    dataset: str | None = None,
    say: Say = _quiet,
    ready_timeout: float = 180.0,
) -> dict[str, Any]:
    """Add simulated hospital ``name`` to the local federation in ``root``.

    Args:
        root: the state directory.
        name: the new teacher party (a DNS label).
        heads: its teacher heads (None: the mechanism's votes per party, else its peers' heads).
        min_parties: a new quorum (None: keep it).
        dataset: its own data (a dataset name, ``npz:``/``folder:`` path; None: a slice of the federation's
            dataset no other site of this directory holds, :func:`free_slice`).
        say: receives one-line progress messages.
        ready_timeout: seconds to wait for every party's ``/readyz`` after the change.

    Returns:
        What changed: ``change``, both config hashes, the guardian's ``entry``, ``teachers``, ``running``.

    Raises:
        InputError: the change is refused (a release mechanism, a name taken, a quorum that cannot be met,
            no data left for the hospital), by the library's rule or the guardian.
        UnavailableError: the guardian could not record the change, or a party did not start again after it
            (then `capc local up` finishes it).
    """
    layout = Layout(Path(root).resolve())
    old = federation_of(layout)
    options = _options(layout)
    new = add_party(old, name=name, heads=heads or _peer_heads(old), min_parties=min_parties)
    _check_unused(layout, old, name)
    data = own_data(layout, dataset) if dataset is not None else free_slice(layout, old)
    staged = _staged(layout, new)
    try:
        say(f"{name}: certificate, site file and cap record under config {new.config_hash()[:16]}…")
        issue_certificate(layout.certs, name, out_dir=layout.certs)
        endpoints = Endpoints.from_dict(read_state(layout)["endpoints"])
        endpoints.admin[name] = free_port()
        cap = site_cap(new, options)
        write_teacher_site(layout, new, options, name=name, endpoints=endpoints, data=data, cap=cap)
        if mechanism_of(new).trains_heads:  # its folder is new (a name with files is refused above)
            say(f"{name}: training its {new.teacher(name).heads} teacher heads on its own data")
            train_parties(layout, [name], env={"CAPC_FEDERATION": str(staged)})
        result = _switch(layout, old, new, say=say, ready_timeout=ready_timeout, admin=endpoints.admin)
    except BaseException as exc:
        if not isinstance(exc, _Recorded):  # not on the ledger: nothing of the new party stays
            _unstage_party(layout, name)
        raise
    finally:
        staged.unlink(missing_ok=True)
    return result


def _check_unused(layout: Layout, config: FederationConfig, name: str) -> None:
    """Refuse a name whose files are in ``layout``: a retired hospital's (its cap record is its own account
    of what it released, never overwritten), or those an interrupted ``add-party`` left.

    Raises:
        InputError: saying which of the two, and what to do.
    """
    places = (layout.site(name), layout.party_dir(name), layout.certs / f"{name}.crt")
    files = [p for p in places if p.exists()]
    if not files:
        return
    listed = ", ".join(map(str, files))
    if any(name in change.retired for change in config.history):
        raise InputError(
            f"{name} was a party of the federation in {layout.root} before, and its files stay there "
            f"({listed}): give the new hospital another name"
        )
    raise InputError(
        f"{name} has files in {layout.root} ({listed}), but no membership change of its federation.yaml "
        f"added it: an interrupted `{layout.command('add-party')} {name}` left them (the hospital never "
        "answered a batch, so its cap record holds no charge); remove them and add it again"
    )


def retire(
    root: str | Path,
    *,
    name: str,
    min_parties: int | None = None,
    reason: str = "",
    say: Say = _quiet,
    ready_timeout: float = 180.0,
) -> dict[str, Any]:
    """Retire hospital ``name`` of the local federation in ``root``: it leaves the teacher list, its
    certificate is revoked in the new file, its process stops; its cap record and site file stay (its own
    account of the ε it released).

    Raises:
        InputError: the change is refused (a release mechanism, not a teacher party, the last one, a quorum
            above the parties left: give ``min_parties``).
        UnavailableError: as for :func:`add`.
    """
    layout = Layout(Path(root).resolve())
    old = federation_of(layout)
    old.teacher(name)  # not a teacher party: refused before its certificate is looked for
    serial = certificate_info(layout.certs / f"{name}.crt").serial
    new = retire_party(old, name=name, serial=serial, reason=reason, min_parties=min_parties)
    staged = _staged(layout, new)
    try:
        admin = Endpoints.from_dict(read_state(layout)["endpoints"]).admin
        return _switch(layout, old, new, say=say, ready_timeout=ready_timeout, admin=admin)
    finally:
        staged.unlink(missing_ok=True)


class _Recorded(UnavailableError):
    """The guardian recorded the change but the federation did not start again under it: nothing to undo,
    `capc local up` finishes it."""


def _switch(
    layout: Layout,
    old: FederationConfig,
    new: FederationConfig,
    *,
    say: Say,
    ready_timeout: float,
    admin: Mapping[str, int],
) -> dict[str, Any]:
    """Stop the student, have the guardian record ``old`` → ``new``, install ``new`` and start the parties
    that ran before (all of ``new``'s) again."""
    change = new.history[-1]
    state = read_state(layout)
    processes = {p.party: p for p in processes_of(state) if is_ours(p)}
    running = bool(processes)
    student = processes.pop(old.student, None)
    guardian = processes.pop(old.guardian, None)
    started = guardian is None
    try:
        if student is not None:
            say(f"stopping the student: no batch is asked across the change ({change.describe()})")
            stop_processes([student])
        if guardian is None:  # a federation that is down: its guardian starts alone to record the change
            say("starting the guardian to record the change")
            guardian = start_party(
                layout, party=old.guardian, role="guardian", admin_port=admin[old.guardian]
            )
            wait_ready(layout, [guardian], timeout=ready_timeout)
        reply = record_membership(
            guardian.admin_url,
            token=token(layout, old.guardian),
            config=new,
            ca=layout.certs / "ca.crt",
            party=old.guardian,
        )
    except Exception:  # not recorded: the federation carries on as it was
        if started and guardian is not None:
            stop_processes([guardian], grace=5)
        if student is not None:
            _restart_student(layout, old, admin=admin, ready_timeout=ready_timeout)
        raise
    try:  # the ledger has moved on: from here a failure is finished forward, never undone
        new.save(layout.federation)
        say(f"ledger entry {reply['entry']}: {change.describe()}; installed the new federation.yaml")
        _wait_exit(guardian)
        stop_processes(list(processes.values()))  # the teachers, the retired one included
        _record_membership(layout, new, admin=admin)
        if running:
            start_all(layout, new, say=say, ready_timeout=ready_timeout)
    except BaseException as exc:
        raise _Recorded(
            f"the guardian recorded the change (ledger entry {reply['entry']}: {change.describe()}), but the "
            f"federation did not start again under it: {exc}; fix that, then `{layout.command('down')}` and "
            f"`{layout.command('up')}` (the new federation.yaml is in place)"
        ) from exc
    return {
        "state_dir": str(layout.root),
        "change": change.describe(),
        "added": list(change.added),
        "retired": list(change.retired),
        "previous_config_hash": old.config_hash(),
        "config_hash": new.config_hash(),
        "entry": reply["entry"],
        "teachers": list(new.teacher_names),
        "min_parties": new.quorum.min_parties,
        "running": running,
    }


def _restart_student(
    layout: Layout, config: FederationConfig, *, admin: Mapping[str, int], ready_timeout: float
) -> None:
    """Start the student again after a change the guardian refused (the federation carries on as it was)."""
    student = start_party(layout, party=config.student, role="student", admin_port=admin[config.student])
    state = read_state(layout)
    others = [p for p in processes_of(state) if p.party != config.student]
    write_state(layout, endpoints=Endpoints.from_dict(state["endpoints"]), processes=[*others, student])
    wait_ready(layout, [student], timeout=ready_timeout)


def _wait_exit(guardian: PartyProcess) -> None:
    """Wait for the guardian to stop by itself after recording the change (stop it if it does not)."""
    deadline = time.monotonic() + _GUARDIAN_STOPS_S
    while pid_alive(guardian.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop_processes([guardian], grace=5)


def _record_membership(layout: Layout, new: FederationConfig, *, admin: Mapping[str, int]) -> None:
    """``state.json`` without the retired parties' processes, with every party's admin port; ``options.json``
    with the new number of parties and quorum (so ``up --parties N`` matches what runs)."""
    state = read_state(layout)
    endpoints = Endpoints.from_dict(state["endpoints"])
    endpoints = Endpoints(endpoints.guardian_grpc, endpoints.student_grpc, admin=dict(admin))
    kept = [p for p in processes_of(state) if p.party in new.party_names]
    write_state(layout, endpoints=endpoints, processes=kept)
    record = recorded_options(layout)
    if record is not None:
        record.update(parties=len(new.teachers), min_parties=new.quorum.min_parties)
        layout.options.write_text(json.dumps(record, indent=2))


def _staged(layout: Layout, new: FederationConfig) -> Path:
    """The new federation.yaml beside the one in force: a new party trains under it before it is installed."""
    path = layout.root / "federation-next.yaml"
    new.save(path)
    return path


def _unstage_party(layout: Layout, name: str) -> None:
    """Remove what :func:`add` prepared for ``name`` (the change was not recorded)."""
    for path in (layout.site(name), layout.certs / f"{name}.crt", layout.certs / f"{name}.key"):
        path.unlink(missing_ok=True)
    shutil.rmtree(layout.party_dir(name), ignore_errors=True)


def _options(layout: Layout) -> LocalOptions:
    """The options the federation was provisioned with (the defaults when it predates options.json)."""
    record = recorded_options(layout)
    return LocalOptions(**record) if record is not None else LocalOptions()


def _peer_heads(config: FederationConfig) -> int:
    """A new party's heads: the votes the mechanism fixes per party, else those of the first teacher."""
    return config.mechanism.votes_per_party() or config.teachers[0].heads


def _interval(data: Mapping[str, Any]) -> tuple[float, float]:
    """The share ``[start, end)`` of its dataset's hash range a site's ``data:`` selects
    (:func:`capc_common.data.site_part`: ``shard ≤ u · shards < shard + fraction``)."""
    shards = int(data.get("shards", 1))
    shard, fraction = int(data.get("shard", 0)), float(data.get("fraction", 1.0))
    return shard / shards, (shard + fraction) / shards


def _same_data(spec: str) -> str:
    """``spec`` with its file or folder made absolute (relative to the working directory), so two spellings
    of one file compare equal and a site file stays valid whatever directory its party runs in."""
    kind, sep, location = spec.partition(":")
    if sep and location and kind in ("idx", "npz", "folder"):
        return f"{kind}:{Path(location).resolve()}"
    return f"npz:{Path(spec).resolve()}" if spec.endswith(".npz") else spec


def own_data(layout: Layout, dataset: str) -> dict[str, Any]:
    """The ``data:`` of a hospital that brings its own ``dataset`` (``--dataset``): all of it.

    Raises:
        InputError: a site file of this directory (a retired hospital's included) already selects examples
            from ``dataset``: the new hospital would hold them too, and an example in two hospitals' data
            moves two votes where the accounting allows one.
    """
    spec = _same_data(dataset)
    sites = sorted(layout.sites.glob("*.yaml"))
    holders = [
        path.stem
        for path in sites
        if (data := yaml.safe_load(path.read_text()).get("data")) and _same_data(str(data["dataset"])) == spec
    ]
    if holders:
        raise InputError(
            f"{', '.join(holders)} of {layout.root} already hold examples of {dataset}; a new hospital with "
            "all of it would hold theirs too, and an example in two hospitals' data moves two votes where "
            "the privacy accounting allows one: leave --dataset out (the new hospital gets a part of it that "
            "no site holds), or give it its own data (npz:/path/site.npz from `capc data import`)"
        )
    return {"dataset": spec}


def free_slice(layout: Layout, config: FederationConfig) -> dict[str, Any]:
    """The ``data:`` of a new simulated hospital: as many examples as its peers', from the part of their
    dataset's hash range that no site file of this directory selects (retired hospitals' included), so no
    example is ever in two hospitals' data. A real hospital brings its own (``dataset``).

    Raises:
        InputError: the sites already hold the whole dataset (no ``--train-limit``) or no free part is left.
    """
    sites = [yaml.safe_load(layout.site(n).read_text())["data"] for n in config.teacher_names]
    others = [yaml.safe_load(p.read_text()).get("data") for p in sorted(layout.sites.glob("*.yaml"))]
    peer = sites[0]
    same = [
        d for d in others if d and d.get("dataset") == peer["dataset"] and d.get("seed") == peer.get("seed")
    ]
    taken = sorted(_interval(d) for d in same)
    start, end = _interval(peer)
    length = end - start
    for parts in range(1, min(_MAX_PARTS, int(1 / length)) + 1):
        for part in range(parts):
            low, high = part / parts, part / parts + length
            if all(high <= a - _GAP or low >= b + _GAP for a, b in taken):
                return {**peer, "shard": part, "shards": parts, "fraction": round(length * parts, 12)}
    raise InputError(
        f"the hospitals of {layout.root} already hold all of {peer['dataset']} that a new one's share "
        f"({length:.3g} of it) could come from, and no example may be in two hospitals' data: give the new "
        "hospital its own data with --dataset (npz:/path/site.npz, from `capc data import`), or provision "
        "the federation with a smaller --train-limit"
    )
