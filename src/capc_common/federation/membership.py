"""Membership changes: add or retire a teacher party of a running federation, and nothing else.

A federation's privacy guarantee is fixed when its ledger is created: the filter's (ε, δ) and order, the
mechanism's noise and threshold, the query stream and the backbone. A membership change keeps every one of
them — only the teacher parties (and the quorum that counts them) differ — so the ledger can carry on under
the new config hash with the budget already spent (DESIGN §7). :func:`membership_change` is the rule every
party applies alike: the guardian before it records the change, ``capc federation add-party`` before it
writes the new file. Changing a privacy parameter is refused here: it needs a new federation and ledger.
"""

from __future__ import annotations

from typing import Any

from capc_common.errors import InputError
from capc_common.federation.config import FederationConfig, MembershipChange, ReleaseMember
from capc_common.federation.costs import batch_costs, check_batch_fits

#: The parts of ``federation.yaml`` a membership change may alter (``revoked`` and ``history`` are not
#: parameters at all, see :meth:`FederationConfig.parameters`).
CHANGEABLE = ("teachers", "quorum")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"budget.epsilon": 10.0, …}``: every leaf of a JSON value under its dotted path."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat |= _flatten(item, f"{prefix}{key}.")
        return flat
    return {prefix.rstrip("."): value}


def _release_refusal(config: FederationConfig) -> None:
    if isinstance(config.mechanism, ReleaseMember):
        raise InputError(
            f"federation {config.name!r} runs the release mechanism {config.mechanism.name!r}: its releases "
            "sum over a party set fixed for all of them (and DP-SGD's normaliser counts their records), so "
            "its parties cannot change mid-way; start a new federation with its own ledger instead"
        )


def membership_change(old: FederationConfig, new: FederationConfig) -> MembershipChange:
    """What ``new`` changes in ``old``'s membership, refusing anything but adding or retiring teacher parties.

    ``new`` must record the change as the last entry of its ``history`` (what ``capc federation add-party``
    and ``retire-party`` write): the student and each teacher party carry their records over only to a
    config that names the one they were written under, and a file made from a stale config is caught here.

    Returns:
        The change (``previous`` is ``old``'s config hash).

    Raises:
        InputError: a privacy or stream parameter differs (named with both values), a party kept its name
            but changed its heads, nothing was added or retired, ``new``'s history does not record this very
            change, or the federation is of the release family.
    """
    _release_refusal(old)
    before, after = old.parameters(), new.parameters()
    fixed_before = _flatten({k: v for k, v in before.items() if k not in CHANGEABLE})
    fixed_after = _flatten({k: v for k, v in after.items() if k not in CHANGEABLE})
    differ = sorted(
        k for k in fixed_before.keys() | fixed_after.keys() if fixed_before.get(k) != fixed_after.get(k)
    )
    if differ:
        shown = "; ".join(f"{k}: {fixed_before.get(k)!r} -> {fixed_after.get(k)!r}" for k in differ[:6])
        raise InputError(
            f"a membership change may only add or retire teacher parties (and set the quorum), but it also "
            f"changes {shown}. The budget's limit and order, the mechanism, the query stream and the "
            "backbone are fixed for the ledger's life: changing them needs a new federation and a new ledger"
        )
    heads_before = {t.name: t.heads for t in old.teachers}
    heads_after = {t.name: t.heads for t in new.teachers}
    changed = sorted(n for n in heads_before.keys() & heads_after.keys() if heads_before[n] != heads_after[n])
    if changed:
        shown = ", ".join(f"{n} {heads_before[n]} -> {heads_after[n]}" for n in changed)
        raise InputError(
            f"heads changed for {shown}: a party's votes per query are part of the membership; retire it and "
            "add it again under a new name to change them"
        )
    added = tuple(n for n in new.teacher_names if n not in heads_before)
    retired = tuple(n for n in old.teacher_names if n not in heads_after)
    if not added and not retired:
        raise InputError(
            f"the new config adds and retires no teacher party (teachers: {list(new.teacher_names)}); "
            "there is no membership change to make"
        )
    change = MembershipChange(previous=old.config_hash(), added=added, retired=retired)
    recorded = new.history[-1] if new.history else None
    if recorded is None or recorded.previous != change.previous:
        made_from = f"was made from config {recorded.previous[:16]}…" if recorded else "records no change"
        raise InputError(
            f"the new federation.yaml {made_from}, but the federation runs {change.previous[:16]}…: make it "
            "from the current federation.yaml with `capc federation add-party` or `retire-party` (its "
            "history: entry lets the student and the teachers carry their records over)"
        )
    if (recorded.added, recorded.retired) != (added, retired):
        raise InputError(
            f"the new federation.yaml's history says {recorded.describe()}, but its teachers say "
            f"{change.describe()}; make it with `capc federation add-party` or `retire-party`"
        )
    _retired_are_revoked(old, new, retired)
    _same_costs(old, new)
    return change


