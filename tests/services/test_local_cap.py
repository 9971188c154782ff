"""A teacher party's own worst-case ε cap: durable, conservative, refuses before crossing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from capc_common.errors import BudgetExhaustedError, InputError, IntegrityError, UnavailableError
from capc_common.federation import FederationConfig, batch_costs
from capc_services.teacher.cap import LocalCap


@pytest.fixture
def config(federation_dict) -> FederationConfig:
    return FederationConfig.from_dict(
        federation_dict(mechanism={"threshold": 3, "sigma1": 2.0, "sigma2": 3.0})
    )


def _screening_rdp(order: float, *, sigma1: float) -> float:
    """RDP of one screened query, from its definition (docs/privacy.md §3) at 60 significant digits.

    The pass bit is ``[Z ≥ d]`` with ``Z ~ N_Z(0, σ1²)`` and a shift ``d`` an observer may know (split
    threshold noise), and one example moves the top count by one: the cost is the supremum over every
    integer ``d`` of ``D_λ(Bern(P[Z ≥ d]) ‖ Bern(P[Z ≥ d + 1]))`` in both directions, never above the
    Gaussian ``λ/(2σ1²)``. Computed here by summing the discrete Gaussian's weights with mpmath, apart from
    the library's log-space scan (``capc_common.privacy.analysis.screening``).
    """
    import mpmath as mp

    mp.mp.dps = 60
    span = int(order + 40 * sigma1) + 2
    support = range(-2 * span, 2 * span + 1)
    weights = [mp.e ** (-(mp.mpf(z) ** 2) / (2 * sigma1**2)) for z in support]
    total, tail, running = mp.fsum(weights), {}, mp.mpf(0)
    for z, weight in zip(reversed(support), reversed(weights), strict=True):
        running += weight
        tail[z] = running / total
    best = mp.mpf(0)
    for d in range(-span, span + 1):
        for a, b in ((tail[d], tail[d + 1]), (tail[d + 1], tail[d])):
            best = max(best, mp.log(a**order * b ** (1 - order) + (1 - a) ** order * (1 - b) ** (1 - order)))
    return min(float(best) / (order - 1), order / (2 * sigma1**2))


def test_cap_counts_worst_cases_durably_and_refuses_past_the_cap(
    tmp_path: Path, config: FederationConfig
) -> None:
    # Prepare: a cap that fits exactly two batches of 16
    costs = batch_costs(config)
    cap_eps = costs.epsilon(costs.worst_case(16) * 2.5)
    LocalCap.init(tmp_path / "cap.jsonl", config=config)
    cap = LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=cap_eps)
    # Execute
    cap.charge(batch_id="b0", attempt=1, count=16)
    cap.charge(batch_id="b1", attempt=1, count=16)
    with pytest.raises(BudgetExhaustedError, match="local cap: batch b2"):
        cap.charge(batch_id="b2", attempt=1, count=16)
    # Assert: the record survives a restart and the refused batch left no trace
    cap.close()
    again = LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=cap_eps)
    assert (again.batches, again.queries) == (2, 32)
    # Pinned to an independent number (issue 25.8), not to the library's accountant: 32 queries screened and
    # answered at order 10 cost 32·(S + λ/σ2²), S from the definition at 60 digits (_screening_rdp); the
    # improved conversion then gives 71.7703349175… .
    lam, delta = config.budget.order, config.budget.delta
    rdp = 32 * (_screening_rdp(lam, sigma1=2.0) + lam / 3.0**2)
    want = rdp + math.log((lam - 1) / lam) - (math.log(delta) + math.log(lam)) / (lam - 1)
    assert want == pytest.approx(71.7703349175, abs=1e-9)
    assert again.epsilon == pytest.approx(want, rel=1e-12)
    with pytest.raises(BudgetExhaustedError):
        again.charge(batch_id="b2", attempt=2, count=16)


def test_record_of_another_federation_or_corrupt_is_refused(tmp_path: Path, config, federation_dict) -> None:
    LocalCap.init(tmp_path / "cap.jsonl", config=config)
    with LocalCap(tmp_path / "cap.jsonl", config=config, epsilon_cap=100) as first:
        first.charge(batch_id="b0", attempt=1, count=16)
    data = config.model_dump(mode="json")
    data["teachers"].append({"name": "hospital-c", "heads": 2})
    grown = FederationConfig.from_dict(
        {**data, "history": [{"previous": config.config_hash(), "added": ["hospital-c"]}]}
    )
    with LocalCap(tmp_path / "cap.jsonl", config=grown, epsilon_cap=100) as cap:
        assert (cap.batches, cap.queries) == (1, 16)
        assert cap.rdp == pytest.approx(batch_costs(config).worst_case(16))
        cap.charge(batch_id="b1", attempt=1, count=16)
    assert grown.config_hash() in (tmp_path / "cap.jsonl").read_text().splitlines()[-1]
    unrelated = FederationConfig.from_dict({**grown.model_dump(mode="json"), "history": []})
    with pytest.raises(IntegrityError, match="another federation config"):
        LocalCap(tmp_path / "cap.jsonl", config=unrelated, epsilon_cap=100)


_HOLD = """
import sys
from capc_common.federation import FederationConfig
from capc_services.teacher.cap import LocalCap

cap = LocalCap(sys.argv[1], config=FederationConfig.load(sys.argv[2]), epsilon_cap=100)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_a_second_process_on_the_same_record_is_refused_naming_the_first(
    tmp_path: Path, config: FederationConfig
) -> None:
    """Issue 25.3: two processes on one cap record would each admit up to the cap (ε 17.7 against a cap of 10
    was reproduced). The process that charges holds the record; a second is refused with its pid and host."""
    import socket
    import subprocess
    import sys

    record = LocalCap.init(tmp_path / "cap.jsonl", config=config)
    config.save(tmp_path / "federation.yaml")
    first = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(record), str(tmp_path / "federation.yaml")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdout.readline() == "held\n"
        with pytest.raises(
            UnavailableError, match=f"pid {first.pid} on host {socket.gethostname()}, started 20"
        ):
            LocalCap(record, config=config, epsilon_cap=100)
        # A read-only view (the preflight check) still reads the record beside the serving process.
        view = LocalCap(record, config=config, epsilon_cap=100, exclusive=False)
        with pytest.raises(InputError, match="read-only"):
            view.charge(batch_id="b", attempt=1, count=16)
    finally:
        first.communicate(input="", timeout=30)
    # The first process is gone: the kernel dropped its lock with it.
    with LocalCap(record, config=config, epsilon_cap=100) as cap:
        cap.charge(batch_id="b0", attempt=1, count=16)


def test_the_record_is_re_read_before_each_charge(tmp_path: Path, config: FederationConfig) -> None:
    """A line appended behind the holder's back (a file system that ignores flock) still counts."""
    costs = batch_costs(config)
    record = LocalCap.init(tmp_path / "cap.jsonl", config=config)
    with LocalCap(record, config=config, epsilon_cap=costs.epsilon(costs.worst_case(16) * 2.5)) as cap:
        cap.charge(batch_id="b0", attempt=1, count=16)
        lines = record.read_text().splitlines()
        with record.open("a") as handle:  # what a second writer would have appended
            handle.write(lines[-1].replace('"b0"', '"elsewhere"') + "\n")
        with pytest.raises(BudgetExhaustedError, match="local cap: batch b1"):
            cap.charge(batch_id="b1", attempt=1, count=16)
        assert (cap.batches, cap.queries) == (2, 32)
