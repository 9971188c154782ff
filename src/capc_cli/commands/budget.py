"""``capc budget``: what a run costs (``estimate``), what a budget buys (``plan``), the ledger (``show``,
``verify``), and a running guardian's budget live (``watch``).

All figures are data-independent (what the federation charges): exact screening for every query and
``λ/σ2²`` per answered query, converted to (ε, δ) with the improved RDP conversion. Every subcommand takes
``--format json`` (one JSON object on stdout).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from capc_cli.output import ca_option, emit, epsilon_text, file_option, format_option

if TYPE_CHECKING:
    from capc_common.privacy import BudgetLedger

F = TypeVar("F", bound=Callable[..., Any])

_NOISE = click.option(
    "--noise",
    type=click.Choice(["discrete", "continuous"]),
    default="discrete",
    show_default=True,
    help="Noise the screening cost assumes: discrete (integer N_Z noise, as deployed) or continuous.",
)
_LEDGER = click.option(
    "--ledger",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The guardian's ledger file (SQLite).",
)


def _mechanism(func: F) -> F:
    """The Confident-GNMax parameters shared by ``estimate`` and ``plan``."""
    options = [
        click.option("--teachers", type=click.IntRange(min=1), required=True, help="Votes per query."),
        click.option("--classes", type=click.IntRange(min=2), required=True, help="Number of classes."),
        click.option("--sigma1", type=float, required=True, help="σ1 of the screening noise."),
        click.option("--sigma2", type=float, required=True, help="σ2 of the argmax noise."),
        click.option("--threshold", type=float, required=True, help="Screening threshold T."),
        click.option("--delta", type=float, required=True, help="δ of the (ε, δ) guarantee."),
        _NOISE,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _estimate_text(r: dict[str, Any]) -> str:
    screening, gnmax = r["breakdown"]["screening"], r["breakdown"]["gnmax"]
    return "\n".join(
        [
            f"{r['queries']} queries screened, {r['answered']} answered, δ = {r['delta']:g} "
            f"({r['noise']} noise)",
            f"  ε = {r['epsilon']:.4f} (improved conversion, order {r['order']:g}); "
            f"classic conversion: {r['epsilon_classic']:.4f} (order {r['order_classic']:g})",
            f"  screening: RDP {screening['rdp_at_order']:.6g} at order {r['order']:g} "
            f"({screening['rdp_per_query']:.4g}/query; Gaussian bound "
            f"{screening['gaussian_bound_rdp_per_query']:.4g}); alone ε = {screening['epsilon_alone']:.4f}",
            f"  GNMax:     RDP {gnmax['rdp_at_order']:.6g} ({gnmax['rdp_per_answer']:.4g}/answer); "
            f"alone ε = {gnmax['epsilon_alone']:.4f}",
        ]
    )


@click.group(name="budget")
def command() -> None:
    """Privacy budget: estimate a run's ε, plan how many queries fit, inspect and verify a ledger."""


@command.command(name="estimate")
@_mechanism
@click.option("--queries", type=click.IntRange(min=0), required=True, help="Queries screened.")
@click.option("--answered", type=click.IntRange(min=0), default=None, help="Queries answered (default: all).")
@format_option
def estimate_command(
    teachers: int,
    classes: int,
    sigma1: float,
    sigma2: float,
    threshold: float,
    delta: float,
    noise: str,
    queries: int,
    answered: int | None,
    fmt: str,
) -> None:
    """ε of screening QUERIES queries and answering ANSWERED of them (data-independent, improved)."""
    from capc_common.privacy import estimate

    result = estimate(
        teachers=teachers,
        classes=classes,
        sigma1=sigma1,
        sigma2=sigma2,
        threshold=threshold,
        queries=queries,
        answered=answered,
        delta=delta,
        noise=noise,
    )
    emit(result, fmt, _estimate_text)


