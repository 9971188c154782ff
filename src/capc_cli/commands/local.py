"""``capc local``: a complete federation as local processes (no Docker needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, epsilon_text, format_option

_STATE = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".capc/local"),
    show_default=True,
    help="Where the federation keeps certificates, configs, ledgers, logs and state.json.",
)


@click.group("local")
def command() -> None:
    """Run a whole federation (guardian, student, teacher parties) as processes on this machine."""


def _up_text(result: dict[str, Any]) -> str:
    lines = [
        f"federation {result['federation']} is up ({result['state_dir']})",
        f"  guardian  grpc {result['guardian']['grpc']}  admin {result['guardian']['admin']}",
        f"            budget {result['guardian']['budget']}",
        f"            ledger {result['guardian']['ledger']}",
        f"            in a terminal: capc budget show --ledger {result['guardian']['ledger']}",
        f"            dashboard {result['guardian']['dashboard']}#token=<guardian admin token>",
        f"            live: capc budget watch --local {result['state_dir']}",
        f"  student   grpc {result['student']['grpc']}  admin {result['student']['admin']}",
        f"            progress {result['student']['progress']}",
    ]
    lines += [f"  {name:<9} admin {t['admin']}" for name, t in result["teachers"].items()]
    lines += [
        *(f"  {role} admin token: {path}" for role, path in result["admin_tokens"].items()),
        '  (one per role: curl -H "Authorization: Bearer $(cat FILE)" URL)',
        f"  logs: {result['logs']}",
        f"stop it with `capc local down --state-dir {result['state_dir']}`",
    ]
    return "\n".join(lines)


def _mechanism_params(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a mapping, each value read as YAML (so ``rounds=40`` is a number)."""
    import yaml

    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"{pair!r} is not KEY=VALUE (e.g. rounds=40)", param_hint="--mechanism-param"
            )
        params[key] = yaml.safe_load(value)
    return params


