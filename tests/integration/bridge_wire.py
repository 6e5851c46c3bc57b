"""Hand-made source frames for feeding a bridge receiver over real UDP."""

from __future__ import annotations

import struct

from tensorpool.shm.layout import SLOT_FIELDS, SLOT_FIELDS_OFFSET, TENSOR_BLOB_OFFSET
from tensorpool.shm.tensor import TensorLayout


def header_slot(
    seq: int, layout: TensorLayout, values_len: int, ts: int, *, mv: int = 0, nslots: int = 64
) -> bytes:
    """The source's 256-byte header slot of frame ``seq``: committed seqlock, pool 1, slot
    ``seq % nslots``, metadata version ``mv``."""
    buf = bytearray(256)
    struct.pack_into("<Q", buf, 0, (seq << 1) | 1)
    SLOT_FIELDS.pack_into(buf, SLOT_FIELDS_OFFSET, values_len, seq % nslots, 1, 0, ts, mv)
    buf[TENSOR_BLOB_OFFSET:] = layout.blob
    return bytes(buf)
