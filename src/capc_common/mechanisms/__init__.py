"""Mechanisms as plug-in objects of the one engine (DESIGN §3): each holds its public parameters, its
accounting, its noise draws in canonical order, its output rule and its secure path.

Two families share the engine's parties, sharing, guardian and ledger:

* selection (:class:`SelectionMechanism`): parties contribute per-query vote counts and a 2PC noisy argmax
  releases labels (the plaintext rules, :func:`confident_rule` and :func:`noisy_argmax`, in
  :mod:`~capc_common.mechanisms.pate`) — :class:`ConfidentGNMax` (the federation's default), :class:`GNMax`,
  :class:`LNMax`, :class:`PrivateKNN` (kNN votes of Poisson-subsampled records);
* release (:class:`ReleaseMechanism`): parties contribute fixed-point integer vectors and the guardian's
  noisy total is released — :class:`DPPrototypes` (DPPL) and :class:`SecureDPSGD` (one release per round).

:class:`PublicPrototypes` (DPPL-Public: prototypes selected from a synthetic candidate pool by the exponential
mechanism) runs centrally only (:func:`~capc_common.mechanisms.central.run_public_prototypes`); its
report-noisy-max form :class:`PublicPrototypeVotes` (noisy nearest-candidate vote counts, top-K per class)
is a release mechanism and runs in the federation too.

Prom-PATE is a selection mechanism with another kind of teacher (:mod:`capc_common.learn.prompts`); its
central runner is :func:`run_prom_pate`, which charges any selection mechanism through
:func:`answer_within_budget`.

The central runners (:mod:`capc_common.mechanisms.central`, ``capc dietpate run``) and the federation's
services take such an object; neither branches on a mechanism's name.
"""

from capc_common.mechanisms.base import UNANSWERED, BatchNoise, SelectionMechanism, TrainedTeachers
from capc_common.mechanisms.dpsgd import SecureDPSGD, poisson_sample
from capc_common.mechanisms.knn import PrivateKNN
from capc_common.mechanisms.pate import ConfidentGNMax, GNMax, LNMax, confident_rule, noisy_argmax
from capc_common.mechanisms.prompate import (
    Answers,
    PromPATE,
    PromPATEResult,
    answer_within_budget,
    release_and_learn,
    run_prom_pate,
)
from capc_common.mechanisms.prototypes import DPPrototypes, nearest_prototype, normalise
from capc_common.mechanisms.public_prototypes import PublicPrototypes
from capc_common.mechanisms.public_votes import PublicPrototypeVotes
from capc_common.mechanisms.release import (
    FixedPoint,
    ReleaseMechanism,
    calibrate,
    masked_total,
    reveal,
    share_contribution,
)
from capc_common.mechanisms.voters import (
    HeadsVoter,
    KNNVoter,
    PartyResources,
    PromptedVoter,
    Voter,
    per_example,
)

__all__ = [
    "UNANSWERED",
    "Answers",
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
    "PromPATE",
    "PromPATEResult",
    "PromptedVoter",
    "PublicPrototypeVotes",
    "PublicPrototypes",
    "ReleaseMechanism",
    "SecureDPSGD",
    "SelectionMechanism",
    "TrainedTeachers",
    "Voter",
    "answer_within_budget",
    "calibrate",
    "confident_rule",
    "masked_total",
    "nearest_prototype",
    "noisy_argmax",
    "normalise",
    "per_example",
    "poisson_sample",
    "release_and_learn",
    "reveal",
    "run_prom_pate",
    "share_contribution",
]