@command.command("up")
@_STATE
@click.option("--parties", type=click.IntRange(min=1), default=3, show_default=True, help="Teacher parties.")
@click.option(
    "--teachers-per-party",
    type=click.IntRange(min=1),
    default=25,
    show_default=True,
    help="Teacher heads per party (PATE mechanisms; prompted teachers under prom-pate).",
)
@click.option(
    "--mechanism",
    type=click.Choice(
        ["confident-gnmax", "gnmax", "private-knn", "prom-pate", "dppl", "dppl-public", "secagg-dpsgd"]
    ),
    default="confident-gnmax",
    show_default=True,
    help="How the federation learns: teachers' votes through Confident-GNMax (the default) or GNMax, "
    "Private-kNN votes, prompted teachers' votes through Confident-GNMax (prom-pate), DP prototypes "
    "(dppl, one release), DP prototypes chosen from a synthetic pool by noisy votes (dppl-public, one "
    "release) or secure-aggregation DP-SGD (secagg-dpsgd, one "
    "release per round); see docs/mechanisms.md.",
)
@click.option("--dataset", default="fashion-mnist", show_default=True, help="The teachers' private data.")
@click.option("--epsilon", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True)
@click.option(
    "--delta", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=1e-5, show_default=True
)
@click.option(
    "--order",
    type=click.FloatRange(min=1, min_open=True),
    default=None,
    help="Rényi order of the ledger [default: the one that buys the mechanism the most queries at the "
    "budget, capc budget plan's rule; 10 under a release mechanism, the order its noise is calibrated at].",
)
@click.option("--queries", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=16), default=64, show_default=True)
@click.option("--bn-batch", type=click.IntRange(min=16), default=64, show_default=True)
@click.option("--threshold", type=float, default=None, help="T [default: 0.6 × heads].")
@click.option("--sigma1", type=float, default=None, help="σ1 [default: 0.7 × heads].")
@click.option("--sigma2", type=float, default=None, help="σ2 [default: 0.16 × heads].")
@click.option(
    "--sigma", type=float, default=None, help="σ of gnmax / private-knn [default: 0.16 × votes per query]."
)
@click.option(
    "--neighbours",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="private-knn: k, per party.",
)
@click.option(
    "--sampling-rate",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.2,
    show_default=True,
    help="private-knn: each record's Poisson inclusion probability per query.",
)
@click.option(
    "--min-parties", type=click.IntRange(min=1), default=None, help="Quorum [default: parties − 1]."
)
@click.option(
    "--train-limit", type=click.IntRange(min=1), default=3000, show_default=True, help="Examples/party."
)
@click.option(
    "--teacher-cap",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Each party's local ε cap [default: the worst case of every batch the federation's ε can admit, "
    "so the cap never stops a party before the federation's own limit; a cap below it is refused without "
    "--force; see docs/operations.md].",
)
@click.option(
    "--force",
    metavar="REASON",
    default=None,
    help="Run a federation that the checks before spending refuse as a judgement (e.g. a party whose heads "
    "would all abstain, or a --teacher-cap below the plan), stating why; the guardian logs the reason with "
    "what it overrode. A certain refusal (nothing can be learned whatever the data) cannot be forced.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--insecure-noise-seed",
    type=str,
    default=None,
    help="Seed the guardian's and student's noise, as federation.yaml's mechanism.insecure_noise_seed (NOT "
    "private: only to compare with `capc dietpate run`; the teachers opt in, every party stays on loopback).",
)
@click.option(
    "--mechanism-param",
    "mechanism_params",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set one field of federation.yaml's mechanism (e.g. rounds=40), repeatable; the rest are defaults.",
)
@click.option("--torch-threads", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--ready-timeout", type=float, default=180.0, show_default=True)
@format_option
def up(state_dir: Path, ready_timeout: float, fmt: str, **options: Any) -> None:
    """Start the federation (provisioning it first) and print its endpoints once every party is ready."""
    from click.core import ParameterSource

    from capc_services.local.federation import up as local_up
    from capc_services.local.provision import LocalOptions

    context = click.get_current_context()
    # Only what the user asked for is checked against a federation being resumed; defaults are no requests.
    given = {
        name
        for name in options
        if context.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    }
    options["mechanism_params"] = _mechanism_params(options["mechanism_params"])
    result = local_up(
        state_dir,
        LocalOptions(**options),
        given=given,
        say=lambda line: click.echo(line, err=True),
        ready_timeout=ready_timeout,
    )
    emit(result, fmt, _up_text)


def _status_text(result: dict[str, Any]) -> str:
    lines = [f"federation in {result['state_dir']}"]
    for name, party in result["parties"].items():
        pid = party["pid"] if party["pid"] is not None else "-"
        line = f"  {name:<12} {party['role']:<8} pid {pid:<8} {party['state']}"
        for check, detail in party.get("failing", {}).items():
            line += f"  [{check}: {detail}]"
        lines.append(line)
    budget, progress = result.get("budget"), result.get("progress")
    if isinstance(budget, dict) and "epsilon_spent" in budget:
        lines.append(f"  budget: {epsilon_text(budget)}")
    if isinstance(progress, dict) and "rounds" in progress:  # a release federation
        lines.append(
            f"  student: {progress['state']}, {progress['rounds_done']} of {progress['rounds']} releases"
            + (f"; error: {progress['error']}" if progress.get("error") else "")
        )
    elif isinstance(progress, dict) and "state" in progress:
        lines.append(
            f"  student: {progress['state']}, {progress.get('queries', 0)} queries asked, "
            f"{progress.get('answered', 0)} answered"
            + (f"; waiting {progress['waiting']}" if progress.get("waiting") else "")
            + (f"; error: {progress['error']}" if progress.get("error") else "")
        )
    return "\n".join(lines)


@command.command("status")
@_STATE
@format_option
def status(state_dir: Path, fmt: str) -> None:
    """Show each party's state (running = process alive and ready; not ready; failed; not running), the
    budget and the student's progress."""
    from capc_services.local.federation import status as local_status

    emit(local_status(state_dir), fmt, _status_text)


_READY = click.option(
    "--ready-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=180.0,
    show_default=True,
    help="Seconds to wait for the parties' /readyz.",
)


@command.command("restart")
@_STATE
@click.argument("party")
@_READY
@format_option
def restart(state_dir: Path, party: str, ready_timeout: float, fmt: str) -> None:
    """Start PARTY again (stopping it first if it still runs) and wait until it is ready; the others carry on
    and it resumes where its durable state left off. A party that exits at once fails this command with the
    reason from its log (exit 4)."""
    from capc_services.local.federation import restart as local_restart

    emit(local_restart(state_dir, party, ready_timeout=ready_timeout).to_dict(), fmt)


@command.command("stop")
@_STATE
@click.argument("party")
@format_option
def stop(state_dir: Path, party: str, fmt: str) -> None:
    """Stop PARTY alone (SIGTERM, then SIGKILL after 15 s); the others carry on. `capc local restart PARTY`
    starts it again."""
    from capc_services.local.federation import stop as local_stop

    emit(local_stop(state_dir, party), fmt)


def _membership_text(result: dict[str, Any]) -> str:
    state = "running" if result["running"] else "down (start it with `capc local up`)"
    return "\n".join(
        [
            f"ledger entry {result['entry']}: {result['change']}; config "
            f"{result['previous_config_hash'][:16]}… -> {result['config_hash'][:16]}…; the budget spent so "
            "far carries over",
            f"teacher parties {result['teachers']}, quorum {result['min_parties']}; the federation is "
            + state,
        ]
    )


@command.command("add-party")
@_STATE
@click.argument("name")
@click.option(
    "--heads",
    type=click.IntRange(min=1),
    default=None,
    help="Its teacher heads [default: the votes the mechanism fixes per party, else its peers' heads].",
)
@click.option(
    "--min-parties", type=click.IntRange(min=1), default=None, help="A new quorum (default: keep it)."
)
@click.option(
    "--dataset",
    default=None,
    help="Its own data (a dataset name, npz:/path/site.npz, folder:/path) [default: a part of the "
    "federation's dataset no other hospital of this directory holds, as large as theirs].",
)
@_READY
@format_option
def add_party(
    state_dir: Path,
    name: str,
    heads: int | None,
    min_parties: int | None,
    dataset: str | None,
    ready_timeout: float,
    fmt: str,
) -> None:
    """Add teacher party NAME to the local federation, the whole documented flow: the new federation.yaml,
    NAME's certificate, site file, cap record and heads, the guardian's membership entry (the budget spent
    carries over), the new file in place and every party restarted under it (if the federation runs)."""
    from capc_services.local.membership import add

    result = add(
        state_dir,
        name=name,
        heads=heads,
        min_parties=min_parties,
        dataset=dataset,
        say=lambda line: click.echo(line, err=True),
        ready_timeout=ready_timeout,
    )
    emit(result, fmt, _membership_text)


@command.command("retire-party")
@_STATE
@click.argument("name")
@click.option(
    "--min-parties",
    type=click.IntRange(min=1),
    default=None,
    help="A new quorum (needed when the current one exceeds the parties left).",
)
@click.option("--reason", default="", help="Kept with the revocation (default: '<party> retired').")
@_READY
@format_option
def retire_party(
    state_dir: Path, name: str, min_parties: int | None, reason: str, ready_timeout: float, fmt: str
) -> None:
    """Retire teacher party NAME: the new federation.yaml (NAME left out, its certificate revoked), the
    guardian's membership entry, NAME stopped, the others restarted under the new file. NAME's cap record
    stays (its own account of the ε it released)."""
    from capc_services.local.membership import retire

    result = retire(
        state_dir,
        name=name,
        min_parties=min_parties,
        reason=reason,
        say=lambda line: click.echo(line, err=True),
        ready_timeout=ready_timeout,
    )
    emit(result, fmt, _membership_text)


@command.command("down")
@_STATE
@click.option("--purge", is_flag=True, help="Also delete the state directory (ledger, labels, certificates).")
@format_option
def down(state_dir: Path, purge: bool, fmt: str) -> None:
    """Stop the processes `capc local up` started (SIGTERM, then SIGKILL after 15 s)."""
    from capc_services.local.federation import down as local_down

    emit(local_down(state_dir, purge=purge), fmt, _down_text)


def _down_text(result: dict[str, Any]) -> str:
    stopped = [f"{party} {outcome}" for party, outcome in result["processes"].items()]
    lines = [f"federation in {result['state_dir']}: " + (", ".join(stopped) or "no process recorded")]
    if result["purged"]:
        lines.append(f"deleted {result['state_dir']} (ledger, labels, certificates, logs)")
    return "\n".join(lines)
