"""The real thing: `capc bench mpc` runs the garbler and the evaluator as two processes over a socket."""

from __future__ import annotations

from capc_cli.commands.bench import _mpc_text
from capc_common.mpc import MpcConfig, circuit_stats

REQUIRED = {
    "labels_per_s",
    "and_gates_per_s",
    "and_gates_per_label",
    "bytes_per_label",
    "aes_blocks_per_s",
    "garbler_peak_rss_mb",
    "evaluator_peak_rss_mb",
    "correct",
}


def test_bench_mpc_between_two_processes_is_correct(capc_json) -> None:
    result = capc_json(
        "bench",
        "mpc",
        "--classes",
        "5",
        "--batch",
        "300",
        "--batches",
        "2",
        "--threshold",
        "--chunk",
        "128",
        timeout=120,
    )
    assert result.keys() >= REQUIRED
    assert result["correct"] is True
    assert result["mode"] == "confident" and result["width"] == 13 and 0 < result["answered_fraction"] < 1
    ands = circuit_stats(MpcConfig(5, 13, teachers=250, student_noise=1200)).and_gates
    assert result["and_gates_per_label"] == ands and result["labels_per_s"] > 0
    # tables (2 × 16 bytes per AND) dominate the traffic; inputs and OT add 16 bytes per input bit
    assert 32 * ands < result["bytes_per_label"] < 32 * ands + 16 * 3 * 5 * 13 + 64
    assert result["aes_blocks_per_s"] > 1e6 and result["garbler_peak_rss_mb"] > 0
    text = _mpc_text(result)  # the text rendering of the same real result
    assert "correct=True" in text and "labels/s" in text and "confident" in text
