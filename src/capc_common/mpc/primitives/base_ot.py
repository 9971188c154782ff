"""Semi-honest 1-out-of-2 base OT on P-256 with obliviously sampled public keys and transcript-hashed keys.

The receiver, for each choice bit b, sends two public keys: a real one pk_b = sk·G and an *obliviously
sampled* one pk_{1-b} (a uniformly random curve point made from a random x-coordinate, whose discrete log
nobody knows). Both are uniform points, so the pair hides b perfectly. The sender picks one ephemeral key r,
sends R = r·G and encrypts m_i under k_i = SHA-256(transcript ‖ j ‖ i ‖ ECDH(r, pk_i)); only the key whose
secret the receiver holds can be recomputed (computational Diffie–Hellman in the random-oracle model; the
Bellare–Micali construction). Hashing the whole transcript and the OT index into every key binds each key to
this run and position.

X25519 is not usable here: its public keys are byte strings that are not uniform over the group, so an
obliviously sampled "key" would be distinguishable from a real one and leak the choice bit.

Everything is done with ``cryptography``'s ECDH and SHA-256; the only custom step is reading a random
compressed point, which ``cryptography`` validates on decoding.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from capc_common.errors import InputError, ProtocolError
from capc_common.mpc.primitives.errors import AlreadyFinalized

POINT_BYTES = 33
"""A compressed P-256 point."""
SEED_BYTES = 16
_CURVE = ec.SECP256R1()
_FIELD_PRIME = 2**256 - 2**224 + 2**192 + 2**96 - 1
_GROUP_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_DOMAIN = b"capc/mpc/base-ot/p256/v1"


def _new_secret() -> ec.EllipticCurvePrivateKey:
    """A fresh private key whose scalar comes from ``os.urandom`` (64 bytes reduced mod n: bias < 2^-250)."""
    scalar = int.from_bytes(os.urandom(64), "big") % (_GROUP_ORDER - 1) + 1
    return ec.derive_private_key(scalar, _CURVE)


def _compress(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)


def _decode_point(data: bytes, what: str) -> ec.EllipticCurvePublicKey:
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(_CURVE, data)
    except ValueError as exc:
        raise ProtocolError(f"base OT: {what} is not a valid compressed P-256 point.") from exc


def oblivious_point() -> bytes:
    """Sample a uniformly random P-256 point without learning its discrete logarithm.

    Draw a random x below the field prime and a random sign byte until (x, sign) decodes to a point: about
    two tries. Each point (x, ±y) is hit with equal probability, exactly like the compressed encoding of a
    freshly generated public key.

    Returns:
        33-byte compressed point.
    """
    while True:
        raw = os.urandom(1 + 32)
        x = raw[1:]
        if int.from_bytes(x, "big") >= _FIELD_PRIME:
            continue
        encoded = bytes([2 | (raw[0] & 1)]) + x
        try:
            ec.EllipticCurvePublicKey.from_encoded_point(_CURVE, encoded)
        except ValueError:
            continue
        return encoded


def _derive_key(transcript: bytes, index: int, which: int, shared: bytes) -> bytes:
    digest = hashes.Hash(hashes.SHA256())
    for part in (_DOMAIN, transcript, struct.pack("<IB", index, which), shared):
        digest.update(part)
    return digest.finalize()[:SEED_BYTES]


def _transcript(session_id: bytes, first_message: bytes, sender_point: bytes) -> bytes:
    digest = hashes.Hash(hashes.SHA256())
    for part in (_DOMAIN, session_id, first_message, sender_point):
        digest.update(struct.pack("<I", len(part)))
        digest.update(part)
    return digest.finalize()


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


class BaseOtReceiver:
    """The receiver of ``n`` base OTs (in IKNP: the party that will *send* the extended OTs).

    Args:
        choices: one bit per OT.
        session_id: bytes both parties agreed on; bound into every key.
    """

    def __init__(self, choices: Sequence[bool], *, session_id: bytes) -> None:
        if not choices:
            raise InputError("base OT needs at least one choice bit.")
        self._choices = [bool(c) for c in choices]
        self._session_id = bytes(session_id)
        self._secrets = [_new_secret() for _ in self._choices]
        pairs = []
        for choice, secret in zip(self._choices, self._secrets, strict=True):
            real, fake = _compress(secret.public_key()), oblivious_point()
            pairs.append(fake + real if choice else real + fake)
        self._first_message = b"".join(pairs)
        self._done = False

    def first_message(self) -> bytes:
        """The public keys ``pk_0 ‖ pk_1`` for every OT (33 bytes each)."""
        return self._first_message

    def finish(self, reply: bytes) -> list[bytes]:
        """Decrypt the chosen message of every OT from the sender's reply.

        Args:
            reply: ``R ‖ e_0 ‖ e_1 ‖ …`` from :meth:`BaseOtSender.respond`.

        Returns:
            The chosen 16-byte message of each OT.

        Raises:
            ProtocolError: the reply is malformed.
            AlreadyFinalized: called twice.
        """
        if self._done:
            raise AlreadyFinalized("this base-OT receiver has already finished; run a new one.")
        self._done = True
        n = len(self._choices)
        expected = POINT_BYTES + 2 * SEED_BYTES * n
        if len(reply) != expected:
            raise ProtocolError(f"base OT reply has {len(reply)} bytes, expected {expected} for {n} OTs.")
        sender_point = bytes(reply[:POINT_BYTES])
        point = _decode_point(sender_point, "the sender's ephemeral key")
        transcript = _transcript(self._session_id, self._first_message, sender_point)
        chosen = []
        for j, (choice, secret) in enumerate(zip(self._choices, self._secrets, strict=True)):
            offset = POINT_BYTES + (2 * j + int(choice)) * SEED_BYTES
            shared = secret.exchange(ec.ECDH(), point)
            key = _derive_key(transcript, j, int(choice), shared)
            chosen.append(_xor(bytes(reply[offset : offset + SEED_BYTES]), key))
        self._secrets = []
        return chosen


class BaseOtSender:
    """The sender of ``n`` base OTs of 16-byte messages (in IKNP: the extended-OT *receiver*).

    Args:
        messages: ``(m_0, m_1)`` per OT, 16 bytes each.
        session_id: the same bytes the receiver used.
    """

    def __init__(self, messages: Sequence[tuple[bytes, bytes]], *, session_id: bytes) -> None:
        if not messages or any(len(m0) != SEED_BYTES or len(m1) != SEED_BYTES for m0, m1 in messages):
            raise InputError(
                f"base OT messages must be a non-empty list of pairs of {SEED_BYTES}-byte strings."
            )
        self._messages = [(bytes(m0), bytes(m1)) for m0, m1 in messages]
        self._session_id = bytes(session_id)
        self._done = False

    def respond(self, first_message: bytes) -> bytes:
        """Encrypt both messages of every OT under the receiver's two public keys.

        Raises:
            ProtocolError: the receiver's message is malformed (wrong length, not curve points).
            AlreadyFinalized: called twice.
        """
        if self._done:
            raise AlreadyFinalized("this base-OT sender has already responded; run a new one.")
        self._done = True
        n = len(self._messages)
        if len(first_message) != 2 * POINT_BYTES * n:
            raise ProtocolError(
                f"base OT first message has {len(first_message)} bytes, expected {2 * POINT_BYTES * n}."
            )
        first_message = bytes(first_message)
        ephemeral = _new_secret()
        sender_point = _compress(ephemeral.public_key())
        transcript = _transcript(self._session_id, first_message, sender_point)
        parts = [sender_point]
        for j, pair in enumerate(self._messages):
            for which in (0, 1):
                offset = (2 * j + which) * POINT_BYTES
                public = _decode_point(
                    first_message[offset : offset + POINT_BYTES], f"public key {which} of OT {j}"
                )
                key = _derive_key(transcript, j, which, ephemeral.exchange(ec.ECDH(), public))
                parts.append(_xor(pair[which], key))
        self._messages = []
        return b"".join(parts)
