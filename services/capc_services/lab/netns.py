"""Network namespaces for the parties of a lab, each joined to this (the root) namespace by its own veth pair.

Party *k* lives in namespace ``capclab-<lab>-<k>`` with the address ``10.213.X.4k+2/30``; the root end of
its veth has ``10.213.X.4k+1``. A party namespace has no route but its own /30, so a party reaches nothing
but the addresses on the root ends of its link — where the lab's proxy listens — and no other party, no
other host: traffic stays inside the namespaces the lab made. What the kernel does on a link:

* **bandwidth**: a ``tc tbf`` qdisc on both ends of the party's veth (its upload and its download);
* **partitions**: ``iptables`` DROP rules inside the party's namespace for one peer's proxy port, both ways
  (packets vanish: no RST, no ICMP), removed to heal.

Everything a lab makes is named after it and removed by :meth:`Namespaces.close` (deleting a namespace
deletes its veth pair, qdiscs and rules). A lab records its namespaces with its process id under
:data:`REGISTRY`; a new lab first removes those of labs whose process is gone (a harness killed before it
could clean up).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import Sequence
from pathlib import Path

from capc_common.errors import UnavailableError
from capc_services.local.processes import pid_alive

__all__ = ["REGISTRY", "Namespaces", "available"]
REGISTRY = Path("/run/capc-lab")
_PREFIX = "capclab"
_NET = "10.213"


def _run(*args: str, namespace: str | None = None) -> str:
    command = ["ip", "netns", "exec", namespace, *args] if namespace else list(args)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise UnavailableError(f"`{' '.join(command)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def available() -> tuple[bool, str]:
    """Whether this process can make a namespace with a veth pair, a tbf qdisc and an iptables rule (and why
    not)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_NET_ADMIN)"
    try:
        probe = Namespaces(["probe"])
    except (UnavailableError, OSError) as exc:
        return False, f"network namespaces are not permitted here: {exc}"
    try:
        probe.shape("probe", mbit=100.0)
        probe.block("probe", port=1, on=True)
    except UnavailableError as exc:
        return False, f"tc tbf or iptables does not work in a namespace here: {exc}"
    finally:
        probe.close()
    return True, ""


def _sweep() -> None:
    """Remove the namespaces of labs whose process is gone."""
    if not REGISTRY.is_dir():
        return
    for record in REGISTRY.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(record.read_text())
            if pid_alive(int(data["pid"])):
                continue
            for name in data["namespaces"]:
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)
            record.unlink()


class Namespaces:
    """One namespace per party, joined to the root namespace by a veth pair.

    Args:
        parties: the parties, in order (party *k* gets the *k*-th /30).

    Raises:
        UnavailableError: a namespace, veth or address could not be made (what was made is removed).
    """

    def __init__(self, parties: Sequence[str]) -> None:
        _sweep()
        self.lab = secrets.token_hex(2)
        self.parties = list(parties)
        self._made: list[str] = []
        self._octet = self._free_octet()
        self._record = REGISTRY / f"{self.lab}.json"
        try:
            for k, party in enumerate(self.parties):
                self._join(k, party)
        except BaseException:
            self.close()
            raise

    def _free_octet(self) -> int:
        used = _run("ip", "-o", "-4", "addr", "show")
        for _ in range(64):
            octet = secrets.randbelow(256)
            if f" {_NET}.{octet}." not in used:
                return octet
        raise UnavailableError(f"no free {_NET}.X.0/24 for a lab: every one tried is in use on this machine")

    def namespace(self, party: str) -> str:
        """The name of ``party``'s namespace (``ip netns``)."""
        return f"{_PREFIX}-{self.lab}-{self.parties.index(party)}"

    def path(self, party: str) -> str:
        """The file naming ``party``'s namespace (for ``nsenter --net=``)."""
        return f"/run/netns/{self.namespace(party)}"

    def _veth(self, party: str, end: str) -> str:
        return f"cl{self.lab}{self.parties.index(party):02d}{end}"  # at most 15 characters, as Linux wants

    def party_ip(self, party: str) -> str:
        """``party``'s address inside its namespace."""
        return f"{_NET}.{self._octet}.{4 * self.parties.index(party) + 2}"

    def host_ip(self, party: str) -> str:
        """The address of the root end of ``party``'s link (where the proxy listens for it)."""
        return f"{_NET}.{self._octet}.{4 * self.parties.index(party) + 1}"

    def _join(self, k: int, party: str) -> None:
        ns, host, inner = self.namespace(party), self._veth(party, "h"), self._veth(party, "p")
        _run("ip", "netns", "add", ns)
        self._made.append(ns)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        self._record.write_text(json.dumps({"pid": os.getpid(), "namespaces": self._made}))
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", ns)
        _run("ip", "addr", "add", f"{self.host_ip(party)}/30", "dev", host)
        _run("ip", "link", "set", host, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.party_ip(party)}/30", "dev", inner)
        _run("ip", "-n", ns, "link", "set", inner, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def shape(self, party: str, *, mbit: float | None) -> None:
        """Cap ``party``'s link at ``mbit`` Mbit/s each way (``tc tbf`` on both ends); None lifts the cap."""
        ends = ((self._veth(party, "h"), None), (self._veth(party, "p"), self.namespace(party)))
        for device, ns in ends:
            tc = ["tc", *(["-n", ns] if ns else []), "qdisc"]
            subprocess.run([*tc, "del", "dev", device, "root"], capture_output=True, timeout=30, check=False)
            if mbit is not None:
                rate = int(mbit * 1e6)
                burst = max(rate // 8 // 100, 16 << 10)  # 10 ms of traffic, at least 16 KiB
                _run(*tc, "add", "dev", device, "root", "tbf", "rate", f"{rate}bit", "burst", str(burst),
                     "latency", "200ms")  # fmt: skip

    def block(self, party: str, *, port: int, on: bool) -> None:
        """Drop (``on``) or pass again every packet between ``party`` and the proxy port ``port`` of its
        link, both ways, inside ``party``'s namespace."""
        peer, flag = self.host_ip(party), "-I" if on else "-D"
        rules = (
            ("OUTPUT", "-d", peer, "--dport"),
            ("INPUT", "-s", peer, "--sport"),
        )
        for chain, side, address, port_flag in rules:
            rule = (chain, side, address, "-p", "tcp", port_flag, str(port), "-j", "DROP")
            _run("iptables", "-w", flag, *rule, namespace=self.namespace(party))

    def close(self) -> None:
        """Delete every namespace of the lab (their veth pairs, qdiscs and rules go with them)."""
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        self._made.clear()
        self._record.unlink(missing_ok=True)
