"""``capc federation plan``: size a federation from its data before writing federation.yaml;
``add-party`` / ``retire-party``: the federation.yaml of a membership change, and each party's next steps;
``basis``: the public basis file the coordinator ships to every party of a secagg-dpsgd federation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from capc_cli.output import emit, file_option, format_option


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _span(forecast: dict[str, Any], points: bool = False) -> str:
    low, high = forecast["interval"]
    if points:
        return f"{100 * forecast['estimate']:+.1f} points ({100 * low:+.1f} to {100 * high:+.1f})"
    return f"{_pct(forecast['estimate'])} ({_pct(low)}–{_pct(high)})"


def _recommendation_text(rec: dict[str, Any]) -> list[str]:
    alone, gain, measured = rec["expected_alone"], rec["expected_gain"], rec["measured"]
    student = {"estimate": rec["expected_accuracy"], "interval": rec["expected_interval"]}
    error = measured["error"]["federation"]["quantile_90"]
    lines = [
        f"recommendation: {rec['choice']}" + (" (extrapolating)" if rec["extrapolating"] else ""),
        f"  expected: the student {_span(student)}; the median party alone {_span(alone['median'])}, the "
        f"best {_span(alone['best'])}",
        f"  gain over the median party {_span(gain['median'], True)}; "
        f"over the best {_span(gain['best'], True)}",
        f"  why: {rec['why']}",
        f"  forecast: fitted to {measured['layouts']} measured layouts of {', '.join(measured['datasets'])} "
        f"({measured['source']}, code {measured['code']}); left out in turn, 90 % of the layouts' student "
        f"accuracies came within {100 * error:.1f} points",
    ]
    if "parameters" in rec:
        p = rec["parameters"]
        fields = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in p.items() if k != "name"
        )
        lines.append(
            f"  federation.yaml mechanism: {p['name']} ({fields}); budget: "
            + ", ".join(f"{k} {v:g}" for k, v in rec["budget"].items())
        )
    return lines


def _text(r: dict[str, Any]) -> str:
    lines = _recommendation_text(r["recommendation"])
    if "mechanism" not in r:  # the parties are too small for DIET-CaPC's teachers
        return "\n".join(lines + [f"note: {n}" for n in r["notes"]])
    m, q, e = r["mechanism"], r["queries"], r["expected"]
    lines += [
        "DIET-CaPC sizing (confident-gnmax):",
        f"{r['teachers']} teachers: {', '.join(str(h) for h in r['heads'])} heads per party "
        f"(each shard ≥ one BatchNorm chunk of {q['bn_batch']} with 99.9 % probability per party)",
        f"mechanism: threshold {m['threshold']:g}, sigma1 {m['sigma1']:g}, sigma2 {m['sigma2']:g}",
        f"budget: ε {r['budget']['epsilon']:g}, δ {r['budget']['delta']:g}, "
        f"ledger order {r['budget']['order']:g}",
        f"queries: total {q['total']}, batch_size {q['batch_size']}, bn_batch {q['bn_batch']}",
        f"expected: about {e['queries']} queries screened, {e['answered']} answered "
        f"(at an answer rate of {e['answer_rate']:g})",
    ]
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)


@click.group(name="federation")
def command() -> None:
    """Plan a federation before it is created; add or retire a teacher party of a running one; ship its public
    basis."""


@command.command(name="plan")
@click.option(
    "--examples",
    type=click.IntRange(min=1),
    multiple=True,
    required=True,
    help="Labelled images of one teacher party (repeat once per party).",
)
@click.option("--classes", type=click.IntRange(min=2), required=True, help="Number of classes.")
@click.option("--epsilon", type=click.FloatRange(min=0, min_open=True), required=True, help="Budget ε.")
@click.option(
    "--skewed",
    is_flag=True,
    help="The parties' class mixes differ strongly (some hold mostly a few classes).",
)
@click.option(
    "--delta", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=1e-5, show_default=True
)
@click.option(
    "--bn-batch", type=click.IntRange(min=16), default=64, show_default=True, help="BatchNorm chunk."
)
@click.option(
    "--batch-size", type=click.IntRange(min=16), default=512, show_default=True, help="Largest batch."
)
@format_option
def plan_command(
    examples: tuple[int, ...],
    classes: int,
    epsilon: float,
    skewed: bool,
    delta: float,
    bn_batch: int,
    batch_size: int,
    fmt: str,
) -> None:
    """Whether to federate at all and with what, forecast from the joining benchmark's measurements with an
    interval (secagg-dpsgd, join-and-personalise, train-alone or nothing-to-join), the mechanism's
    federation.yaml entries, and the DIET-CaPC sizing: teachers per party, Confident-GNMax parameters,
    batches and expected answers."""
    from capc_common.errors import InputError
    from capc_common.federation import propose
    from capc_common.federation.recommend import recommend
    from capc_common.federation.sizing import dpsgd_mechanism

    recommendation = recommend(list(examples), classes=classes, epsilon=epsilon, skewed=skewed)
    dpsgd, order = dpsgd_mechanism(epsilon=epsilon, delta=delta)
    try:
        result = propose(
            list(examples),
            classes=classes,
            epsilon=epsilon,
            delta=delta,
            bn_batch=bn_batch,
            batch_size=batch_size,
        )
    except InputError as exc:
        result = {"notes": [f"DIET-CaPC cannot be sized for these parties: {exc}"]}
    # `parameters` is federation.yaml's `mechanism` entry as is; `budget` its `budget` entry — only where
    # the answer is to federate.
    if recommendation["mechanism"] == "secagg-dpsgd":
        recommendation["parameters"] = dpsgd
        recommendation["budget"] = {"epsilon": epsilon, "delta": delta, "order": order}
    emit({"recommendation": recommendation, **result}, fmt, _text)


_FEDERATION = file_option("--federation", "path", help="The federation.yaml every party runs now.")
_OUT = file_option(
    "--out",
    help="Where to write the new federation.yaml (the parties keep the current one until they switch).",
)
_MIN_PARTIES = click.option(
    "--min-parties", type=click.IntRange(min=1), default=None, help="A new quorum (default: keep it)."
)


def _step_guardian(out: Path) -> str:
    return (
        "guardian operator: record the change on the running guardian's ledger: `capc guardian membership "
        f"--url https://GUARDIAN:8080 --ca ca.crt --token-file TOKEN --federation {out}` (one membership "
        f"entry; the budget carries over; the guardian stops), then start the guardian with {out} as its "
        "federation.yaml"
    )


def _steps_added(party: str, out: Path) -> list[str]:
    return [
        f"{party}: make its key and request on its own machine (`capc cert request {party} --out-dir DIR`) "
        f"and send the .csr, reading its fingerprint out over another channel; coordinator: `capc cert sign "
        f"{party}.csr --ca-dir ca --federation {out} --fingerprint FINGERPRINT`, then send {party} its .crt, "
        f"ca.crt, {out} and the student's and guardian's addresses",
        f"{party}: train its heads and create its cap record under the new file (`capc teacher train --site "
        "SITE`, `capc teacher init-cap --site SITE`)",
        _step_guardian(out),
        f"student and every other teacher party: install {out} as federation.yaml and restart (label store "
        "and cap records carry on; the old config is refused from now on)",
        f"{party}: `capc teacher preflight --site SITE`, then `capc teacher serve --site SITE`: it votes on "
        "the batches asked from now on",
    ]


def _steps_retired(party: str, serial: str, out: Path) -> list[str]:
    return [
        _step_guardian(out),
        f"student and every remaining teacher party: install {out} as federation.yaml and restart; "
        f"certificate serial {serial} of {party} is revoked in it (parties on different revocation lists "
        "refuse each other until all have it)",
        f"{party}: stop its teacher; keep its cap record (its own account of the ε it released)",
    ]


def _membership_text(r: dict[str, Any]) -> str:
    lines = [
        f"{r['federation']}: {r['change']}; config {r['previous_config_hash'][:16]}… -> "
        f"{r['config_hash'][:16]}… ({r['teachers']} teacher parties, quorum {r['min_parties']})",
        f"written to {r['written']}; next:",
    ]
    return "\n".join(lines + [f"  {i}. {step}" for i, step in enumerate(r["next"], start=1)])


def _write_change(old: Any, new: Any, out: Path, steps: list[str], fmt: str) -> None:
    new.save(out)
    change = new.history[-1]
    emit(
        {
            "federation": new.name,
            "change": change.describe(),
            "added": list(change.added),
            "retired": list(change.retired),
            "previous_config_hash": old.config_hash(),
            "config_hash": new.config_hash(),
            "teachers": len(new.teachers),
            "min_parties": new.quorum.min_parties,
            "written": str(out),
            "next": steps,
        },
        fmt,
        _membership_text,
    )


@command.command(name="add-party")
@_FEDERATION
@click.option("--party", required=True, help="The new teacher party's name (a DNS label).")
@click.option(
    "--heads", type=click.IntRange(min=1), required=True, help="Its teacher heads (votes per query)."
)
@_MIN_PARTIES
@_OUT
@format_option
def add_party_command(
    path: Path, party: str, heads: int, min_parties: int | None, out: Path, fmt: str
) -> None:
    """Write the federation.yaml with a teacher party added, and say what each party does next.

    Only the membership (and the quorum) may change; the budget, mechanism, queries and backbone stay, so
    the guardian can continue the same ledger once its operator records the change."""
    from capc_common.federation import FederationConfig, add_party

    old = FederationConfig.load(path)
    new = add_party(old, name=party, heads=heads, min_parties=min_parties)
    _write_change(old, new, out, _steps_added(party, out), fmt)


@command.command(name="retire-party")
@_FEDERATION
@click.option("--party", required=True, help="The teacher party to retire.")
@click.option(
    "--certificate",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Its certificate (its serial is revoked in the new file).",
)
@click.option(
    "--serial", default=None, help="Instead of --certificate: its serial, as `capc cert show` prints."
)
@click.option("--reason", default="", help="Kept with the revocation (default: '<party> retired').")
@_MIN_PARTIES
@_OUT
@format_option
def retire_party_command(
    path: Path,
    party: str,
    certificate: Path | None,
    serial: str | None,
    reason: str,
    min_parties: int | None,
    out: Path,
    fmt: str,
) -> None:
    """Write the federation.yaml with a teacher party retired and its certificate revoked, and say what each
    party does next."""
    from capc_common.errors import InputError
    from capc_common.federation import FederationConfig, retire_party

    if (certificate is None) == (serial is None):
        raise InputError("give the retired party's --certificate or its --serial (one of them)")
    if certificate is not None:
        from capc_services.tls import certificate_info

        info = certificate_info(certificate)
        if info.common_name != party:
            raise InputError(f"{certificate} is {info.common_name!r}'s certificate, not {party!r}'s")
        serial = info.serial
    old = FederationConfig.load(path)
    new = retire_party(old, name=party, serial=str(serial), reason=reason, min_parties=min_parties)
    _write_change(old, new, out, _steps_retired(party, new.revoked[-1].serial, out), fmt)


def _basis_text(r: dict[str, Any]) -> str:
    how = "computed here" if r["computed"] else "found there"
    lines = [
        f"{r['federation']}: public basis {r['file']} ({how})",
        f"  sha256sum of the file: {r['file_sha256']}",
        f"  basis digest: {r['pin']} "
        + ("(federation.yaml pins it)" if r["pinned"] else "(federation.yaml pins none)"),
        "next:",
    ]
    return "\n".join(lines + [f"  {i}. {step}" for i, step in enumerate(r["next"], start=1)])


@command.command(name="basis")
@_FEDERATION
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to compute the basis into (created if missing); one that holds it already is read.",
)
@format_option
def basis_command(path: Path, out: Path, fmt: str) -> None:
    """The public basis of a secagg-dpsgd federation as the file a party's feature cache reads, checked
    against federation.yaml's pin: ship it to every hospital and the student, who read it instead of
    computing it (about 1 GB of memory and a minute each)."""
    from capc_common.errors import InputError
    from capc_common.federation import FederationConfig
    from capc_common.storage import classify
    from capc_services.common.basis import basis_file

    config = FederationConfig.load(path)
    try:
        found = basis_file(config, out)
    except (NotADirectoryError, FileExistsError) as exc:  # --out below a file
        raise InputError(f"--out {out}: {exc.strerror}: give a directory path") from None
    except OSError as exc:  # a read-only or full volume
        raise classify(exc, path=out, what="the basis directory") from None
    name = found.path.name
    steps = [
        f"every hospital and the student: copy {name} into the directory its site file's `feature_cache:` "
        "names (its own, e.g. /var/lib/capc/feature-cache; created if missing, writable by the party), and "
        f"check the copy: `sha256sum {name}` prints {found.file_sha256}",
        "the party reads the basis there at start instead of computing it, and refuses one that is not the "
        "pinned basis; it looks the file up by a name that depends on the software version, so run the "
        "parties with the version that wrote it (another version computes the basis itself)",
    ]
    if not found.pinned:
        steps.insert(
            0,
            f"pin it first: add `sha256: {found.pin}` to mechanism.projection in {path} and send the parties "
            "that federation.yaml (without a pin nothing checks the basis a party reads or computes)",
        )
    emit(
        {
            "federation": config.name,
            "file": str(found.path),
            "file_sha256": found.file_sha256,
            "pin": found.pin,
            "pinned": found.pinned,
            "computed": found.computed,
            "next": steps,
        },
        fmt,
        _basis_text,
    )