def _plan_text(r: dict[str, Any]) -> str:
    lines = [
        f"budget (ε = {r['epsilon']:g}, δ = {r['delta']:g}): create the ledger at order {r['order']:g} "
        f"(budget {r['budget_rdp']:.6g} RDP)",
        f"  at answer rate {r['answer_rate']:g}: {r['queries']} queries, {r['answered']} answered "
        f"(ε used {r['epsilon_used']:.4f})",
        f"  guaranteed even if every query is answered: {r['queries_all_answered']} queries",
        f"  if none were answered: {r['queries_none_answered']} queries",
        f"  per query {r['rdp_per_query']:.4g} RDP (screening), per answer {r['rdp_per_answer']:.4g} RDP",
        "  answer rate   best order   queries   answered",
    ]
    lines += [
        f"  {row['answer_rate']:>11g}   {row['order']:>10g}   {row['queries']:>7}   {row['answered']:>8}"
        for row in r["rates"]
    ]
    if r.get("plot"):
        lines.append(f"  plot: {r['plot']}")
    return "\n".join(lines)


def _plot_plan(result: dict[str, Any], path: Path) -> None:
    """ε after n queries, one colour per answer rate, against the target ε.

    Solid: what the ledger reports (its Rényi filter at the planned order). Dotted: the best order for that
    n alone (what ``estimate`` reports); the gap at small n is the fixed cost of committing to one order.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from capc_common.privacy import ConfidentGNMaxAccountant, RenyiFilter
    from capc_common.privacy.analysis import DEFAULT_ORDERS, epsilon_at_order

    f = RenyiFilter.for_budget(epsilon=result["epsilon"], delta=result["delta"], order=result["order"])
    mechanism = ConfidentGNMaxAccountant(
        **{k: v for k, v in result["parameters"].items() if k != "mechanism"}
    )
    per_query, per_answer = mechanism.query_rdp(DEFAULT_ORDERS), mechanism.answer_rdp(DEFAULT_ORDERS)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    top = max(row["queries"] for row in result["rates"])
    n = np.unique(np.linspace(1, top, 200).astype(int))
    for row in result["rates"]:
        rate = row["answer_rate"]
        rdp = n * (result["rdp_per_query"] + rate * result["rdp_per_answer"])
        line = ax.plot(n, [f.epsilon_of(float(x)) for x in rdp], label=f"answer rate {rate:g}")[0]
        curves = n[:, None] * (per_query + rate * per_answer)[None, :]
        best = epsilon_at_order(DEFAULT_ORDERS, curves, delta=result["delta"]).min(axis=1)
        ax.plot(n, np.maximum(best, 0), linestyle=":", color=line.get_color())
    ax.axhline(
        result["epsilon"],
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"budget ε = {result['epsilon']:g}",
    )
    ax.set_xlabel("queries screened")
    ax.set_ylabel(f"ε at δ = {result['delta']:g} (order {result['order']:g})")
    ax.set_ylim(0, result["epsilon"] * 1.3)
    ax.set_title("Confident-GNMax, data-independent (solid: ledger order; dotted: best order)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@command.command(name="plan")
@_mechanism
@click.option("--epsilon", type=float, required=True, help="Target ε.")
@click.option(
    "--answer-rate",
    type=float,
    default=1.0,
    show_default=True,
    help="Expected fraction of queries that pass screening (1 plans for the worst case).",
)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write a PNG.")
@format_option
def plan_command(
    teachers: int,
    classes: int,
    sigma1: float,
    sigma2: float,
    threshold: float,
    delta: float,
    noise: str,
    epsilon: float,
    answer_rate: float,
    plot: Path | None,
    fmt: str,
) -> None:
    """How many queries and answers an (ε, δ) budget buys, and the ledger order to fix."""
    from capc_common.privacy import plan

    result = plan(
        teachers=teachers,
        classes=classes,
        sigma1=sigma1,
        sigma2=sigma2,
        threshold=threshold,
        epsilon=epsilon,
        delta=delta,
        answer_rate=answer_rate,
        noise=noise,
    )
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        _plot_plan(result, plot)
        result["plot"] = str(plot)
    emit(result, fmt, _plan_text)


def _show_text(r: dict[str, Any]) -> str:
    s = r["summary"]
    lines = [
        f"ledger {s['path']}: {epsilon_text(s)} "
        f"(δ = {s['delta']:g}, order {s['order']:g}; {100 * s['fraction_used']:.1f} % of "
        f"{s['budget_rdp']:.6g} RDP)",
        f"  settled RDP {s['spent_rdp']:.6g}, reserved (open or orphaned, counted) {s['reserved_rdp']:.6g}, "
        f"remaining {s['remaining_rdp']:.6g}",
        f"  {s['batches']} batches settled, {s['open_batches']} open, {s['released_batches']} released; "
        f"{s['queries']} queries, {s['answered']} answered",
        f"  {s['entries']} entries, head {s['head'][:16]}…, config {s['config_hash'][:16]}…",
    ]
    if r["recent"]:
        lines.append("  seq  kind     batch                      queries  answered  rdp          actor")
        lines += [
            f"  {e['seq']:>3}  {e['kind']:<7}  {e['batch_id'][:25]:<25}  {e['queries']:>7}  "
            f"{e['answered']:>8}  {e['rdp']:<11.5g}  {e['actor']}"
            for e in r["recent"]
        ]
    return "\n".join(lines)


#: Where ``capc local up`` keeps the guardian's ledger, relative to its state directory.
LOCAL_LEDGER = Path("parties") / "guardian" / "ledger.sqlite"


def _open_ledger(ledger: Path) -> BudgetLedger:
    """Open ``ledger``; a missing file is refused with where the ledger most likely is.

    Raises:
        InputError: no file at ``ledger``.
    """
    from capc_common.errors import InputError
    from capc_common.privacy import BudgetLedger

    if ledger.is_file():
        return BudgetLedger.open(ledger)
    found = [
        str(path)
        for path in (Path(".capc") / "local" / LOCAL_LEDGER, ledger.parent / "ledger.sqlite")
        if path.is_file()
    ]
    raise InputError(
        f"no budget ledger at {ledger}. The guardian's ledger is the file its site file names under "
        f"`ledger:`; a `capc local up` federation keeps it at STATE_DIR/{LOCAL_LEDGER} (`capc local up` "
        "prints the path)" + (f"; found here: {', '.join(dict.fromkeys(found))}" if found else "")
    )


@command.command(name="show")
@_LEDGER
@click.option(
    "--entries", "last", type=click.IntRange(min=0), default=10, show_default=True, help="Recent rows."
)
@format_option
def show_command(ledger: Path, last: int, fmt: str) -> None:
    """The ledger's budget figures and its most recent entries."""
    with _open_ledger(ledger) as led:
        result = {
            "summary": led.summary(),
            "recent": [e.to_dict() for e in reversed(led.entries(newest=True, limit=last))],
        }
    emit(result, fmt, _show_text)


