"""A hospital's site ledger: its lifetime budget across federations, durably on the hospital's own volume.

Each federation's cap record bounds what that federation charged the hospital's records, and starts at 0.
The site ledger adds them all up under one limit the hospital sets (``lifetime:`` in its site files), at one
Rényi order fixed when the ledger is created (:mod:`capc_common.privacy.lifetime` holds the arithmetic;
:mod:`capc_common.privacy.analysis.composition` says why one order). A teacher joins it when it starts:
the federation's planned charge — the worst case of every charge its plan and the hospital's cap for it
allow — must fit beside what the other federations spent or reserved, or the teacher refuses to start
(:class:`~capc_common.errors.BudgetExhaustedError`, exit code 3) before it charges anything. Then every charge
its cap record admits is charged here too, before the shares leave.

**Durable, locked, over-counting.** JSON lines, each fsynced before the call returns; every entry is checked
and appended under an exclusive ``flock`` of ``LEDGER.lock`` after folding in what other processes appended
(two federations' teachers of one hospital may run at once, each holding its own cap record). A charge is
written here before the cap record, so a crash between the two leaves this ledger one charge ahead, never
behind; the next start adopts into it every line of the cap record it has not counted yet (also a record that
predates the ledger), restated at the ledger's order.

The ledger is created once (``capc teacher init-cap``, or ``teacher serve --train-missing`` setting up a
new site) and never on the fly: a lost ledger would restart the hospital at ε 0.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capc_common.durable import appended_lines, create_durably
from capc_common.errors import BudgetExhaustedError, CapcError, InputError, IntegrityError
from capc_common.federation import Exposure, FederationConfig
from capc_common.privacy.analysis import epsilon_at_order, rdp_at_lower_order, rdp_budget_at_order
from capc_common.privacy.lifetime import NEIGHBOURING, LifetimeAccount
from capc_services.teacher.cap import CapLine, LocalCap


@dataclass(frozen=True)
class JoinAssessment:
    """What joining a federation takes, at the ledger's order (RDP).

    Attributes:
        hashes: the federation's config hash, then those it continued from.
        planned_rdp: the worst case of every charge its plan and the hospital's cap allow.
        unseen: lines of its cap record this ledger has not counted yet (counted in at the join).
        adopted_rdp: their charge, restated at the ledger's order.
        spent_rdp: what it has charged the hospital, those lines included.
        others_rdp: what the other federations spent or reserve.
        budget_rdp: the RDP of the limit the site file sets (recorded when a teacher opens the ledger).
        sampler_tv: every federation's samplers' total-variation bound, this one's included.
    """

    hashes: list[str]
    planned_rdp: float
    unseen: int
    adopted_rdp: float
    spent_rdp: float
    others_rdp: float
    budget_rdp: float
    sampler_tv: float

    @property
    def need_rdp(self) -> float:
        """What the limit must hold for it to join: the others, and its plan or its spend if larger."""
        return self.others_rdp + max(self.planned_rdp, self.spent_rdp)

    @property
    def fits(self) -> bool:
        """Whether it may join."""
        return self.need_rdp <= self.budget_rdp


class SiteLedger:
    """One hospital's lifetime ledger, opened by one of its teacher parties (or read by an operator).

    Args:
        path: the ledger (JSON lines).
        epsilon: the lifetime limit the site file sets; a limit other than the ledger's last is recorded
            (``writable``) and counts from then on.
        delta / order: what the site file says of them, if anything: both are fixed for the ledger's life.
        writable: False for a read-only view (preflight, ``capc teacher budget``).

    Raises:
        IntegrityError: the ledger is missing (see :meth:`init`) or corrupt.
        InputError: the site file's δ or order is not the ledger's.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        epsilon: float,
        delta: float | None = None,
        order: float | None = None,
        writable: bool = True,
    ) -> None:
        self.path = Path(path)
        self._read = 0
        self._lines = 0
        self._writable = writable
        if not self.path.is_file():
            raise IntegrityError(
                f"the site ledger {self.path} does not exist. If this hospital has taken part in federations "
                "with it, restore it from a backup: starting afresh would forget the ε they charged on its "
                "records. If it never had one, create it once with `capc teacher init-cap --site FILE` (the "
                "next start counts in what this federation's cap record already holds)"
            )
        with self._locked(shared=True):
            self.account = self._header()
            self._refresh()
        for name, given, fixed in (
            ("delta", delta, self.account.delta),
            ("order", order, self.account.order),
        ):
            if given is not None and float(given) != fixed:
                raise InputError(
                    f"the site file sets lifetime.{name} {given:g}, but the site ledger {self.path} was "
                    f"created at {name} {fixed:g}, fixed for its life (its charges are summed at it); "
                    f"remove lifetime.{name} from the site file or set it to {fixed:g}"
                )
        self.site_limit = float(epsilon)
        try:
            rdp_budget_at_order(epsilon=self.site_limit, delta=self.account.delta, order=self.order)
        except InputError as exc:
            raise InputError(
                f"lifetime.epsilon {self.site_limit:g} in the site file cannot be met at the site ledger's "
                f"order {self.order:g}, fixed when it was created ({exc})"
            ) from None
        if writable and self.site_limit != self.account.limit:
            self._append({"kind": "limit", "epsilon": self.site_limit})

    @classmethod
    def init(cls, path: str | Path, *, epsilon: float, delta: float, order: float) -> Path:
        """Create the empty ledger of a hospital (its first line holds the limit, δ and order); once only.

        Raises:
            InputError: a ledger already exists there, or the limit cannot be met at this order.
        """
        header = {
            "kind": "init",
            "epsilon": float(epsilon),
            "delta": float(delta),
            "order": float(order),
            "neighbouring": NEIGHBOURING,
            "time": time.time(),
        }
        LifetimeAccount.from_header(header)
        target = Path(path)
        if not create_durably(target, json.dumps(header, sort_keys=True)):
            raise InputError(
                f"the site ledger {target} already exists; it is never re-created (it holds the ε every "
                "federation charged on this hospital's records)"
            )
        return target

    @property
    def order(self) -> float:
        """The order every charge is stated at."""
        return self.account.order

    # ------------------------------------------------------------------ joining and charging
    def assess(self, *, config: FederationConfig, cap: LocalCap) -> JoinAssessment:
        """What joining ``config``'s federation with ``cap`` would take, without recording anything."""
        with self._locked(shared=True):
            self._refresh()
            return self._assess(config=config, cap=cap)

    def join(self, *, config: FederationConfig, cap: LocalCap) -> SiteCharges:
        """Take part in ``config``'s federation: count in what its cap record holds that this ledger has not
        counted yet, then reserve its planned charge, or refuse.

        Returns:
            What charges this ledger for the cap's charges (set it as :attr:`LocalCap.lifetime`).

        Raises:
            BudgetExhaustedError: the plan does not fit what is left (what was counted in stays recorded);
                the message gives the figures and what to change.
            InputError: a cap record line of an earlier config cannot be restated at this ledger's order.
        """
        with self._locked():
            self._refresh()
            plan = self._assess(config=config, cap=cap)
            if plan.unseen:
                self._write(
                    {
                        "kind": "adopt",
                        "federation": config.name,
                        "hashes": plan.hashes,
                        "config_hash": plan.hashes[0],
                        "rdp": plan.adopted_rdp,
                        "lines": plan.unseen,
                        "cap_lines": len(cap.lines),
                        "sampler_tv": cap.exposure.sampler_tv,
                    }
                )
            try:
                self.account.check_join(name=config.name, hashes=plan.hashes, planned_rdp=plan.planned_rdp)
            except BudgetExhaustedError as exc:
                room = self.account.budget_rdp - plan.others_rdp
                raise BudgetExhaustedError(f"{exc}. {self._fixes(cap, room=room)}") from None
            self._write(
                {
                    "kind": "join",
                    "federation": config.name,
                    "hashes": plan.hashes,
                    "planned_rdp": plan.planned_rdp,
                    "cap_epsilon": cap.cap,
                    "cap_order": cap.order,
                    "sampler_tv": cap.exposure.sampler_tv,
                }
            )
        return SiteCharges(self, config_hash=plan.hashes[0], exposure=cap.exposure)

    def close_federation(self, config: FederationConfig, *, reason: str) -> dict[str, Any]:
        """Return a finished federation's unspent reservation (a later start reserves again).

        Raises:
            InputError: the federation never joined this ledger.
        """
        hashes = [config.config_hash(), *config.previous_hashes]
        with self._locked():
            self._refresh()
            if self.account.joined(hashes) is None:
                raise InputError(f"federation {config.name!r} never joined the site ledger {self.path}")
            self._write({"kind": "close", "hashes": hashes, "reason": reason})
        return self.report()

    def charge(self, *, config_hash: str, rdp: float, entry: Mapping[str, Any], what: str) -> None:
        """Check and durably append one charge (:class:`SiteCharges` calls it).

        Raises:
            BudgetExhaustedError: it does not fit (nothing recorded).
        """
        with self._locked():
            self._refresh()
            self.account.check_charge(config_hash=config_hash, rdp=rdp, what=what)
            self._write({"kind": "charge", "config_hash": config_hash, "rdp": rdp, **entry})

    def report(self) -> dict[str, Any]:
        """The ledger's spend per federation and in total (``capc teacher budget``)."""
        with self._locked(shared=True):
            self._refresh()
        return {
            "ledger": str(self.path),
            "entries": self._lines,
            **self.account.to_dict(),
            "site_file_limit": self.site_limit,
        }

    # ------------------------------------------------------------------ internals
    def _assess(self, *, config: FederationConfig, cap: LocalCap) -> JoinAssessment:
        hashes = [config.config_hash(), *config.previous_hashes]
        own = self.account.joined(hashes)
        unseen = cap.lines[own.cap_lines if own else 0 :]
        adopted = math.fsum(self._restated(line, config=config, cap=cap) for line in unseen)
        return JoinAssessment(
            hashes=hashes,
            planned_rdp=cap.exposure.planned_rdp(
                cap_epsilon=cap.cap, cap_order=cap.order, delta=cap.delta, order=self.order
            ),
            unseen=len(unseen),
            adopted_rdp=adopted,
            spent_rdp=(own.spent_rdp if own else 0.0) + adopted,
            others_rdp=self.account.reserved_rdp(besides=own),
            budget_rdp=rdp_budget_at_order(
                epsilon=self.site_limit, delta=self.account.delta, order=self.order
            ),
            sampler_tv=math.fsum(f.sampler_tv for f in self.account.federations if f is not own)
            + cap.exposure.sampler_tv,
        )

    def _restated(self, line: CapLine, *, config: FederationConfig, cap: LocalCap) -> float:
        """A cap record line's charge at this ledger's order: from the mechanism for the current config; a
        line of an earlier config (a membership change) keeps its recorded figure, valid at lower orders."""
        if line.config_hash == config.config_hash():
            return cap.exposure.rdp(line.count, self.order)
        try:
            return rdp_at_lower_order(line.rdp, recorded_order=cap.order, order=self.order)
        except InputError as exc:
            raise InputError(
                f"{cap.path} holds charges of an earlier config of federation {config.name!r}, recorded at "
                f"order {cap.order:g}; the site ledger {self.path} sums at order {self.order:g}. {exc}"
            ) from None

    def _fixes(self, cap: LocalCap, *, room: float) -> str:
        """What the site can change when a federation's plan does not fit in ``room`` (RDP at this order)."""
        exposure, fits, running = cap.exposure, 0, 0.0
        for count in exposure.plan:  # how many of its first charges fit
            running += exposure.rdp(count, self.order)
            if running > room:
                break
            fits += 1
        partial = ""
        if fits:  # the cap under which this hospital answers the first `fits` charges, then stops
            cap_rdp = math.fsum(exposure.rdp(c, cap.order) for c in exposure.plan[:fits])
            lower = float(epsilon_at_order(cap.order, cap_rdp, delta=cap.delta))
            rounded = math.ceil(lower * 100) / 100  # a plain figure, unless it would admit one charge more
            if exposure.admitted(epsilon=rounded, delta=cap.delta, order=cap.order) > fits:
                rounded = lower
            partial = (
                f"; or, to answer only the first {fits} of its {len(exposure.plan)} planned charges and then "
                f"stop, lower cap.epsilon to {rounded:g}"
            )
        return (
            "Raise lifetime.epsilon in the site file to that figure if your organisation accepts it, or "
            f"close a finished federation (`capc teacher budget --site FILE --close REASON`){partial}. "
            "`capc teacher budget --site FILE` shows what each federation spent and holds"
        )

    @contextmanager
    def _locked(self, *, shared: bool = False) -> Iterator[None]:
        """Hold the ledger's lock: exclusive to check and append, shared to read a consistent whole.

        A reader on a read-only mount takes the lock through a read-only handle (``flock`` needs none to
        write), or reads without it where the lock file was never created: a line being appended then shows
        as a corrupt last line, and reading again gets it whole.
        """
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            handle = open(lock, "a", encoding="utf-8")  # noqa: SIM115 (closed below)
        except OSError:
            if not shared:
                raise
            try:
                handle = open(lock, encoding="utf-8")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                yield
                return
        with handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _header(self) -> LifetimeAccount:
        with self.path.open("rb") as handle:
            first = handle.readline()
        try:
            account = LifetimeAccount.from_header(json.loads(first))
        except (ValueError, KeyError, TypeError, AttributeError, CapcError) as exc:
            raise IntegrityError(f"{self.path} line 1 is corrupt ({exc}); restore it from backup") from None
        self._read, self._lines = len(first), 1
        return account

    def _refresh(self) -> None:
        """Fold in what was appended since the last look (by this or another process)."""
        self._read, lines = appended_lines(self.path, offset=self._read)
        for line in lines:
            self._lines += 1
            if not line.strip():
                continue
            try:
                self.account.apply(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError, CapcError) as exc:
                raise IntegrityError(
                    f"{self.path} line {self._lines} is corrupt ({exc}); restore it from backup"
                ) from None

    def _append(self, entry: Mapping[str, Any]) -> None:
        with self._locked():
            self._refresh()
            self._write(entry)

    def _write(self, entry: Mapping[str, Any]) -> None:
        """Append one entry durably (the caller holds the exclusive lock and has just refreshed)."""
        if not self._writable:
            raise InputError(f"the site ledger {self.path} was opened read-only; it cannot record")
        text = json.dumps({**entry, "time": time.time()}, sort_keys=True) + "\n"
        with self.path.open("a") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        self._refresh()  # fold in exactly what was written, the one way entries are read


class SiteCharges:
    """Charges one federation's admitted charges on the site ledger (what :attr:`LocalCap.lifetime` holds)."""

    def __init__(self, ledger: SiteLedger, *, config_hash: str, exposure: Exposure) -> None:
        self.ledger = ledger
        self._hash = config_hash
        self._exposure = exposure

    def charge(self, *, batch_id: str, attempt: int, count: int, cap_lines: int) -> None:
        """Charge one batch's (or release's) worst case at the ledger's order, or refuse it.

        Raises:
            BudgetExhaustedError: the hospital's lifetime limit would be crossed (nothing recorded).
        """
        self.ledger.charge(
            config_hash=self._hash,
            rdp=self._exposure.rdp(count, self.ledger.order),
            entry={"batch_id": batch_id, "attempt": attempt, "count": count, "cap_lines": cap_lines},
            what=f"batch {batch_id} ({count} queries, worst case)",
        )
