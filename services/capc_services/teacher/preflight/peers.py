"""Preflight of the party's place in the federation: its peers over mutual TLS, and its own ε cap."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.errors import CapcError
from capc_common.federation import FederationConfig, batch_costs, cap_cover, plan_batches, usable_queries
from capc_common.privacy import RenyiFilter
from capc_services.common.interceptors import HASH_HEADER
from capc_services.teacher.preflight.report import Check
from capc_services.teacher.settings import TeacherSettings
from capc_services.tls import TlsFiles


def peer_check(
    name: str, *, tls: TlsFiles, address: str, peer: str, config_hash: str, timeout: float = 10.0
) -> Check:
    """Dial ``peer`` at ``address`` as this party would: mTLS handshake (the server must be certified as
    ``peer`` by the federation CA and accept this party's certificate), health SERVING, same federation hash.

    The health service answers any certificate of the federation CA that is not revoked, with the server's
    federation-config hash in its reply headers.
    """
    fix_reach = (
        f"check {name}_address in the site file ({address}) and that this machine may dial it (TCP); "
        f"the server must present a certificate for {peer!r} signed by the federation CA"
    )
    try:
        channel = tls.channel(address, peer=peer)
    except CapcError as exc:
        return Check.skip(name, f"this party's TLS files are unusable ({exc})")
    start = time.perf_counter()
    try:
        reply, call = health_pb2_grpc.HealthStub(channel).Check.with_call(
            health_pb2.HealthCheckRequest(), metadata=((HASH_HEADER, config_hash),), timeout=timeout
        )
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return Check.fail(
                name,
                f"{peer} at {address} refused this party's certificate: {details}",
                fix="request and get signed a new certificate (`capc cert request`, `capc cert sign`)",
            )
        return Check.fail(
            name,
            f"cannot reach {peer} at {address} over mutual TLS within {timeout:g} s ({code.name}: {details})",
            fix=fix_reach,
        )
    finally:
        channel.close()
    ms = round(1000 * (time.perf_counter() - start), 1)
    theirs = dict(call.initial_metadata() or ()).get(HASH_HEADER)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return Check.fail(
            name,
            f"{peer} at {address} answers but is not serving (status {reply.status})",
            fix=f"ask the {peer} operator; it reports not serving until it has started completely",
        )
    if theirs is None:
        return Check.warn(
            name,
            f"{peer} at {address} is reachable over mTLS ({ms} ms) but did not report its federation hash",
            fix=f"the {peer} runs an older capc; the first batch will tell whether the federations agree",
        )
    if theirs != config_hash:
        return Check.fail(
            name,
            f"{peer} at {address} runs federation config {theirs[:16]}…, this site has {config_hash[:16]}…; "
            "it would refuse every call",
            fix="get the current federation.yaml from the coordinator: every party must load the same file",
            theirs=theirs,
        )
    return Check.ok(
        name, f"{peer} at {address}: mTLS, serving, same federation ({config_hash[:16]}…), {ms} ms", ms=ms
    )


def cap_check(settings: TeacherSettings, config: FederationConfig) -> Check:
    """The local ε cap: what this party has spent, and what the federation may still cost it.

    Measured against the same figure ``capc local up`` gives its hospitals by default
    (:func:`~capc_common.federation.cap_cover`): the worst case of every batch of the plan that the
    federation's own limit can admit — what the cap charges for each batch the party answers.
    """
    from capc_services.teacher.cap import LocalCap

    cap_eps = settings.cap.epsilon
    try:
        limit = RenyiFilter.for_budget(epsilon=cap_eps, delta=config.budget.delta, order=config.budget.order)
    except CapcError as exc:
        return Check.fail(
            "local_cap",
            f"cap.epsilon {cap_eps:g}: {exc}",
            fix="raise cap.epsilon (the federation's δ and Rényi order are fixed by federation.yaml)",
        )
    try:
        # A read-only view: this check runs beside a serving teacher, which holds the record's lock.
        cap = LocalCap(settings.cap.record, config=config, epsilon_cap=cap_eps, exclusive=False)
    except CapcError as exc:
        return Check.fail(
            "local_cap",
            str(exc),
            fix="create the record once with `capc teacher init-cap` (a new site), restore it from backup, "
            "or give this federation its own cap.record",
        )
    costs, cover = batch_costs(config), cap_cover(config)
    batches = plan_batches(config)[: cover.admissible_batches]
    spent, fits = cap.rdp, 0
    for count in batches:
        if spent + costs.worst_case(count) > limit.budget_rdp:
            break
        spent += costs.worst_case(count)
        fits += 1
    plan_eps = limit.epsilon_of(cap.rdp + cover.rdp)
    federation_eps = config.budget.epsilon
    data = {
        "epsilon_cap": cap_eps,
        "epsilon_spent": cap.epsilon,
        "plan_batches": cover.plan_batches,
        "plan_queries": usable_queries(config),
        "admissible_batches": cover.admissible_batches,
        "epsilon_covering": cover.cap,
        "plan_epsilon_worst_case": plan_eps,
        "batches_within_cap": fits,
    }
    plan = (
        f"the federation's limit ε {federation_eps:g} admits at most {cover.admissible_batches} of its "
        f"{cover.plan_batches} planned batches"
        if cover.admissible_batches < cover.plan_batches
        else f"the federation's {cover.plan_batches} planned batches all fit its limit ε {federation_eps:g}"
    )
    head = (
        f"cap ε {cap_eps:g} (spent {cap.epsilon:.3g} on {cap.batches} batches); {plan}, and their worst case "
        f"costs at most ε {plan_eps:.3g} against this cap"
    )
    why = f"covering this federation takes a cap of ε {cover.cap:g}" + (
        f", above its limit ε {federation_eps:g}: this cap counts every query the party votes on as answered "
        "(it never sees which were), the federation's ledger only the answered ones"
        if cover.cap > federation_eps
        else ""
    )
    if fits == len(batches):
        return Check.ok("local_cap", f"{head}: fits", **data)
    if fits == 0:
        return Check.fail(
            "local_cap",
            f"{head}: not even one more batch fits, so this party would refuse every batch ({why})",
            fix=f"raise cap.epsilon above {limit.epsilon_of(cap.rdp + costs.worst_case(batches[0])):.3g} if "
            "your organisation accepts it, or agree a smaller plan with the coordinator",
            **data,
        )
    return Check.warn(
        "local_cap",
        f"{head}: the cap stops this party after {fits} of those {len(batches)} batches (then it refuses; "
        f"the federation goes on without it if its quorum allows); {why}",
        fix=f"raise cap.epsilon to {plan_eps:.3g} to answer every batch the federation can run, if your "
        "organisation accepts it",
        **data,
    )
