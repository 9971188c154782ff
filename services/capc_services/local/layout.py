"""Where a local federation keeps its files (one state directory, movable as a whole)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """Paths inside a local federation's state directory."""

    root: Path

    @property
    def federation(self) -> Path:
        """The shared federation.yaml."""
        return self.root / "federation.yaml"

    @property
    def certs(self) -> Path:
        """CA and party certificates/keys."""
        return self.root / "certs"

    def admin_token(self, role: str) -> Path:
        """``role``'s admin bearer token (mode 0600): one per role (guardian, student, teacher), so that a
        party's token opens its own role's admin API only."""
        return self.root / "tokens" / f"{role}.token"

    @property
    def sites(self) -> Path:
        """One site file per party."""
        return self.root / "sites"

    @property
    def logs(self) -> Path:
        """One JSON-lines log per process."""
        return self.root / "logs"

    @property
    def options(self) -> Path:
        """The options the federation was provisioned with (``capc local up`` resumes with them)."""
        return self.root / "options.json"

    @property
    def state(self) -> Path:
        """Running processes and endpoints (written by ``capc local up``)."""
        return self.root / "state.json"

    def site(self, party: str) -> Path:
        """The site file of ``party``."""
        return self.sites / f"{party}.yaml"

    def party_dir(self, party: str) -> Path:
        """A party's private data directory (ledger, label store, heads, cap record)."""
        return self.root / "parties" / party

    def log(self, party: str) -> Path:
        """The log file of ``party``'s process."""
        return self.logs / f"{party}.log"

    def command(self, verb: str) -> str:
        """``capc local VERB --state-dir ROOT``: a command for this federation that works from any directory
        (the state directory's default is relative to where ``up`` ran)."""
        return f"capc local {verb} --state-dir {self.root}"
