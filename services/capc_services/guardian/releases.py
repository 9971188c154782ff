"""The guardian of a release federation (DP prototypes, DPPL-Public, secure-aggregation DP-SGD): seeds in, its
part of the noise, charge, masked total out — each round of the plan charged once, on its ledger.

Per release (DESIGN §3, "commit before reveal"):

* every teacher party sends the 16-byte seed of its mask once per attempt (``submit_contribution``), at the
  same time as its masked share goes to the student, naming the round its contribution is for; the guardian
  keeps it in memory only, so a restart loses unreleased seeds and the student starts that round again under
  a fresh attempt id (seeds cost nothing);
* the student asks for round ``t`` of the plan (``release``) over the parties whose shares it holds: the
  guardian waits, up to the quorum's share deadline, for those parties' seeds (as ``ComputeStart`` does for a
  batch) — one that never arrives is named in the refusal (:class:`MissingSeedsError`, nothing charged), and
  the student asks again without it or starts the round again. Then it draws its part of the noise and
  charges the release on its ledger — reserve, compute and settle in one durable transaction that keeps the
  reply as its receipt, or nothing at all when the budget cannot pay or the disk refuses — and only then
  answers ``Σ AES-CTR(seed_p) + z_g``. Without the student's half that message is uniformly random; with it
  it is the noisy total, whose cost is already on disk. Waiting here instead of having each teacher wait for
  its seed's acknowledgement before it sends its share takes one round trip off every release.

**An attempt is released in its round only.** A teacher's seed names its round, and an attempt's seeds are
released only for that round; an attempt charged for round ``t`` is refused for any other round, and so is
any seed sent for it naming another — also after a restart, which rebuilds that record from the ledger's
receipts (each written in the charge's transaction, before the total left). Otherwise a student holding one
attempt's shares could, after a guardian restart, have the same seeds charged for a second round and decode
a second noisy total of one sample (the teacher's cache re-sends the same seed to a re-offer), which its
teacher charged once.

**The guardian counts releases.** Round ``t``'s ledger batch is ``release-<plan>-<t>`` with ``0 ≤ t <`` the
plan's releases (the plan: the ledger's federation config). A round beyond the plan is refused
(:class:`BeyondPlanError`); a round already charged is answered from its receipt — the same bytes, charged
nothing — whatever attempt asks. So a retry after any crash or fault is never charged twice, a student
cannot buy an extra round, and since the plan fits the budget (``protocol_for``) no sequence of faults can
spend the budget before the plan is done. The student deposits the total it revealed (``deposit``); the
ledger keeps it with the charge, and a student restarted without its journal resumes from that record
(``record``). Holding each round's total, the guardian sees what a coalition of it and any teacher party
sees (a teacher gets each round's state): the student's part of the noise protects it, and the model card
states that coalition's ε (``plan``).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_common.federation.releases import ReleaseProtocol, planned_figures
from capc_common.mechanisms import masked_total
from capc_common.mechanisms.release import RING_WIDTH
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
    """A party's second seed for one release, or an attempt already bound to another round: charged for
    one, or its seeds sent for one (ALREADY_EXISTS)."""


class MissingSeedsError(InputError):
    """A named party's seed did not arrive within the share deadline, or a total was deposited for a round not
    charged (FAILED_PRECONDITION; nothing charged).

    Attributes:
        missing: the named parties whose seeds never arrived (empty for a deposit).
    """

    def __init__(self, message: str, *, missing: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


class BeyondPlanError(InputError):
    """A round outside the federation's plan of releases (OUT_OF_RANGE)."""


@dataclass(frozen=True)
class Released:
    """The guardian's answer to a release: what it sent for the round, and what this call charged.

    Attributes:
        masked: ``Σ masks + z_g mod 2^62`` of the attempt that was charged.
        release_id: that attempt.
        parties: its parties (federation order).
        charged_rdp: RDP this call charged (0 when ``replayed``).
        replayed: the round was charged before; this is its receipt.
        remaining_rdp: what the ledger's budget has left.
    """

    masked: npt.NDArray[np.int64]
    release_id: str
    parties: tuple[str, ...]
    charged_rdp: float
    replayed: bool
    remaining_rdp: float = 0.0


