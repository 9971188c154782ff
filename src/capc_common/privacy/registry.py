"""Create an accountant by mechanism name: ``create_accountant("confident-gnmax", teachers=..., ...)``."""

from __future__ import annotations

from typing import Any

from capc_common.errors import InputError
from capc_common.privacy.accountant import (
    Accountant,
    ConfidentGNMaxAccountant,
    DataDependentPATEAccountant,
    PureDPAccountant,
    SubsampledGaussianAccountant,
    ZCDPAccountant,
)

__all__ = ["ACCOUNTANTS", "create_accountant"]

#: Every accountant class by its mechanism name.
ACCOUNTANTS: dict[str, type[Accountant]] = {
    cls.mechanism: cls
    for cls in (
        ConfidentGNMaxAccountant,
        DataDependentPATEAccountant,
        PureDPAccountant,
        SubsampledGaussianAccountant,
        ZCDPAccountant,
    )
}


def create_accountant(mechanism: str, **params: Any) -> Accountant:
    """A fresh accountant for ``mechanism`` with its keyword parameters.

    Raises:
        InputError: unknown mechanism or parameters it does not take.
    """
    cls = ACCOUNTANTS.get(mechanism)
    if cls is None:
        raise InputError(f"unknown mechanism {mechanism!r}; known: {sorted(ACCOUNTANTS)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise InputError(f"bad parameters for {mechanism!r}: {exc}") from exc
