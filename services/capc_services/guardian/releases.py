"""The guardian of a release federation (DP prototypes, secure-aggregation DP-SGD): seeds in, charge, noise,
masked total out.

Per release (DESIGN §3, "commit before reveal"):

* every teacher party sends the 16-byte seed of its mask once (``submit_contribution``); the guardian keeps
  it in memory only, so a restart loses unreleased seeds and the student starts that release again under a
  fresh id (seeds cost nothing);
* the student asks for the release (``release``): the guardian reserves and begins the mechanism's
  ``release_rdp`` on its ledger — refused with nothing written when the budget cannot pay — so the release is
  charged at its full cost before any noise is drawn; it then draws its noise and settles, keeping
  ``Σ AES-CTR(seed_p) + z`` as the settle's receipt in the same transaction, and only then returns it. Without
  the student's shares that message is uniformly random; with them it is the noisy total, whose cost is
  already on disk. A release id is charged and answered once: the student asking again for a charged id
  with the same parties (its reply was lost on the way) gets the same bytes again — no new information, no
  new charge — and any other replay is refused, so one charge never buys two noisy totals.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_common.federation.releases import ReleaseProtocol
from capc_common.mechanisms import masked_total
from capc_common.mpc.sharing import SEED_BYTES
from capc_common.privacy import BudgetLedger, NoiseSource
from capc_services.common.metrics import PartyMetrics
from capc_services.guardian.core import PartySeen
from capc_services.guardian.metrics import BudgetCollector, pinned_head

_log = logging.getLogger(__name__)


PENDING_RELEASES = 8
"""Releases for which the guardian holds one party's seed before the student asks for them: release ids are
the caller's, so a party's seed for yet another one replaces its own oldest pending seed, never grows the
guardian's memory (an honest party has one or two pending: the release in hand, one a restart abandoned)."""


class ReleaseReplayError(InputError):
    """A release id that was charged already, or a party's second seed for one release (ALREADY_EXISTS)."""


class MissingSeedsError(InputError):
    """The student asked for a release before every party it names sent its seed (FAILED_PRECONDITION)."""