@dataclass
class _Pending:
    """The seeds held for one attempt not yet charged, and the round its first seed named (every seed of the
    attempt must name it)."""

    round: int
    seeds: dict[str, bytes]


def _receipt(release_id: str, parties: Sequence[str], masked: npt.NDArray[np.int64]) -> bytes:
    """A release's receipt as the ledger keeps it: a length-prefixed JSON header, then the int64 total."""
    header = json.dumps({"release_id": release_id, "parties": list(parties)}).encode()
    return len(header).to_bytes(4, "big") + header + np.ascontiguousarray(masked, dtype="<i8").tobytes()


def _from_receipt(data: bytes) -> tuple[str, tuple[str, ...], npt.NDArray[np.int64]]:
    """``(release_id, parties, masked)`` from :func:`_receipt`'s bytes."""
    size = int.from_bytes(data[:4], "big")
    header = json.loads(data[4 : 4 + size])
    masked = np.frombuffer(data[4 + size :], dtype="<i8").astype(np.int64)
    return str(header["release_id"]), tuple(header["parties"]), masked


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
        #: The plan: the federation config the ledger charges for (a round's batch id names it).
        self.plan = ledger.config_hash_in_force
        self._refuse_unrounded_ledger()
        self._planned = planned_figures(protocol, config.budget)
        self._seeds: dict[str, _Pending] = {}
        self._lock = threading.Condition()  # notified as seeds arrive and as releases are charged
        #: The round each charged attempt was charged for, from the ledger's receipts: durable, so a restart
        #: still refuses an attempt's seeds for a second round.
        self._charged_attempts = self._attempts_charged()
        self._release_lock = threading.Lock()  # noise is drawn release by release: the canonical order
        self.parties: dict[str, PartySeen] = {
            config.student: PartySeen(role="student"),
            **{name: PartySeen(role="teacher") for name in config.teacher_names},
        }
        metrics.registry.register(BudgetCollector(self.budget))

    def _refuse_unrounded_ledger(self) -> None:
        """Refuse a ledger whose releases were charged by an earlier version, which did not record their round
        (this one counts releases by round, and could not tell which rounds those paid for), or whose plan
        is of another size.

        Raises:
            InputError: naming the ledger, what it holds and what to do.
        """
        unrounded = [e for e in self.ledger.entries(kinds=["reserve"]) if "release" not in e.params]
        if unrounded:
            raise InputError(
                f"the ledger {self.ledger.path} holds {len(unrounded)} release(s) charged by an earlier "
                "version that did not record their round; this version counts releases by round and cannot "
                "tell which of the plan's rounds they paid for. Finish this federation with the version that "
                "started it, or give the guardian a new ledger file (the budget spent on the old one stays "
                "spent)"
            )
        planned, _, _ = self.ledger.release_plan()
        if planned is not None and planned != self.protocol.rounds:
            raise InputError(
                f"the ledger {self.ledger.path} records a plan of {planned} releases; federation.yaml plans "
                f"{self.protocol.rounds}: give this plan its own ledger"
            )

    def _attempts_charged(self) -> dict[str, int]:
        """``{attempt: round}`` of every round the ledger charged, read from their receipts."""
        _, rounds, _ = self.ledger.release_plan()
        charged = {round: self._charged(batch) for round, batch in rounds.items()}
        return {found.release_id: round for round, found in charged.items() if found is not None}

    def _bound_elsewhere(self, release_id: str, round: int) -> ReleaseReplayError | None:
        """The refusal of attempt ``release_id`` for ``round`` when the attempt belongs to another round —
        charged for it, or its seeds sent for it — else None (under ``_lock``)."""
        charged = self._charged_attempts.get(release_id)
        if charged is not None and charged != round:
            return ReleaseReplayError(
                f"attempt {release_id} was charged for round {charged}, not {round}: an attempt's seeds are "
                "released in their round only (another round would be a second total of the same sample); "
                "nothing was charged, start the round under a fresh attempt"
            )
        pending = self._seeds.get(release_id)
        if charged is None and pending is not None and pending.round != round:
            return ReleaseReplayError(
                f"the seeds of attempt {release_id} were sent for round {pending.round}, not {round}: an "
                "attempt belongs to one round; nothing was charged, start the round under a fresh attempt"
            )
        return None

    def batch_id(self, round: int) -> str:
        """The ledger batch of round ``round`` of the plan: one per round, so a round is charged once."""
        return f"release-{self.plan[:16]}-{round:06d}"

    def _check_round(self, round: int) -> int:
        if not 0 <= round < self.protocol.rounds:
            raise BeyondPlanError(
                f"round {round} is outside the plan of {self.protocol.rounds} release(s) "
                f"(rounds 0 to {self.protocol.rounds - 1}); the guardian never charges a release beyond it"
            )
        return round

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

    def submit_contribution(
        self, *, release_id: str, round: int, party: str, seed: bytes, length: int
    ) -> int:
        """Keep ``party``'s mask seed for one release of round ``round``; returns how many parties' seeds it
        now holds (none for an attempt charged already for that round: its seeds were dropped then, and are
        never used again).

        Raises:
            InputError: a malformed id, seed or length, or a party that is not a teacher.
            BeyondPlanError: a round outside the plan.
            ReleaseReplayError: this party already sent another seed for the release, or the attempt belongs
                to another round (charged for it, or other parties' seeds named it).
        """
        self._check_id(release_id)
        self._check_round(round)
        if party not in self.config.teacher_names:
            raise InputError(f"{party!r} is not a teacher party of federation {self.config.name!r}")
        if len(seed) != SEED_BYTES:
            raise InputError(f"{party} sent a {len(seed)}-byte seed; exactly {SEED_BYTES} bytes are required")
        if length != self.protocol.length:
            raise InputError(
                f"{party} contributes {length} coordinates to release {release_id}; the mechanism "
                f"{self.protocol.mechanism.name} releases {self.protocol.length}"
            )
        with self._lock:
            elsewhere = self._bound_elsewhere(release_id, round)
            if elsewhere is not None:
                raise elsewhere
            if release_id in self._charged_attempts:  # a seed retried after its release: no longer needed
                return 0
            held = self._seeds.setdefault(release_id, _Pending(round, {})).seeds
            if held.get(party) == bytes(seed):  # a retry of the same contribution: nothing new is learnt
                return len(held)
            if party in held:
                raise ReleaseReplayError(
                    f"{party} already sent another seed for release {release_id}; a party contributes once"
                )
            self._forget_oldest(party)
            held[party] = bytes(seed)
            received = len(held)
            self._lock.notify_all()
        self._seen(party)
        return received

    def _forget_oldest(self, party: str) -> None:
        """Keep at most :data:`PENDING_RELEASES` ``- 1`` pending seeds of ``party`` (under ``_lock``)."""
        pending = [rid for rid, held in self._seeds.items() if party in held.seeds]
        for rid in pending[: max(0, len(pending) - (PENDING_RELEASES - 1))]:
            held = self._seeds[rid].seeds
            del held[party]
            if not held:
                del self._seeds[rid]
            _log.info("pending seed dropped", extra={"party": party, "release_id": rid})

    def release(self, *, release_id: str, round: int, parties: Sequence[str], actor: str) -> Released:
        """Round ``round``: its receipt if it was charged before, else charge it durably and return
        ``Σ masks + z_g`` of attempt ``release_id`` over ``parties``.

        Raises:
            BeyondPlanError: a round outside the plan.
            InputError: a malformed id, unknown or repeated parties, or fewer than the quorum.
            ReleaseReplayError: the attempt belongs to another round: charged for it, or its seeds sent for it
                (nothing charged).
            MissingSeedsError: a named party's seed did not arrive within the share deadline (nothing charged;
                ``missing`` names them).
            BudgetExhaustedError: the release does not fit the budget (nothing charged, nothing revealed).
        """
        self._check_id(release_id)
        self._check_round(round)
        batch = self.batch_id(round)
        ordered: list[str] = []
        if self._charged(batch) is None:  # a round charged before is answered at once, whatever it names
            ordered = self._quorum(release_id, parties, actor=actor)
            self._await_seeds(release_id, ordered)
        with self._release_lock:
            charged = self._charged(batch)  # charges are never undone: not charged now, not charged before
            if charged is not None:
                self._seen(actor)
                return replace(charged, remaining_rdp=float(self.ledger.summary()["remaining_rdp"]))
            with self._lock:
                elsewhere = self._bound_elsewhere(release_id, round)
                pending = self._seeds.get(release_id)
                held = dict(pending.seeds) if pending is not None else {}
            if elsewhere is not None:
                raise elsewhere
            missing = [p for p in ordered if p not in held]
            if missing:  # gone since the wait: only a charge of this attempt drops its seeds
                raise MissingSeedsError(
                    f"release {release_id}: no seed from {missing}; nothing was charged", missing=missing
                )
            masked = masked_total(
                [held[p] for p in ordered], noise=self.protocol.mechanism.noise_part(self.noise)
            )
            params = {**self._params, "release": {"round": round, "planned": self.protocol.rounds}}
            with self.metrics.stage("ledger"):
                # Reserve, compute and settle in one transaction with the reply as receipt: from here the
                # release is paid for; before, nothing was written and nothing is sent.
                entry = self.ledger.charge(
                    batch,
                    parties=ordered,
                    mechanism=self.protocol.mechanism.name,
                    params=params,
                    rdp=self._rdp,
                    computation=secrets.token_hex(16),
                    actor=actor,
                    receipt=_receipt(release_id, ordered, masked),
                )
            with self._lock:
                self._seeds.pop(release_id, None)
                self._charged_attempts[release_id] = round
                self._lock.notify_all()
        self._seen(actor)
        self.metrics.batches.labels(outcome="settled").inc()
        remaining = float(self.ledger.summary()["remaining_rdp"])
        _log.info(
            "release charged and sent",
            extra={
                "release_id": release_id,
                "round": round,
                "parties": ordered,
                "rdp": self._rdp,
                "remaining_rdp": remaining,
                # Pin it elsewhere: `capc budget verify --expect-head` then detects a tail cut later.
                **pinned_head(entry),
            },
        )
        return Released(
            masked, release_id, tuple(ordered), self._rdp, replayed=False, remaining_rdp=remaining
        )

    def _await_seeds(self, release_id: str, parties: Sequence[str]) -> None:
        """Wait, up to the quorum's share deadline, until every named party's seed for ``release_id`` arrived
        (teachers send seed and share at once, so a seed may trail the share the student holds) or the attempt
        was charged meanwhile (a retry of a request that went through: its receipt answers it).

        Raises:
            MissingSeedsError: a named party's seed did not arrive in time (nothing charged), naming them.
        """
        deadline = time.monotonic() + self.config.quorum.share_deadline_s
        with self._lock:
            while True:
                pending = self._seeds.get(release_id)
                held = pending.seeds if pending is not None else {}
                missing = [p for p in parties if p not in held]
                left = deadline - time.monotonic()
                if not missing or release_id in self._charged_attempts or left <= 0:
                    break
                self._lock.wait(timeout=left)
        if missing and release_id not in self._charged_attempts:
            raise MissingSeedsError(
                f"release {release_id}: no seed from {missing} within the share deadline "
                f"({self.config.quorum.share_deadline_s:g} s); nothing was charged: ask again without them, "
                "or start the round again",
                missing=missing,
            )

    def _charged(self, batch: str) -> Released | None:
        """The receipt of a round charged before (a retry, or a restarted student), or None."""
        record = self.ledger.batch(batch)
        if record is None:
            return None
        found = self.ledger.receipt(batch)
        if record.state != "settled" or found is None:
            raise InputError(
                f"ledger batch {batch} is {record.state} without a release receipt: it was not written by a "
                "release guardian of this version; give this plan its own ledger"
            )
        release_id, parties, masked = _from_receipt(found[1])
        return Released(masked, release_id, parties, 0.0, replayed=True)

    def _quorum(self, release_id: str, parties: Sequence[str], *, actor: str) -> list[str]:
        """``parties`` in federation order, each a teacher party once, at least the quorum.

        Raises:
            InputError: unknown or repeated parties, or fewer than the quorum.
        """
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
        return [p for p in self.config.teacher_names if p in parties]

    def deposit(
        self, *, round: int, release_id: str, total: npt.NDArray[np.int64], actor: str
    ) -> dict[str, Any]:
        """Keep the noisy total the student revealed for a charged round (the same again is accepted).

        Returns:
            The plan's figures after it (:meth:`plan`).

        Raises:
            BeyondPlanError: a round outside the plan.
            MissingSeedsError: the round was not charged (FAILED_PRECONDITION).
            InputError: a total of the wrong shape or range, or of another attempt than the one charged.
            ReleaseReplayError: another total is kept for the round already.
        """
        self._check_round(round)
        t = np.asarray(total)
        if t.dtype != np.int64 or t.shape != (self.protocol.length,):
            raise InputError(f"a deposited total is int64 ({self.protocol.length},), got {t.dtype} {t.shape}")
        if t.size and np.abs(t).max() >= 1 << (RING_WIDTH - 1):
            raise InputError(f"a deposited total lies within ±2^{RING_WIDTH - 1}")
        batch = self.batch_id(round)
        charged = self._charged(batch)
        if charged is None:
            raise MissingSeedsError(f"round {round} was never charged; only a released round's total is kept")
        if charged.release_id != release_id:
            raise InputError(
                f"round {round} was charged under attempt {charged.release_id}, not {release_id}: a total of "
                "another attempt is not the one released"
            )
        try:
            self.ledger.deposit(batch, data=np.ascontiguousarray(t, dtype="<i8").tobytes(), actor=actor)
        except InputError as exc:
            raise ReleaseReplayError(f"round {round}: {exc}") from None
        self._seen(actor)
        return self.plan_figures()

    def record(self, *, round: int) -> tuple[str, str, npt.NDArray[np.int64] | None, dict[str, Any]]:
        """Where round ``round`` stands: ``("open" | "charged" | "deposited", attempt, deposited total or
        None, the plan's figures)``.

        Raises:
            BeyondPlanError: a round outside the plan.
        """
        self._check_round(round)
        batch = self.batch_id(round)
        charged = self._charged(batch)
        if charged is None:
            return "open", "", None, self.plan_figures()
        kept = self.ledger.deposited(batch)
        if kept is None:
            return "charged", charged.release_id, None, self.plan_figures()
        total = np.frombuffer(kept, dtype="<i8").astype(np.int64)
        return "deposited", charged.release_id, total, self.plan_figures()

    def plan_figures(self) -> dict[str, Any]:
        """The plan as the ledger records it, for the model card: what it promises (size, per-release RDP,
        the guarantee, ε per coalition) and what the ledger holds (releases charged, RDP and ε spent, its
        chain head)."""
        _, _, releases = self.ledger.release_plan()
        summary = self.ledger.summary()
        return {
            **self._planned,
            "releases": releases,
            "rdp_spent": float(summary["spent_rdp"]),
            "epsilon_spent": float(summary["epsilon_spent"]),
            "head": str(summary["head"]),
            "entries": int(summary["entries"]),
        }

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