def _retired_are_revoked(old: FederationConfig, new: FederationConfig, retired: tuple[str, ...]) -> None:
    """Refuse to retire a party unless the same change revokes a certificate of it: its name alone leaving
    the federation would let the certificate back in the day the name is added again (a revocation of an
    earlier certificate of the party does not count)."""
    newly_revoked = {r.party for r in new.revoked if r.serial not in old.revoked_serials}
    unrevoked = [name for name in retired if name not in newly_revoked]
    if unrevoked:
        raise InputError(
            f"retiring {unrevoked} needs their certificates revoked in the same change (an entry under "
            "revoked: naming each party and its serial); make the file with `capc federation retire-party "
            "--party NAME --certificate NAME.crt`"
        )


def _same_costs(old: FederationConfig, new: FederationConfig) -> None:
    """Refuse a change that alters what one query costs.

    One example still moves one vote whoever joins, so GNMax's cost per answer never changes, and the
    deployed screening bound (discrete noise) is the supremum over every shift of the threshold, whatever
    the heads. It moves only where a query's top count can take a single value (the pass bit then depends on
    no data and screening costs 0): a federation of one head that grows. The student counts every batch it
    asked at the per-query figures in force, so they must stay those the ledger charged earlier batches at.
    """
    before, after = batch_costs(old), batch_costs(new)
    if (before.query_rdp, before.answer_rdp) != (after.query_rdp, after.answer_rdp):
        raise InputError(
            f"this change alters what one query costs at order {before.order:g} (screening RDP "
            f"{before.query_rdp:.6g} -> {after.query_rdp:.6g}, per answer {before.answer_rdp:.6g} -> "
            f"{after.answer_rdp:.6g}; total heads {old.total_heads} -> {new.total_heads}), and the student "
            "counts its earlier batches at the figures in force: start a new federation with its own ledger"
        )


def _changed(old: FederationConfig, data: dict[str, Any], change: MembershipChange) -> FederationConfig:
    """The validated config ``data`` with ``change`` appended to its history, checked against ``old``."""
    data["history"] = [*data.get("history", []), change.model_dump(mode="json")]
    new = FederationConfig.from_dict(data, source="the changed federation config")
    membership_change(old, new)
    check_batch_fits(new)
    return new


def _quorum(data: dict[str, Any], min_parties: int | None) -> None:
    if min_parties is not None:
        data["quorum"]["min_parties"] = min_parties


def add_party(
    config: FederationConfig, *, name: str, heads: int, min_parties: int | None = None
) -> FederationConfig:
    """``config`` with teacher party ``name`` (``heads`` votes per query) added at the end.

    Args:
        config: the federation in force.
        name: the new party (a DNS label, not yet a party).
        heads: its teacher heads (under Private-kNN: ``mechanism.neighbours``).
        min_parties: a new quorum (None: keep it).

    Raises:
        InputError: the name is taken or invalid, or the new config is invalid.
    """
    _release_refusal(config)
    if name in config.party_names:
        raise InputError(f"{name!r} is already a party of federation {config.name!r}; pick another name")
    data = config.model_dump(mode="json")
    data["teachers"].append({"name": name, "heads": heads})
    _quorum(data, min_parties)
    return _changed(config, data, MembershipChange(previous=config.config_hash(), added=(name,)))


def retire_party(
    config: FederationConfig, *, name: str, serial: str, reason: str = "", min_parties: int | None = None
) -> FederationConfig:
    """``config`` without teacher party ``name``, whose certificate (``serial``) is listed under ``revoked``.

    Args:
        config: the federation in force.
        name: the teacher party to retire.
        serial: its certificate's serial (hex, as ``capc cert show`` prints it).
        reason: kept with the revocation.
        min_parties: a new quorum (needed when the current one exceeds the parties left).

    Raises:
        InputError: not a teacher party, the last one, or the quorum would exceed the parties left.
    """
    _release_refusal(config)
    config.teacher(name)  # refuses a name that is not a teacher party
    left = len(config.teachers) - 1
    if left < 1:
        raise InputError(
            f"{name} is the last teacher party of {config.name!r}; a federation needs at least one"
        )
    quorum = min_parties if min_parties is not None else config.quorum.min_parties
    if quorum > left:
        raise InputError(
            f"quorum.min_parties is {quorum} but only {left} teacher parties remain after retiring {name}; "
            f"give --min-parties {left} (or fewer)"
        )
    data = config.model_dump(mode="json")
    data["teachers"] = [t for t in data["teachers"] if t["name"] != name]
    data["revoked"].append({"serial": serial, "party": name, "reason": reason or f"{name} retired"})
    _quorum(data, min_parties)
    return _changed(config, data, MembershipChange(previous=config.config_hash(), retired=(name,)))
