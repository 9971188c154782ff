"""Secure two-party noisy argmax: the student learns only the noisy labels of answered queries.

DESIGN §3 steps 3–6 and §5. Teacher parties additively share their vote counts over Z_{2^w} (the guardian's
share compressed to a 16-byte AES-CTR seed); the privacy guardian garbles, the student evaluates a Yao circuit
(free-XOR, point-and-permute, half-gates, TCCR fixed-key-AES hash) that adds the shares and the noise,
applies the Confident-GNMax threshold and takes the argmax. The threshold noise is split: the guardian draws
z1_g, the student z1_s, so the pass bits are noisy to each of them. The student's input bits (its share plus
z1_s) enter by IKNP OT extension over a P-256 base OT. Everything is vectorised across the batch.

API (what the services code against)::

    from capc_common.mpc import (Channel, channel_pair, SocketChannel, MpcConfig, noise_bound, ring_width,
                                 share_votes, expand_share_seed, sum_shares, GarblerSession, EvaluatorSession)

    # once per federation: the ring width and the session parameters (both parties, same values)
    w = ring_width(teachers=250, sigma1=100, sigma2=40, threshold=170)      # → 13
    config = MpcConfig(classes=10, width=w, teachers=250, mode="confident",
                       student_noise=noise_bound(100))                      # or mode="gnmax" (no bound)

    # teacher party p, per batch: seed → guardian (16 bytes), share → student
    seed, student_share = share_votes(votes_p, width=w)                      # votes_p: (B, c) ints
    # expand_share_seed(seed, shape=(B, c), width=w) is R_p = AES-CTR(seed) mod 2^w (the guardian does it)

    # guardian (garbler): one session per student link; base OT once, then many batches
    garbler = GarblerSession(channel, config)
    pass_bits = garbler.run_batch(batch_id, seeds=[seed_1, ...], shape=(B, c), z2=z2, z1=z1,
                                  threshold=T, commit=ledger_hook,           # (B,) bool
                                  before_decode=mark_hook)
    #   z2: (B, c) int noise, z1: (B,) the guardian's part z1_g of the threshold noise (None and
    #   threshold=None in "gnmax" mode); before_decode() runs before the first pass bit is decoded;
    #   commit(reveal) must make the charge durable (and may keep reveal.to_bytes()) and return before
    #   labels are revealed.

    # student (evaluator): z1_student is its own part z1_s of the threshold noise, (B,) ints (None in gnmax)
    evaluator = EvaluatorSession(channel, config)
    labels = evaluator.run_batch(batch_id, share_sum=sum_shares(shares, width=w),
                                 z1_student=z1_s, stash=keep)                # (B,) int64, −1 = failed
    #   stash(select_bits) runs before the garbler can commit; decode_labels(select_bits, reveal, classes=c)
    #   gives the same labels later from a reveal sent again (Reveal.from_bytes).

``Channel`` is message-oriented: ``send(bytes)``, ``recv() -> bytes``, ``close()``; frames are at most
:data:`MAX_FRAME_BYTES` (4 MiB + 64), so a gRPC bidi stream of ``bytes`` messages can carry them 1:1.
:func:`channel_pair` gives two in-memory ends (tests, one process), :class:`SocketChannel` a TCP/Unix link.

Errors: :class:`~capc_common.errors.InputError` for bad local inputs (nothing sent, session unchanged);
:class:`BatchRejected` (a ``ProtocolError``) when the two sides disagree on a batch id or size (session still
usable); :class:`~capc_common.errors.ProtocolError` for malformed, truncated or out-of-order messages or a
peer abort (the session is closed; the peer only learns that we aborted).

The hazmat layer (AES, TCCR hash, half-gates kernels, base OT, IKNP, transpose) is in
:mod:`capc_common.mpc.primitives`; the circuit description in :mod:`capc_common.mpc.circuit` runs on
:class:`PlainBackend` (plaintext twin), the garbler's and the evaluator's backends.
"""

from capc_common.mpc.backend import CircuitBackend
from capc_common.mpc.channel import MAX_FRAME_BYTES, Channel, SocketChannel, channel_pair
from capc_common.mpc.config import Mode, MpcConfig, noise_bound, ring_width
from capc_common.mpc.evaluator import EvaluatorSession
from capc_common.mpc.garbler import GarblerSession
from capc_common.mpc.party import BatchRejected
from capc_common.mpc.plain import CircuitStats, PlainBackend, circuit_stats, reference_noisy_argmax, run_plain
from capc_common.mpc.reveal import Reveal, decode_labels, pack_bits, unpack_bits
from capc_common.mpc.session import open_session
from capc_common.mpc.sharing import expand_share_seed, reduce_shares, share_votes, sum_seeds, sum_shares

__all__ = [
    "MAX_FRAME_BYTES",
    "BatchRejected",
    "Channel",
    "CircuitBackend",
    "CircuitStats",
    "EvaluatorSession",
    "GarblerSession",
    "Mode",
    "MpcConfig",
    "PlainBackend",
    "Reveal",
    "SocketChannel",
    "channel_pair",
    "circuit_stats",
    "decode_labels",
    "expand_share_seed",
    "noise_bound",
    "open_session",
    "pack_bits",
    "reduce_shares",
    "reference_noisy_argmax",
    "ring_width",
    "run_plain",
    "share_votes",
    "sum_seeds",
    "sum_shares",
    "unpack_bits",
]
