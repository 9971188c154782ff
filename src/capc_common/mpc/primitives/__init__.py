"""Hazardous-materials layer of ``capc_common.mpc``: raw cryptographic building blocks.

.. warning::
    These are primitives, not protocols. Using them directly means taking on every decision the recipes in
    ``capc_common.mpc`` make for you: unique tweaks per session, a fresh Δ with least significant bit 1,
    never rewinding a PRG, never sending decoding bits of internal wires. Use :class:`GarblerSession` and
    :class:`EvaluatorSession` unless you are writing such a recipe.

Contents: fixed-key AES π and AES-CTR streams (``aes``), the TCCR hash and half-gates kernels
(``halfgates``), the IKNP bit-matrix transpose and bit planes (``bits``), P-256 base OT (``base_ot``) and IKNP
correlated-OT extension (``iknp``).
"""

from capc_common.mpc.primitives.aes import (
    BLOCK_BYTES,
    KEY_BYTES,
    AesCtrStream,
    FixedKeyAes,
    aes_blocks_per_second,
)
from capc_common.mpc.primitives.base_ot import BaseOtReceiver, BaseOtSender, oblivious_point
from capc_common.mpc.primitives.bits import OT_WIDTH, from_bit_planes, to_bit_planes, transpose_bits
from capc_common.mpc.primitives.errors import AlreadyFinalized
from capc_common.mpc.primitives.halfgates import (
    TABLE_BLOCKS_PER_AND,
    Workspace,
    eval_and,
    garble_and,
    input_labels,
    tccr_hash,
)
from capc_common.mpc.primitives.iknp import IknpReceiver, IknpSender, label_bits, padded_ot_count

__all__ = [
    "BLOCK_BYTES",
    "KEY_BYTES",
    "OT_WIDTH",
    "TABLE_BLOCKS_PER_AND",
    "AesCtrStream",
    "AlreadyFinalized",
    "BaseOtReceiver",
    "BaseOtSender",
    "FixedKeyAes",
    "IknpReceiver",
    "IknpSender",
    "Workspace",
    "aes_blocks_per_second",
    "eval_and",
    "from_bit_planes",
    "garble_and",
    "input_labels",
    "label_bits",
    "oblivious_point",
    "padded_ot_count",
    "tccr_hash",
    "to_bit_planes",
    "transpose_bits",
]
