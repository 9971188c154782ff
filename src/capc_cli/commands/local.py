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
    default=10.0,
    show_default=True,
    help="Rényi order of the ledger (capc federation plan proposes one for the budget).",
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
    "so the cap never stops a party before the federation's own limit; see docs/operations.md].",
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
        line = f"  {name:<12} {party['role']:<8} pid {party['pid']:<8} {party['state']}"
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


@command.command("restart")
@_STATE
@click.argument("party")
@format_option
def restart(state_dir: Path, party: str, fmt: str) -> None:
    """Start again a party whose process is gone (it crashed or was killed); the others carry on and the
    restarted party resumes where its durable state left off."""
    from capc_services.local.federation import restart as local_restart

    emit(local_restart(state_dir, party).to_dict(), fmt)


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
