"""Security properties of a session, checked on real transcripts and real internal state.

Decoding information exists only for output wires and only reaches the student; labels are fresh per batch;
no tweak is used twice in a session; failed queries decode to nothing; the guardian's view does not depend on
the votes; the pass bits the guardian decodes carry the student's threshold noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from mpc_harness import SessionPair, frames_with_tag, make_inputs, open_pair

import capc_common.mpc.evaluator as evaluator_module
import capc_common.mpc.garbler as garbler_module
from capc_common.aggregation import draw_student_noise
from capc_common.mpc import MpcConfig, PlainBackend, run_plain, sum_seeds
from capc_common.mpc.party import Tag
from capc_common.privacy import SystemNoise

WIDTH, TEACHERS, STUDENT = 12, 250, 300


@pytest.fixture
def pair() -> Iterator[SessionPair]:
    session = open_pair(MpcConfig(4, WIDTH, teachers=TEACHERS, student_noise=STUDENT))
    yield session
    session.garbler.close()
    session.evaluator.close()


def _inputs(config: MpcConfig, queries: int, seed: int = 0, *, threshold: int = 60):
    rng = np.random.default_rng(seed)
    votes = rng.integers(0, 80, (queries, config.classes))
    return make_inputs(
        config,
        votes,
        rng.integers(-40, 40, (queries, config.classes)),
        rng.integers(-40, 40, queries),
        threshold,
        z1_student=rng.integers(-40, 40, queries),
    )


def _blocks(payloads: list[bytes]) -> set[bytes]:
    data = b"".join(payloads)
    return {data[i : i + 16] for i in range(0, len(data) - 15, 16)}


def test_evaluator_select_bits_carry_no_information_about_wire_values(pair, monkeypatch) -> None:
    """Every AND output the evaluator holds has a select bit independent of the wire's plaintext value.

    The plaintext twin runs the same circuit on the same inputs, so its i-th AND layer is the evaluator's
    i-th layer; over 30 batches each wire's select bit agrees with its value about half the time.
    """
    garbled: list[np.ndarray] = []
    plain: list[np.ndarray] = []
    real_and, plain_and = evaluator_module.EvaluatorBackend.and_, PlainBackend.and_
    monkeypatch.setattr(
        evaluator_module.EvaluatorBackend, "and_", lambda self, a, b: _keep(garbled, real_and(self, a, b))
    )
    monkeypatch.setattr(PlainBackend, "and_", lambda self, a, b: _keep(plain, plain_and(self, a, b)))
    agreements = []
    inputs = _inputs(pair.config, 8)
    for _ in range(30):
        inputs = make_inputs(
            pair.config, inputs.votes, inputs.z2, inputs.z1, inputs.threshold, z1_student=inputs.z1_student
        )  # fresh shares
        garbled.clear()
        plain.clear()
        pair.run_ok(inputs)
        guardian = sum_seeds(inputs.seeds, shape=inputs.votes.shape, width=WIDTH)
        run_plain(
            pair.config,
            share_sum=inputs.share_sum,
            guardian_share=guardian,
            z2=inputs.z2,
            z1=inputs.z1,
            z1_student=inputs.z1_student,
            threshold=inputs.threshold,
        )
        select = np.concatenate([(g[..., 0] & np.uint64(1)).astype(bool).ravel() for g in garbled])
        values = np.concatenate([p.ravel() for p in plain])
        agreements.append(select == values)
    agree = np.array(agreements)  # (batches, wires)
    wires = agree.shape[1]
    assert wires > 1000
    assert abs(agree.mean() - 0.5) < 5 * math.sqrt(0.25 / agree.size)
    assert ((agree.mean(axis=0) == 0) | (agree.mean(axis=0) == 1)).sum() <= 1  # P(any) ≈ wires · 2^-29


def _keep(store: list[np.ndarray], value: np.ndarray) -> np.ndarray:
    store.append(value)
    return value


def test_only_output_decoding_bits_reach_the_student_and_only_for_passed_queries(pair, monkeypatch) -> None:
    revealed: list[tuple[np.ndarray, np.ndarray]] = []
    outputs: list[np.ndarray] = []
    real_garble, real_decode = (
        garbler_module.GarblerSession._garble,
        evaluator_module.EvaluatorSession._decode,
    )

    def garble(self, *args: object) -> tuple[np.ndarray, np.ndarray]:
        pass_bits, decode = real_garble(self, *args)  # decode: every query's label decoding bits
        revealed.append((pass_bits.copy(), decode.copy()))
        return pass_bits, decode

    def decode(self, out: np.ndarray) -> np.ndarray:
        outputs.append(out.copy())
        return real_decode(self, out)

    monkeypatch.setattr(garbler_module.GarblerSession, "_garble", garble)
    monkeypatch.setattr(evaluator_module.EvaluatorSession, "_decode", decode)
    inputs = _inputs(pair.config, 64)
    result = pair.run_ok(inputs)
    pass_bits, zero_lsb = revealed[0]
    assert 0 < pass_bits.sum() < 64  # both kinds of queries are present
    received = pair.evaluator_channel.received
    assert {f[0] for f in received} <= {Tag.HELLO, Tag.OPEN_REPLY, Tag.GARBLED, Tag.GARBLED_END, Tag.DECODE}
    decode_frames = frames_with_tag(received, Tag.DECODE)
    label_bits = pair.config.label_bits
    assert [len(f) for f in decode_frames] == [8, math.ceil(pass_bits.sum() * label_bits / 8)]
    assert decode_frames[1] == np.packbits(zero_lsb[pass_bits].ravel(), bitorder="little").tobytes()
    # The label wires of a failed query carry 0: the student's labels are the zero-labels, so even the
    # decoding bits it never receives would only decode to 0.
    select = (outputs[0][..., 0] & np.uint64(1)).astype(bool).T  # (queries, label bits)
    assert (select[~pass_bits] == zero_lsb[~pass_bits]).all()
    assert (result.labels[~pass_bits] == -1).all() and (result.labels[pass_bits] >= 0).all()


def test_labels_and_tables_are_fresh_in_every_batch(pair) -> None:
    inputs = _inputs(pair.config, 32)
    transcripts = []
    for _ in range(3):
        before = len(pair.evaluator_channel.received), len(pair.garbler_channel.received)
        pair.run_ok(
            make_inputs(
                pair.config,
                inputs.votes,
                inputs.z2,
                inputs.z1,
                inputs.threshold,
                z1_student=inputs.z1_student,
            )
        )
        to_student = pair.evaluator_channel.received[before[0] :]
        to_guardian = pair.garbler_channel.received[before[1] :]
        garbled = frames_with_tag(to_student, Tag.GARBLED) + frames_with_tag(to_student, Tag.GARBLED_END)
        transcripts.append((_blocks(garbled), _blocks(frames_with_tag(to_guardian, Tag.OT_MATRIX))))
    for (g1, u1), (g2, u2) in [(transcripts[0], transcripts[1]), (transcripts[1], transcripts[2])]:
        assert len(g1) > 1000 and not g1 & g2
        assert not u1 & u2


def test_tweaks_are_never_reused_within_a_session(monkeypatch) -> None:
    config = MpcConfig(3, WIDTH, teachers=TEACHERS, student_noise=STUDENT, chunk_queries=5)
    used: dict[str, list[tuple[int, int]]] = {"garbler": [], "evaluator": []}
    real_garble, real_eval = garbler_module.garble_and, evaluator_module.eval_and

    def garble(pi, a0, b0, *, delta, first_gate, workspace=None):
        used["garbler"].append((first_gate, a0.shape[0]))
        return real_garble(pi, a0, b0, delta=delta, first_gate=first_gate, workspace=workspace)

    def evaluate(pi, a, b, table, *, first_gate, workspace=None):
        used["evaluator"].append((first_gate, a.shape[0]))
        return real_eval(pi, a, b, table, first_gate=first_gate, workspace=workspace)

    monkeypatch.setattr(garbler_module, "garble_and", garble)
    monkeypatch.setattr(evaluator_module, "eval_and", evaluate)
    pair = open_pair(config)
    try:
        for seed, queries in enumerate((12, 1, 7)):  # several chunks and batches
            pair.run_ok(_inputs(config, queries, seed))
    finally:
        pair.garbler.close()
        pair.evaluator.close()
    assert used["garbler"] == used["evaluator"]
    tweaks = np.concatenate([np.arange(2 * g, 2 * (g + n)) for g, n in used["garbler"]])
    assert len(np.unique(tweaks)) == len(tweaks) == 2 * pair.garbler.gates.next_gate


@pytest.mark.parametrize("mode", ["gnmax", "confident"])
def test_the_guardians_view_does_not_depend_on_the_votes(mode: str) -> None:
    """What the guardian receives (seeds, OT matrices) has the same distribution for opposite histograms.

    In GNMax mode there are no pass labels; in Confident-GNMax the two cases also differ in the student's
    threshold noise (−bound and +bound) and every query passes in both, so the pass labels (the one
    vote-dependent output the guardian is allowed to learn) decode alike and only the OT view is compared.
    """
    confident = mode == "confident"
    config = MpcConfig(
        4,
        WIDTH,
        teachers=TEACHERS,
        mode="confident" if confident else "gnmax",
        student_noise=STUDENT if confident else None,
    )
    pair = open_pair(config)
    quiet = np.zeros((16, 4), dtype=np.int64)
    loud = np.tile([TEACHERS, 0, 0, 0], (16, 1))
    views: dict[str, list[np.ndarray]] = {"quiet": [], "loud": []}
    try:
        for _ in range(40):
            for name, votes, own in (("quiet", quiet, -STUDENT), ("loud", loud, STUDENT)):
                if confident:
                    z1, z1_student = np.full(16, 400), np.full(16, own)
                    inputs = make_inputs(config, votes, np.zeros_like(votes), z1, 0, z1_student=z1_student)
                else:
                    inputs = make_inputs(config, votes, np.zeros_like(votes), parties=3)
                before = len(pair.garbler_channel.received)
                assert pair.run_ok(inputs).pass_bits.all()
                matrices = frames_with_tag(pair.garbler_channel.received[before:], Tag.OT_MATRIX)
                view = np.frombuffer(b"".join(inputs.seeds) + b"".join(matrices), dtype=np.uint8)
                views[name].append(np.unpackbits(view))
    finally:
        pair.garbler.close()
        pair.evaluator.close()
    quiet_bits, loud_bits = np.array(views["quiet"]), np.array(views["loud"])
    runs, positions = quiet_bits.shape
    for bits in (quiet_bits, loud_bits):
        assert abs(bits.mean() - 0.5) < 5 * math.sqrt(0.25 / bits.size)
    # Per-position frequencies differ only as much as two independent fair coins' frequencies would.
    diff = quiet_bits.mean(axis=0) - loud_bits.mean(axis=0)
    sd = math.sqrt(2 * 0.25 / runs)
    assert abs(diff.mean()) < 5 * sd / math.sqrt(positions)
    assert abs(np.abs(diff).mean() / (sd * math.sqrt(2 / math.pi)) - 1) < 0.05


def test_the_guardians_pass_bits_are_noisy_to_the_guardian() -> None:
    """Everything the guardian knows about a query (votes' seeds aside) is fixed here — V, z1_g, z2, T — yet
    the pass bits it decodes vary with the student's z1_s ~ N_Z(0, σ1²) drawn from a CSPRNG: with
    max V + z1_g = T the bit is [z1_s ≥ 0], a fair-ish coin the guardian cannot predict. (Had the guardian
    drawn all of z1, every bit would be the same known value.)"""
    config = MpcConfig(4, WIDTH, teachers=TEACHERS, student_noise=STUDENT)
    pair = open_pair(config)
    queries, sigma1 = 512, 20.0
    votes = np.tile([70, 30, 0, 0], (queries, 1))
    z1_student = draw_student_noise(SystemNoise(), batch=queries, sigma1=sigma1)
    try:
        inputs = make_inputs(
            config, votes, np.zeros_like(votes), np.full(queries, 5), 75, z1_student=z1_student
        )
        result = pair.run_ok(inputs)
    finally:
        pair.garbler.close()
        pair.evaluator.close()
    assert result.pass_bits is not None
    np.testing.assert_array_equal(result.pass_bits, z1_student >= 0)
    # P(N_Z(0, 400) ≥ 0) = 0.5 + pmf(0)/2 ≈ 0.51; five standard deviations either way.
    assert abs(result.pass_bits.mean() - 0.51) < 5 * math.sqrt(0.25 / queries)