def _verify_text(r: dict[str, Any]) -> str:
    head = "OK" if r["ok"] else "FAILED"
    lines = [f"ledger verification {head}: {r['entries']} entries, head {r['head']}"]
    if r["expected_head_at"] is not None:
        lines.append(f"  pinned head found at entry {r['expected_head_at']} of {r['entries']}")
    t = r["totals"]
    if t:
        lines.append(
            f"  recomputed: ε spent {t['epsilon_spent']:.4f} (settled {t['epsilon_settled']:.4f} + reserved "
            f"{t['epsilon_reserved']:.4f}), settled RDP {t['spent_rdp']:.6g}, reserved "
            f"{t['reserved_rdp']:.6g}, {t['batches']} batches, {t['queries']} queries, {t['answered']} "
            "answered"
        )
    if "releases_planned" in t:
        lines.append(
            f"  releases: {t['releases']} of the plan's {t['releases_planned']}, each round charged once"
        )
    said = {None: "authorisation not checked: give --admin-token-file", True: "authorised by the admin token",
            False: "NOT authorised by this admin token"}  # fmt: skip
    lines += [
        f"  membership entry {m['entry']}: {m['change']} ({said[m['authorised']]})" for m in r["membership"]
    ]
    lines += [f"  problem: {p}" for p in r["problems"]]
    return "\n".join(lines)


