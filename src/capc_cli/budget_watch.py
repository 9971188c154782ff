"""``capc budget watch``: the dashboard's figures in a terminal, from the same REST API.

For operators on a server without a browser: every refresh reads ``/api/v1/budget``, ``/budget/history``,
``/parties`` and ``/student`` from the guardian's admin API (the same calls the dashboard makes) and
redraws one screen, or prints one JSON object per refresh (``--format json``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from capc_common.errors import InputError, ProtocolError, UnavailableError
from capc_services.common.admin_client import admin_client

_ROUTES = {"budget": "budget", "history": "budget/history?points=60&batches=20", "parties": "parties",
           "student": "student"}  # fmt: skip
_SPARK = "▁▂▃▄▅▆▇█"


def snapshot(url: str, token: str, *, ca: Path | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """One reading of every figure the dashboard shows.

    Args:
        url: the guardian's admin API (``http://`` only on this machine).
        token: its admin token.
        ca: the federation CA of an ``https://`` guardian.
        timeout: seconds per request.

    Raises:
        InputError: the guardian refused the token, or ``url`` would send it in cleartext over a network.
        UnavailableError: the guardian's admin API does not answer.
        ProtocolError: it answered with an error status.
    """
    out: dict[str, Any] = {"url": url, "time": time.time()}
    with admin_client(url, token=token, ca=ca, timeout=timeout) as client:
        for key, route in _ROUTES.items():
            try:
                response = client.get(f"/api/v1/{route}")
            except httpx.HTTPError as exc:
                raise UnavailableError(f"the guardian's admin API at {url} does not answer ({exc})") from None
            if response.status_code == 401:
                raise InputError(f"the guardian at {url} refused the admin token; check --token-file")
            if response.status_code != 200:
                raise ProtocolError(
                    f"{url}/api/v1/{route} answered HTTP {response.status_code}: {response.text}"
                )
            out[key] = response.json()
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}" if 1e-3 <= abs(value) < 1e6 or value == 0 else f"{value:.2e}"
    return str(value)


def _ago(seconds: float | None, now: float) -> str:
    if seconds is None:
        return "never"
    left = max(0.0, now - seconds)
    return f"{left:.0f} s ago" if left < 90 else f"{left / 60:.0f} min ago"


def sparkline(values: list[float], top: float) -> str:
    """One character per value, scaled to ``top`` (the budget's limit)."""
    if not values or top <= 0:
        return ""
    return "".join(_SPARK[min(len(_SPARK) - 1, int(len(_SPARK) * max(0.0, v) / top))] for v in values)


def render(snap: dict[str, Any], *, interval: float) -> str:
    """The screen ``capc budget watch`` draws."""
    b, parties, student = snap["budget"], snap["parties"], snap["student"]
    now = snap["time"]
    used = 100 * b["fraction_used"]
    bar = "#" * round(used / 5) + "-" * (20 - round(used / 5))
    secure = b.get("noise_secure", True) and not b.get("insecure", False)
    noise = (
        f"noise {b.get('noise')} (secure)"
        if secure
        else f"!!! INSECURE NOISE ({b.get('noise')}): labels are reproducible and NOT private !!!"
    )
    settled = [p["epsilon_settled"] for p in snap["history"]["points"]]
    chain = "ok" if b.get("chain_ok", True) else "BROKEN (run capc budget verify)"
    lines = [
        f"{parties['federation']} · guardian {snap['url']} · {time.strftime('%H:%M:%S', time.localtime(now))}"
        f" (every {interval:g} s; Ctrl-C stops)",
        noise,
        f"ε settled {_fmt(b['epsilon_settled'])} of {_fmt(b['epsilon_limit'])}  [{bar}] {used:.1f} % used;  "
        f"incl. open reservations {_fmt(b['epsilon_spent'])}"
        + (f" (reserved ε {_fmt(b['epsilon_reserved'])})" if "epsilon_reserved" in b else ""),
        f"δ {b['delta']:g} · Rényi order {b['order']:g} · remaining RDP {_fmt(b['remaining_rdp'])} of "
        f"{_fmt(b['budget_rdp'])}",
        f"queries {b['queries']} asked, {b['answered']} answered · batches {b['batches']} settled, "
        f"{b['open_batches']} open, {b['released_batches']} released",
        f"ε settled over time  {sparkline(settled, b['epsilon_limit'])}",
        f"ledger head {b['head'][:16]}… · {b['entries']} entries · chain {chain}",
        "party          role      last seen    batches  queries  worst-case ε vs its own cap",
    ]
    for name, p in parties["parties"].items():
        teacher = p["role"] == "teacher"
        queries, eps = (p["queries"], _fmt(p["epsilon_worst_case"])) if teacher else ("", "")
        seen = _ago(p["last_seen"], now)
        lines.append(f"{name:<14} {p['role']:<9} {seen:<12} {p['batches']:>7}  {queries:>7}  {eps}")
    if student.get("reachable"):
        s = student["progress"]
        line = (
            f"student {s['state']}: {s.get('queries', 0)} queries asked, {s.get('answered', 0)} answered, "
            f"{_fmt(s.get('labels_per_s'))} labels/s"
        )
        if s.get("stopped_reason"):
            line += f"; stopped: {s['stopped_reason']}"
        lines.append(line)
        card = student.get("model_card")
        if card:
            privacy = card["privacy"]
            lines.append(
                f"published model: ε {_fmt(privacy['epsilon'])} at δ {privacy['delta']:g} (the guarantee; "
                f"spent {_fmt(privacy.get('epsilon_spent'))}), "
                f"accuracy {_fmt(card.get('evaluation', {}).get('accuracy'))}"
            )
    else:
        lines.append(f"student not reachable: {student.get('error')}")
    return "\n".join(lines)
