"""What every party derives alike from ``federation.yaml``: the MPC parameters and the shared backbone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from capc_common.errors import CapcError, InputError
from capc_common.federation.config import FederationConfig
from capc_common.federation.costs import mechanism_of
from capc_common.mpc import MpcConfig

if TYPE_CHECKING:
    from capc_common.federation.releases import LazyBackbone, ReleaseProtocol
    from capc_common.models import Backbone


def mpc_config(config: FederationConfig) -> MpcConfig:
    """The 2PC parameters of the federation's mechanism for all its heads (the smallest ring holding every
    noisy count). Both the guardian and the student call this, and the MPC handshake checks that they agree.
    """
    return mechanism_of(config).mpc_config(teachers=config.total_heads)


@dataclass(frozen=True)
class Runnable:
    """What :func:`check_runnable` verified, kept for the party that runs it: building it was the check (a
    DPPL-Public protocol featurises its whole public pool), so nothing is built twice.

    The protocol is stateful (the student absorbs every release into it) and handed out as the same
    instance: one party process, one consumer.

    Attributes:
        loaded: the shared backbone, SHA-256 checked; how to load it on first use (a release mechanism checked
            with ``model=False``: the protocol and the party share the one model); None where only its file
            was checked (``model=False``).
        feature_dim: the length of the backbone's features (from its file where it was not loaded), what a
            party's records are featurised to.
        protocol: a release mechanism's protocol (None for mechanisms with query batches).
    """

    loaded: Backbone | LazyBackbone | None
    feature_dim: int
    protocol: ReleaseProtocol | None = None

    @property
    def backbone(self) -> Backbone:
        """The shared backbone (loaded now, if it is loaded on first use).

        Raises:
            InputError: the check ran with ``model=False`` (the party runs no model at start-up).
        """
        if self.loaded is None:
            raise InputError("this party checked the backbone's file only and loaded no model")
        from capc_common.federation.releases import LazyBackbone

        return self.loaded() if isinstance(self.loaded, LazyBackbone) else self.loaded

    def release_protocol(self) -> ReleaseProtocol:
        """The release protocol; only release federations have one.

        Raises:
            InputError: the federation's mechanism has query batches, not releases.
        """
        if self.protocol is None:
            raise InputError("this federation's mechanism has query batches, not a release protocol")
        return self.protocol


def check_runnable(config: FederationConfig, *, model: bool = True, cache: Path | None = None) -> Runnable:
    """Refuse a federation that could never run, at start-up, naming the field to fix.

    Pydantic checks each field of ``federation.yaml`` alone; this checks what the parties will do with them:
    the budget pays for one batch, the query stream makes valid batches (a known generator, a supported
    image shape, ``bn_batch`` chunks), the backbone exists with the pinned SHA-256, and it takes the queries'
    image shape. Every party calls it before serving, so none starts (or creates a ledger, a label store or a
    cap record) on a configuration that can only fail later.

    Args:
        config: the federation.
        model: load the backbone (a party that runs it now: a teacher). False checks its checkpoint file
            alone, without torch (:func:`~capc_common.models.verify_backbone`): the guardian never runs it and
            the student loads it once, when it trains or (a release mechanism) first featurises. A release
            mechanism's protocol is built either way, loading the model only if it featurises at once
            (DPPL-Public's pool).
        cache: the party's shared cache of public images' features (``feature_cache`` in its site file),
            where a release protocol computes public arrays once per machine.

    Returns:
        The verified shared backbone (when loaded) and, for a release mechanism, its protocol (parties that
        run them keep them).

    Raises:
        InputError: a parameter no party could run with.
        IntegrityError: the backbone's SHA-256 is not the pinned one.
    """
    from capc_common.federation.config import ReleaseMember
    from capc_common.federation.costs import check_batch_fits
    from capc_common.federation.plan import batch_plan, usable_queries
    from capc_common.federation.releases import protocol_for

    q = config.queries
    if isinstance(config.mechanism, ReleaseMember):  # no query batches: the releases must fit instead
        from capc_common.federation.releases import LazyBackbone

        backbone: Backbone | LazyBackbone
        if model:
            backbone = _shape_checked_backbone(config)
            dim = backbone.feature_dim
        else:  # loaded only if the protocol or the party featurises something
            dim = _shape_checked_file(config)
            backbone = LazyBackbone(lambda: _shape_checked_backbone(config))
        shared = None
        if cache is not None:
            from capc_common.models.cache import FeatureCache  # torch

            shared = FeatureCache(cache)
        return Runnable(backbone, dim, protocol_for(config, dim=dim, backbone=backbone, cache=shared))
    check_batch_fits(config)
    if usable_queries(config) == 0:
        raise InputError(
            f"queries.total {q.total} is below queries.bn_batch {q.bn_batch}: no batch can be made"
        )
    try:
        batch_plan(config, first_index=0, count=min(q.batch_size, usable_queries(config)))
    except InputError as exc:
        raise InputError(f"federation.yaml queries cannot make a batch: {exc}") from None
    if model:
        loaded = _shape_checked_backbone(config)
        return Runnable(loaded, loaded.feature_dim)
    return Runnable(None, _shape_checked_file(config))


def _shape_checked_backbone(config: FederationConfig) -> Backbone:
    """The shared backbone, refused unless it takes the federation's image shape (``queries``)."""
    try:
        backbone = load_shared_backbone(config)
    except CapcError as exc:
        raise type(exc)(f"federation.yaml backbone: {exc}") from None
    _check_shape(config, backbone.input_shape)
    return backbone


def _shape_checked_file(config: FederationConfig) -> int:
    """The same check from the backbone's checkpoint file alone (no torch, no model built); returns its
    feature dimension."""
    from capc_common.models import verify_backbone

    try:
        shape, dim = verify_backbone(config.backbone.name, sha256=config.backbone.sha256)
    except CapcError as exc:
        raise type(exc)(f"federation.yaml backbone: {exc}") from None
    _check_shape(config, shape)
    return dim


def _check_shape(config: FederationConfig, shape: tuple[int, int, int]) -> None:
    """Refuse a backbone that does not take the federation's image shape."""
    q = config.queries
    if shape != (q.height, q.width, q.channels):
        have = "x".join(map(str, shape))
        raise InputError(
            f"federation.yaml backbone {config.backbone.name} takes {have} images, but queries asks for "
            f"{q.height}x{q.width}x{q.channels}; pin a backbone for that shape or change the query shape"
        )


def load_shared_backbone(config: FederationConfig) -> Backbone:
    """The federation's backbone, refused unless its SHA-256 is the one pinned in federation.yaml.

    Raises:
        InputError: unknown backbone or a different hash.
    """
    from capc_common.models import load_backbone  # torch: only the parties that run models pay for it

    return load_backbone(config.backbone.name, sha256=config.backbone.sha256)
