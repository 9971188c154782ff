"""What preflight reports: one named check per line, with its outcome, the facts it found and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]
_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: dotted id, stable for scripts (``certificate.chain``, ``guardian``, ...).
        status: ``ok``, ``warn`` (goes live, but look), ``fail`` (fix before going live) or ``skip``
            (an earlier check failed that this one needs).
        detail: what was found, with the values.
        fix: how to fix it (every ``warn``/``fail`` has one).
        data: the figures behind ``detail``, for ``--format json``.
    """

    name: str
    status: Status
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, name: str, detail: str, **data: Any) -> Check:
        """A passed check."""
        return cls(name, "ok", detail, data=data)

    @classmethod
    def warn(cls, name: str, detail: str, *, fix: str, **data: Any) -> Check:
        """A check that passed with something the operator should look at."""
        return cls(name, "warn", detail, fix, data)

    @classmethod
    def fail(cls, name: str, detail: str, *, fix: str, **data: Any) -> Check:
        """A failed check: the party must not go live like this."""
        return cls(name, "fail", detail, fix, data)

    @classmethod
    def skip(cls, name: str, because: str) -> Check:
        """A check that could not run because another one failed."""
        return cls(name, "skip", f"not checked: {because}")


@dataclass
class PreflightReport:
    """Every check of one site, in the order they ran."""

    site: str
    party: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return not self.failed

    @property
    def failed(self) -> list[str]:
        """Names of the failed checks."""
        return [c.name for c in self.checks if c.status == "fail"]

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return {s: sum(c.status == s for c in self.checks) for s in ("ok", "warn", "fail", "skip")}

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` object."""
        return {
            "site": self.site,
            "party": self.party,
            "ok": self.ok,
            "counts": self.counts(),
            "checks": [asdict(c) for c in self.checks],
        }

    def text(self) -> str:
        """The short report for a person: one line per check, the fix under each warning or failure."""
        width = max((len(c.name) for c in self.checks), default=0)
        lines = [f"preflight of {self.party or '?'} ({self.site})"]
        for c in self.checks:
            lines.append(f"  {_MARK[c.status]}  {c.name:<{width}}  {c.detail}")
            if c.fix:
                lines.append(f"        {'':<{width}}  fix: {c.fix}")
        counts = self.counts()
        verdict = "ready to go live" if self.ok else f"NOT ready: fix {', '.join(self.failed)}"
        lines.append(
            f"{counts['ok']} ok, {counts['warn']} warnings, {counts['fail']} failed, "
            f"{counts['skip']} skipped: {verdict}"
        )
        return "\n".join(lines)