@command.command(name="verify")
@_LEDGER
@click.option(
    "--expect-head",
    metavar="HASH",
    default=None,
    help="A head hash pinned earlier (capc budget show, the guardian's log or /metrics): it must still be in "
    "the chain, so a removed tail or a replaced file fails.",
)
@file_option(
    "--admin-token-file",
    required=False,
    help="The guardian's admin token: also check that it authorised every membership entry (adding or "
    "retiring a party).",
)
@format_option
def verify_command(ledger: Path, expect_head: str | None, admin_token_file: Path | None, fmt: str) -> None:
    """Check the hash chain (membership entries included) and recompute every total; exit 5 if anything is
    inconsistent."""
    from capc_common.errors import IntegrityError

    with _open_ledger(ledger) as led:
        report = led.verify(expect_head=expect_head)
        changes = led.membership_changes() if report.ok else []  # a damaged file: the report says why
        unauthorised: dict[int, str] = {}
        if admin_token_file is not None and report.ok:
            from capc_services.common.settings import load_admin_token

            unauthorised = led.check_authorisations(load_admin_token(admin_token_file))
            report.problems += list(unauthorised.values())
            report.ok = report.ok and not unauthorised
    result = report.to_dict()
    result["membership"] = [
        {
            "entry": e.seq,
            "change": e.detail,
            "authorised_by": e.params.get("authorised_by"),
            "authorised": None if admin_token_file is None else e.seq not in unauthorised,
        }
        for e in changes
    ]
    emit(result, fmt, _verify_text)
    if not report.ok:
        raise IntegrityError(f"ledger {ledger} failed verification: {len(report.problems)} problem(s)")


@command.command(name="watch")
@click.option(
    "--url", default=None, help="The guardian's admin API: https://GUARDIAN:8080, or http:// on this machine."
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The guardian's admin token file (admin.token_file of its site).",
)
@click.option(
    "--local",
    "local_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Instead of --url/--token-file: the state directory of a `capc local up` federation.",
)
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after this many refreshes.")
@ca_option()
@format_option
def watch_command(
    url: str | None,
    token_file: Path | None,
    local_dir: Path | None,
    interval: float,
    count: int | None,
    ca: Path | None,
    fmt: str,
) -> None:
    """The dashboard's figures, live, in the terminal (for servers without a browser).

    Reads the guardian's admin REST API like the dashboard at /dashboard does: ε settled and reserved
    against the limit, queries, the ledger head, the noise source, each party, the student. With
    --format json, one JSON object per refresh (one per line)."""
    import itertools
    import json
    import sys
    import time

    from capc_cli.budget_watch import render, snapshot
    from capc_common.errors import InputError
    from capc_services.common.settings import load_admin_token

    if local_dir is not None:
        from capc_services.local.federation import summary, token
        from capc_services.local.layout import Layout

        layout = Layout(local_dir.resolve())
        url, secret = summary(layout)["guardian"]["admin"], token(layout)
    elif url is not None and token_file is not None:
        secret = load_admin_token(token_file)
    else:
        raise InputError("give --url and --token-file of the guardian's admin API, or --local STATE_DIR")
    if url is None:
        raise InputError(f"the federation in {local_dir} has no running guardian; `capc local up` it first")
    clear = fmt == "text" and sys.stdout.isatty()
    for tick in itertools.count(1):
        snap = snapshot(url, secret, ca=ca)
        if fmt == "json":
            click.echo(json.dumps(snap))
        else:
            click.echo(("\x1b[H\x1b[2J" if clear else "") + render(snap, interval=interval))
        if count is not None and tick >= count:
            return
        time.sleep(interval)