class ReleaseGuardian:
    """Thread-safe guardian state of a release federation.

    Args:
        config: the federation config.
        ledger: the durable ledger (its budget and order are the federation's).
        noise: the guardian's discrete Gaussian source (a CSPRNG outside tests).
        protocol: the federation's release protocol (its mechanism noises and prices each release).
        metrics: this party's metrics.
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        ledger: BudgetLedger,
        noise: NoiseSource,
        protocol: ReleaseProtocol,
        metrics: PartyMetrics,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.noise = noise
        self.protocol = protocol
        self.metrics = metrics
        self._rdp = protocol.release_rdp(config.budget.order)
        self._params = {**protocol.mechanism.params(), "order": config.budget.order}
        self._sampler_delta = protocol.sampler_delta(epsilon=config.budget.epsilon)
        self._seeds: dict[str, dict[str, bytes]] = {}
        self._lock = threading.Lock()
        self._release_lock = threading.Lock()  # noise is drawn release by release: the canonical order
        self.parties: dict[str, PartySeen] = {
            config.student: PartySeen(role="student"),
            **{name: PartySeen(role="teacher") for name in config.teacher_names},
        }
        metrics.registry.register(BudgetCollector(self.budget))

    def _seen(self, party: str) -> None:
        seen = self.parties.get(party)
        if seen is not None:
            seen.last_seen = time.time()
            seen.batches += 1

    @staticmethod
    def _check_id(release_id: str) -> str:
        if not 1 <= len(release_id) <= 128:
            raise InputError(f"release id must be 1-128 characters, got {len(release_id)}")
        return release_id

    def _answered(self, release_id: str, parties: Sequence[str]) -> npt.NDArray[np.int64] | None:
        """The total a charged release was answered with, to send again to the student asking again with the
        same parties (None: the id was never settled with a receipt)."""
        record, kept = self.ledger.batch(release_id), self.ledger.receipt(release_id)
        if record is None or record.state != "settled" or kept is None:
            return None
        named, _, total = kept[1].partition(b"\n")
        if json.loads(named) != list(parties):
            raise ReleaseReplayError(
                f"release {release_id} was charged and answered for parties {json.loads(named)}; it is not "
                f"answered again for {list(parties)}"
            )
        return np.frombuffer(total, dtype="<i8").astype(np.int64)

    def _refuse_charged(self, release_id: str) -> None:
        record = self.ledger.batch(release_id)
        if record is not None:
            raise ReleaseReplayError(
                f"release {release_id} is already on the ledger ({record.state}); a release id is charged "
                "and answered once: the student starts a new release under a fresh id"
            )

    def submit_contribution(self, *, release_id: str, party: str, seed: bytes, length: int) -> int:
        """Keep ``party``'s mask seed for one release; returns how many parties' seeds it now holds.

        Raises:
            InputError: a malformed id, seed or length, or a party that is not a teacher.
            ReleaseReplayError: the release was charged already, or this party already sent its seed.
        """
        self._check_id(release_id)
        if party not in self.config.teacher_names:
            raise InputError(f"{party!r} is not a teacher party of federation {self.config.name!r}")
        if len(seed) != SEED_BYTES:
            raise InputError(f"{party} sent a {len(seed)}-byte seed; exactly {SEED_BYTES} bytes are required")
        if length != self.protocol.length:
            raise InputError(
                f"{party} contributes {length} coordinates to release {release_id}; the mechanism "
                f"{self.protocol.mechanism.name} releases {self.protocol.length}"
            )
        self._refuse_charged(release_id)
        with self._lock:
            held = self._seeds.setdefault(release_id, {})
            if held.get(party) == bytes(seed):  # a retry of the same contribution: nothing new is learnt
                return len(held)
            if party in held:
                raise ReleaseReplayError(
                    f"{party} already sent another seed for release {release_id}; a party contributes once"
                )
            self._forget_oldest(party)
            held[party] = bytes(seed)
            received = len(held)
        self._seen(party)
        return received

    def _forget_oldest(self, party: str) -> None:
        """Keep at most :data:`PENDING_RELEASES` ``- 1`` pending seeds of ``party`` (under ``_lock``)."""
        pending = [rid for rid, held in self._seeds.items() if party in held]
        for rid in pending[: max(0, len(pending) - (PENDING_RELEASES - 1))]:
            held = self._seeds[rid]
            del held[party]
            if not held:
                del self._seeds[rid]
            _log.info("pending seed dropped", extra={"party": party, "release_id": rid})

    def release(
        self, *, release_id: str, parties: Sequence[str], actor: str
    ) -> tuple[npt.NDArray[np.int64], float, float]:
        """Charge one release durably, then return ``Σ masks + noise`` with the RDP charged and remaining.

        Raises:
            InputError: a malformed id, unknown or repeated parties, or fewer than the quorum.
            MissingSeedsError: a named party's seed has not arrived (nothing charged).
            ReleaseReplayError: the id was charged already for other parties, or began and never settled
                (nothing revealed again). Asked again with the same parties, a settled id returns its total.
            BudgetExhaustedError: the release does not fit the budget (nothing charged, nothing revealed).
        """
        self._check_id(release_id)
        unknown = sorted(set(parties) - set(self.config.teacher_names))
        if unknown or len(set(parties)) != len(parties):
            raise InputError(
                f"{actor} named parties {list(parties)} for release {release_id}; each must be a teacher "
                f"party of this federation, once (unknown: {unknown})"
            )
        if len(parties) < self.config.quorum.min_parties:
            raise InputError(
                f"release {release_id} names {len(parties)} parties; the federation's quorum is "
                f"{self.config.quorum.min_parties}"
            )
        ordered = [p for p in self.config.teacher_names if p in parties]
        with self._release_lock:
            again = self._answered(release_id, ordered)
            if again is not None:
                _log.info("release sent again", extra={"release_id": release_id, "parties": ordered})
                return again, self._rdp, float(self.ledger.summary()["remaining_rdp"])
            self._refuse_charged(release_id)
            with self._lock:
                held = dict(self._seeds.get(release_id, {}))
            missing = [p for p in ordered if p not in held]
            if missing:
                raise MissingSeedsError(
                    f"release {release_id}: no seed from {missing} yet; ask again once every named party "
                    "has contributed (nothing was charged)"
                )
            nonce = secrets.token_hex(16)
            with self.metrics.stage("ledger"):
                self.ledger.reserve(
                    release_id,
                    queries=1,
                    parties=ordered,
                    mechanism=self.protocol.mechanism.name,
                    params=self._params,
                    worst_case_rdp=self._rdp,
                    actor=actor,
                )
                self.ledger.begin(release_id, computation=nonce, actor=actor)
            # Begun: charged at its full cost before the noise is even drawn, whatever happens next.
            masked = masked_total(
                [held[p] for p in ordered], noise=self.protocol.mechanism.guardian_noise(self.noise)
            )
            receipt = json.dumps(ordered).encode() + b"\n" + masked.astype("<i8").tobytes()
            with self.metrics.stage("ledger"):
                entry = self.ledger.settle(
                    release_id,
                    answered=1,
                    actual_rdp=self._rdp,
                    actor=actor,
                    computation=nonce,
                    receipt=receipt,
                )
            with self._lock:
                self._seeds.pop(release_id, None)
        self._seen(actor)
        self.metrics.batches.labels(outcome="settled").inc()
        remaining = float(self.ledger.summary()["remaining_rdp"])
        _log.info(
            "release charged and sent",
            extra={
                "release_id": release_id,
                "parties": ordered,
                "rdp": self._rdp,
                "remaining_rdp": remaining,
                # Pin it elsewhere: `capc budget verify --expect-head` then detects a tail cut later.
                **pinned_head(entry),
            },
        )
        return masked, self._rdp, remaining

    def budget(self) -> dict[str, Any]:
        """The ledger summary, the kind of noise this guardian draws, and the δ the guarantee holds at once
        the samplers' distance is added (``delta_total``)."""
        summary = dict(self.ledger.summary())
        summary["noise"] = type(self.noise).__name__
        summary["noise_secure"] = bool(getattr(self.noise, "secure", True))
        summary["mechanism"] = self._params
        summary["delta_sampler"] = self._sampler_delta
        summary["delta_total"] = summary["delta"] + self._sampler_delta
        return summary
