"""Mechanisms as plug-in objects of the one engine (DESIGN §3): each holds its public parameters, its
accounting, its noise draws in canonical order, its plaintext rule and its secure path.

Front door: :class:`SelectionMechanism` (the interface of the PATE family) and its implementations
:class:`ConfidentGNMax`, :class:`GNMax` and :class:`LNMax`. The central runner (``capc dietpate run``) and the
federation's services take such an object; neither branches on a mechanism's name.
"""

from capc_common.mechanisms.base import BatchNoise, SelectionMechanism
from capc_common.mechanisms.pate import ConfidentGNMax, GNMax, LNMax

__all__ = ["BatchNoise", "ConfidentGNMax", "GNMax", "LNMax", "SelectionMechanism"]
