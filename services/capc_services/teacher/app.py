"""``capc teacher serve``: a teacher party's process (outbound connections only)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter

from capc_common.aggregation import sampling_noise
from capc_common.errors import InputError
from capc_common.federation import ReleaseMember, exposure_of, mechanism_of
from capc_common.federation.releases import check_records
from capc_common.mechanisms import Voter
from capc_services.common.admin import RecentCheck, api_router
from capc_services.common.party import PartyRuntime, apply_threads
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.client import TeacherLinks
from capc_services.teacher.contributor import POLL_TIMEOUT_S, ReleaseContributor
from capc_services.teacher.records import create_missing_records, open_records
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.worker import TeacherWorker

if TYPE_CHECKING:
    from capc_common.federation import FederationConfig
    from capc_common.learn.heads import HeadEnsemble
    from capc_common.models import Backbone
    from capc_common.models.cache import FeatureCache
    from capc_common.privacy import NoiseSource

_log = logging.getLogger(__name__)


def load_heads(settings: TeacherSettings) -> HeadEnsemble:
    """The party's heads, checked against federation.yaml (head count, classes).

    Raises:
        InputError: the file is missing or does not match the federation.
    """
    from capc_common.learn.heads import HeadEnsemble  # torch: only a voting party loads heads

    config = settings.federation_config
    heads = HeadEnsemble.load(settings.heads)
    expected = config.teacher(settings.party).heads
    if heads.heads != expected or heads.classes != config.classes:
        raise InputError(
            f"{settings.heads} holds {heads.heads} heads over {heads.classes} classes; federation.yaml gives "
            f"{settings.party} {expected} heads over {config.classes} classes "
            "(retrain with `capc teacher train`)"
        )
    return heads


class SiteResources:
    """What a teacher site lends its voter (:class:`~capc_common.mechanisms.PartyResources`), loaded only
    when the mechanism's voter asks: heads for PATE, prompted teachers for Prom-PATE, the site's own records
    and sampling stream for Private-kNN.

    Args:
        settings: the site's settings.
        backbone: the verified shared backbone.
    """

    def __init__(self, settings: TeacherSettings, backbone: Backbone) -> None:
        self.settings = settings
        self._backbone = backbone

    @property
    def backbone(self) -> Backbone:
        """The shared backbone."""
        return self._backbone

    @property
    def teachers_file(self) -> Path:
        """The site's teachers file (``heads:`` in its site file; ``capc teacher train`` writes it)."""
        return self.settings.heads

    def heads(self) -> HeadEnsemble:
        """The site's heads file (:func:`load_heads`)."""
        return load_heads(self.settings)

    def records(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """The site's labelled images (its ``data:`` section, as ``capc teacher train`` reads it)."""
        from capc_services.teacher.train import check_labels, party_examples

        images, labels, name = party_examples(self.settings)
        check_labels(labels, classes=self.settings.federation_config.classes, name=name)
        return images, np.asarray(labels, dtype=np.int64)

    @property
    def feature_cache(self) -> FeatureCache | None:
        """The site's shared query-feature cache (``feature_cache:`` in its site file), if any."""
        from capc_common.models.cache import FeatureCache

        return None if self.settings.feature_cache is None else FeatureCache(self.settings.feature_cache)

    def sampling(self) -> NoiseSource:
        """The site's sampling CSPRNG, or its seeded stream when federation.yaml seeds the noise."""
        seed = self.settings.federation_config.mechanism.insecure_noise_seed
        return sampling_noise(self.settings.party, seed=seed)


def make_voter(settings: TeacherSettings, backbone: Backbone) -> Voter:
    """The site's voter under the federation's mechanism (the mechanism decides what the party contributes).

    Raises:
        InputError: what the voter needs (heads, data) is missing or does not fit the federation.
    """
    return mechanism_of(settings.federation_config).voter(SiteResources(settings, backbone))


def status_router(worker: TeacherWorker, links: TeacherLinks, cap: LocalCap) -> APIRouter:
    """``/api/v1/status`` over the party's worker, links and local cap."""
    api = api_router()

    @api.get("/status", tags=["teacher"])
    def status() -> dict[str, Any]:
        """Connection state, the local ε cap and what this party answered or refused."""
        return {
            "party": links.party,
            "connected_to_student": links.connected,
            "last_error": links.last_error,
            "heads": worker.voter.heads,
            "voter": worker.voter.describe(),
            "allow_raw_queries": worker.allow_raw,
            "local_cap": {
                "epsilon_spent": cap.epsilon,
                "epsilon_cap": cap.cap,
                "batches": cap.batches,
                "queries": cap.queries,
            },
            "answered_batches": worker.stats.answered,
            "refused_batches": worker.stats.refused,
            "queries_answered": worker.stats.queries,
            "last_batch": worker.stats.last_batch,
            "last_refusal": worker.stats.last_refusal,
        }

    return api


GUARDIAN_CHECK_EVERY_S = 5.0
"""How long a teacher's readiness keeps its answer to "does the guardian accept a TLS connection"."""


def vote_readiness(
    links: TeacherLinks, *, guardian: str, every_s: float = GUARDIAN_CHECK_EVERY_S
) -> Callable[[], dict[str, tuple[bool, Any]]]:
    """A voting teacher's readiness checks: its work stream to the student, and whether the guardian answers
    under this party's config (else the reason, e.g. its other hash) — dialled at most once every
    ``every_s`` seconds however often ``/readyz`` is asked."""
    problem = RecentCheck(lambda: links.guardian_problem(timeout=0.5), every_s=every_s)

    def checks() -> dict[str, tuple[bool, Any]]:
        found = problem()
        return {
            "student": (links.connected, links.last_error or "connected"),
            "guardian": (not found, f"{guardian} {found}" if found else guardian),
        }

    return checks


def serve_releases(
    settings: TeacherSettings, party: PartyRuntime, cap: LocalCap, *, stop: threading.Event
) -> None:
    """Run a release federation's teacher party: featurise its own records once (per example), then
    contribute to every release the student opens until ``stop`` is set.

    The records are featurised in a process of its own
    (:func:`~capc_services.teacher.featurise.featurise_apart`: this one never loads the backbone), unless the
    protocol featurised public images as it was built (DPPL-Public's pool): this process holds the backbone
    then, and uses it. A stop while they are featurised ends the party without an error.
    """
    from capc_common.mechanisms.central import records_digest
    from capc_services.teacher.featurise import Expected, featurise_apart
    from capc_services.teacher.train import check_labels, party_examples, record_features

    config = party.config
    protocol = party.runnable.release_protocol()
    images, labels, name = party_examples(settings)
    check_labels(np.asarray(labels), classes=config.classes, name=name)
    check_records(config, len(labels))
    if _featurises_when_built(config):
        features = record_features(settings, party.backbone, images)
        del images
    else:
        expected = Expected(config.config_hash(), records_digest(images), party.runnable.feature_dim)
        del images  # the featurising process reads them itself
        apart = featurise_apart(settings, protocol, expected=expected, stop=stop)
        if apart is None:
            _log.info("teacher stopped while its records were featurised")
            return
        features = apart
    if len(features) != len(labels):
        raise InputError(f"{len(features)} records were featurised, {len(labels)} are labelled ({name})")
    _log.info("features ready", extra={"records": len(labels), "data": name})
    contributor = ReleaseContributor(
        config=config,
        party=settings.party,
        tls=party.tls,
        student_address=settings.student_address,
        guardian_address=settings.guardian_address,
        protocol=protocol,
        features=features,
        labels=np.asarray(labels, dtype=np.int64),
        source=sampling_noise(settings.party, seed=config.mechanism.insecure_noise_seed),
        cap=cap,
        metrics=party.metrics,
        consume=True,
    )
    # The contributor keeps the records on the public basis (a quarter of their raw features' memory, for
    # secure-aggregation DP-SGD); the raw features, overwritten by their normalised rows, are not used again.
    del features
    api = api_router()
    api.get("/status", tags=["teacher"])(contributor.status)
    party.start_admin(
        readiness=lambda: {"student": (contributor.connected, contributor.last_error or "connected")},
        routers=[api],
    )
    runner = threading.Thread(target=contributor.run, args=(stop,), name="releases", daemon=True)
    runner.start()
    try:
        stop.wait()
    finally:
        runner.join(timeout=POLL_TIMEOUT_S + 5)
        contributor.close()
        party.stop_admin()
        _log.info("teacher stopped")


def _featurises_when_built(config: FederationConfig) -> bool:
    """Whether the federation's release protocol featurises public images as it is built (its party process
    holds the backbone then, and featurises its records with it too)."""
    mechanism = config.mechanism
    return isinstance(mechanism, ReleaseMember) and mechanism.featurises_when_built


def serve(settings: TeacherSettings, *, stop: threading.Event, set_up: bool = False) -> None:
    """Run a teacher party until ``stop`` is set.

    Args:
        settings: the site.
        stop: set to stop.
        set_up: a new site (``serve --train-missing``): create whichever of its cap record and site ledger is
            missing, once the federation was found runnable.

    Raises:
        InputError: federation.yaml seeds the noise and the site did not opt in (``allow_insecure_noise``).
        BudgetExhaustedError: the federation's plan does not fit the hospital's lifetime budget.
    """
    if settings.federation_config.insecure_noise and not settings.allow_insecure_noise:
        raise InputError(
            "federation.yaml seeds the guardian's and student's noise (mechanism.insecure_noise_seed): "
            "labels would be reproducible and NOT private, so this party refuses to vote. Only for a test "
            "federation: set allow_insecure_noise: true in this party's site file"
        )
    # Contributions to noisy totals, no votes: the records are featurised by a process of their own
    # (serve_releases), so this one loads the backbone only for a protocol that featurises public images as
    # it is built, reading the shared cache of them (whose code imports torch) only then.
    releases = isinstance(settings.federation_config.mechanism, ReleaseMember)
    model = not releases or _featurises_when_built(settings.federation_config)
    apply_threads(settings.torch_threads, backbone=model)  # before the start-up check featurises anything
    party = PartyRuntime(settings, role="teacher", model=model, public_cache=model)
    config = party.config
    exposure = exposure_of(config, protocol=party.runnable.protocol)
    if set_up:
        for record, path in create_missing_records(settings, exposure).items():
            _log.info("created", extra={"record": record, "path": path})
    # Held for the life of this process: a second process of this party is refused here, before it loads
    # its data or dials anyone (docs/operations.md, "One identity, one process"); a federation that does
    # not fit the hospital's lifetime budget is refused here too, before anything is charged.
    cap = open_records(settings, config, exposure)
    try:
        if releases:
            serve_releases(settings, party, cap, stop=stop)
        else:
            _serve_votes(settings, party, cap, stop=stop)
    finally:
        cap.close()


def _serve_votes(
    settings: TeacherSettings, party: PartyRuntime, cap: LocalCap, *, stop: threading.Event
) -> None:
    """Answer the student's work items with this party's votes until ``stop`` is set."""
    voter = make_voter(settings, party.backbone)
    images = None
    if settings.feature_cache is not None:  # co-located parties generate each synthetic batch once
        from capc_common.models.cache import FeatureCache

        images = FeatureCache(settings.feature_cache).images
    worker = TeacherWorker(
        config=party.config,
        voter=voter,
        cap=cap,
        metrics=party.metrics,
        allow_raw_queries=settings.allow_raw_queries,
        images=images,
    )
    links = TeacherLinks(
        config=party.config,
        party=settings.party,
        tls=party.tls,
        student_address=settings.student_address,
        guardian_address=settings.guardian_address,
        worker=worker,
        metrics=party.metrics,
    )
    party.start_admin(
        readiness=vote_readiness(links, guardian=settings.guardian_address),
        routers=[status_router(worker, links, cap)],
    )
    runner = threading.Thread(target=links.run, args=(stop,), name="work-stream", daemon=True)
    runner.start()
    _log.info("teacher running", extra={**voter.describe(), "admin_port": party.admin_port})
    try:
        stop.wait()
    finally:
        links.close()
        runner.join(timeout=10)
        party.stop_admin()
        _log.info("teacher stopped")
