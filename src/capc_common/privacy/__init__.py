"""Differential privacy for DIET-CaPC: exact integer noise, RDP accounting and the durable budget ledger.

Front door:

* noise — :class:`NoiseSource`, :class:`SystemNoise` (CSPRNG, production), :class:`SeededNoise` (tests only);
* accounting — the pure functions of :mod:`capc_common.privacy.analysis` (RDP curves, conversions),
  accountants that keep a history (:class:`ConfidentGNMaxAccountant`, …, :func:`create_accountant`),
  :func:`estimate` and :func:`plan` (``capc budget estimate|plan``), :func:`plan_budget` (a central run's
  :class:`RunBudget` for any selection mechanism);
* enforcement — :class:`RenyiFilter` in memory and :class:`BudgetLedger` on disk (two-phase, hash-chained);
* claims — :mod:`capc_common.privacy.claims`: what a published ε means (the guarantee, not the odometer).
"""

from capc_common.privacy import analysis, claims
from capc_common.privacy.accountant import (
    Accountant,
    ConfidentGNMaxAccountant,
    DataDependentPATEAccountant,
    PureDPAccountant,
    SubsampledGaussianAccountant,
    ZCDPAccountant,
)
from capc_common.privacy.budget import RunBudget, plan_budget
from capc_common.privacy.filter import RenyiFilter
from capc_common.privacy.ledger import BatchRecord, BudgetLedger, Entry, VerificationReport
from capc_common.privacy.noise import InsecureNoiseWarning, NoiseSource, SeededNoise, SystemNoise
from capc_common.privacy.planning import estimate, plan
from capc_common.privacy.registry import create_accountant

__all__ = [
    "Accountant",
    "BatchRecord",
    "BudgetLedger",
    "ConfidentGNMaxAccountant",
    "DataDependentPATEAccountant",
    "Entry",
    "InsecureNoiseWarning",
    "NoiseSource",
    "PureDPAccountant",
    "RenyiFilter",
    "RunBudget",
    "SeededNoise",
    "SubsampledGaussianAccountant",
    "SystemNoise",
    "VerificationReport",
    "ZCDPAccountant",
    "analysis",
    "claims",
    "create_accountant",
    "estimate",
    "plan",
    "plan_budget",
]
