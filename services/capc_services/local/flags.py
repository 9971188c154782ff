"""``capc local up`` speaks its flags: the library's checks name ``federation.yaml`` fields (the language of
a coordinator who writes that file), but a user of ``capc local up`` never sees the file it writes, so its
messages name the flag that sets each field instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace

from capc_common.data.partition import HOLDOUT_CEILING, holdout_fraction
from capc_common.errors import InputError
from capc_common.federation.refusals import Refusal

#: ``federation.yaml`` fields ``capc local up`` sets from a flag of its own, and that flag. A field of the
#: mechanism without one is set by ``--mechanism-param FIELD=VALUE``.
_FLAGS: Mapping[str, str] = {
    "budget.epsilon": "--epsilon",
    "budget.delta": "--delta",
    "budget.order": "--order",
    "queries.total": "--queries",
    "queries.batch_size": "--batch-size",
    "queries.bn_batch": "--bn-batch",
    "queries.seed": "--seed",
    "quorum.min_parties": "--min-parties",
    "teachers.heads": "--teachers-per-party",
    "teachers[].heads": "--teachers-per-party",
    "teachers.examples": "--train-limit",
    "teachers.cap": "--teacher-cap",
    "mechanism.name": "--mechanism",
    "mechanism.threshold": "--threshold",
    "mechanism.sigma1": "--sigma1",
    "mechanism.sigma2": "--sigma2",
    "mechanism.sigma": "--sigma",
    "mechanism.neighbours": "--neighbours",
    "mechanism.insecure_noise_seed": "--insecure-noise-seed",
}
#: Fields whose flag differs under one mechanism: Private-kNN's Poisson rate has a flag of its own (under
#: secagg-dpsgd it is a ``--mechanism-param``), and a kNN party's heads are its neighbours (votes per query).
_FLAGS_OF: Mapping[str, Mapping[str, str]] = {
    "private-knn": {
        "mechanism.sampling_rate": "--sampling-rate",
        "teachers.heads": "--neighbours",
        "teachers[].heads": "--neighbours",
    }
}
#: The sections of ``federation.yaml`` whose fields messages name.
_SECTIONS = r"budget|queries|quorum|mechanism|teachers(?:\[\])?"


def flag_names(mechanism: str) -> dict[str, str]:
    """Every ``federation.yaml`` field ``capc local up --mechanism MECHANISM`` sets by a flag, and the flag
    (what :meth:`~capc_common.federation.refusals.Refusal.text` takes as its names)."""
    return {**_FLAGS, **_FLAGS_OF.get(mechanism, {})}


def as_flags(message: str, *, mechanism: str) -> str:
    """``message`` with each ``federation.yaml`` field it names replaced by the flag that sets it."""
    names = flag_names(mechanism)

    def flag(match: re.Match[str]) -> str:
        field = f"{match.group(1)}.{match.group(2)}"
        if field in names:
            return names[field]
        if match.group(1) == "mechanism":
            return f"--mechanism-param {match.group(2)}=…"
        return match.group(0)

    # pydantic puts the union member's tag in a field's path (``mechanism.confident-gnmax.sigma1``)
    field = re.compile(rf"\b({_SECTIONS})\.(?:{re.escape(mechanism)}\.)?(\w+)\b")
    return field.sub(flag, message)


@contextmanager
def speaking_flags(*, mechanism: str) -> Iterator[None]:
    """Re-raise an :class:`InputError` of the block (of the same class) with the flags in its message."""
    try:
        yield
    except InputError as exc:
        raise type(exc)(as_flags(str(exc), mechanism=mechanism)) from None


def training_part(planned: int) -> int:
    """The examples a site of ``planned`` examples trains on, on average: less its holdout
    (:func:`~capc_common.data.holdout_fraction` of its planned size)."""
    return round(planned * (1 - holdout_fraction(max(1, planned))))


def train_limit_for(examples: int) -> int:
    """The smallest ``--train-limit`` whose planned training part (:func:`training_part`) holds
    ``examples``: the checks count a party's training part, as its heads see it, and ``--train-limit`` sets
    its whole planned size."""
    low, high = max(1, examples), max(1, math.ceil(examples / (1 - HOLDOUT_CEILING)) + 1)
    while low < high:  # the training part, limit · (1 − holdout_fraction(limit)), grows with the limit
        mid = (low + high) // 2
        if training_part(mid) >= examples:
            high = mid
        else:
            low = mid + 1
    return low


def in_flag_units(refusal: Refusal) -> Refusal:
    """``refusal`` with its changes in the units of ``capc local up``'s flags: a party's examples (its
    training part) as the ``--train-limit`` that gives them."""
    changes = tuple(
        replace(change, value=train_limit_for(math.ceil(change.value)))
        if change.field == "teachers.examples"
        else change
        for change in refusal.changes
    )
    return replace(refusal, changes=changes)
