"""Mechanisms as plug-in objects of the one engine (DESIGN §3): each holds its public parameters, its
accounting, its noise draws in canonical order, its output rule and its secure path.

Two families share the engine's parties, sharing, guardian and ledger:

* selection (:class:`SelectionMechanism`): parties contribute per-query vote counts and a 2PC noisy argmax
  releases labels — :class:`ConfidentGNMax` (the federation's default), :class:`GNMax`, :class:`LNMax`,
  :class:`PrivateKNN` (kNN votes of Poisson-subsampled records);
* release (:class:`ReleaseMechanism`): parties contribute fixed-point integer vectors and the guardian's
  noisy total is released — :class:`DPPrototypes` (DPPL) and :class:`SecureDPSGD` (one release per round).

The central runners (:mod:`capc_common.mechanisms.central`, ``capc dietpate run``) and the federation's
services take such an object; neither branches on a mechanism's name.
"""

from capc_common.mechanisms.base import BatchNoise, SelectionMechanism
from capc_common.mechanisms.dpsgd import SecureDPSGD, poisson_sample
from capc_common.mechanisms.knn import PrivateKNN
from capc_common.mechanisms.pate import ConfidentGNMax, GNMax, LNMax
from capc_common.mechanisms.prototypes import DPPrototypes, nearest_prototype, normalise
from capc_common.mechanisms.release import (
    FixedPoint,
    ReleaseMechanism,
    calibrate,
    masked_total,
    reveal,
    share_contribution,
)
from capc_common.mechanisms.voters import HeadsVoter, KNNVoter, PartyResources, Voter, per_example

__all__ = [
    "BatchNoise",
    "ConfidentGNMax",
    "DPPrototypes",
    "FixedPoint",
    "GNMax",
    "HeadsVoter",
    "KNNVoter",
    "LNMax",
    "PartyResources",
    "PrivateKNN",
    "ReleaseMechanism",
    "SecureDPSGD",
    "SelectionMechanism",
    "Voter",
    "calibrate",
    "masked_total",
    "nearest_prototype",
    "normalise",
    "per_example",
    "poisson_sample",
    "reveal",
    "share_contribution",
]
