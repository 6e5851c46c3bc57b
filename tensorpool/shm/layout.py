"""Byte layout of SHM regions (§6-§9) and the precompiled hot-path ``Struct`` objects.

Every region starts with a 64-byte superblock (§6: fixed, not derived from SBE metadata).
The header ring follows with 256-byte slots; payload pools follow with ``stride_bytes`` slots:

    header slot i   : 64 + i * 256
    payload slot j  : 64 + j * stride_bytes          (v1.1: j == header index)

A header slot is a header-less ``SlotHeader`` body (60-byte block) whose ``headerBytes`` varData
(u32 length = 192 at +60) holds an embedded ``TensorHeader`` *with* its 8-byte SBE message header
at +64 and its 184-byte block at +72.

Offsets, ids and enums come from the generated SBE codecs (:mod:`tensorpool.specs.generated.wire`).
The read/write paths use hand-precompiled ``struct.Struct`` formats instead of the generated
flyweights because one ``unpack_from`` of a contiguous run of fields is several times cheaper
than a property call per field; ``tests/unit/shm/test_layout.py`` proves the formats place every
field at the generated offset, byte for byte.

Only ``seq_commit`` (slot offset 0) is *never* accessed through these formats: little-endian
``struct`` formats pack and unpack 8-byte integers one byte at a time (see :mod:`.seqlock`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from tensorpool.specs.generated.wire import (
    MESSAGE_HEADER_LENGTH,
    Dtype,
    MajorOrder,
    ProgressUnit,
    RegionType,
    ShmRegionSuperblockDecoder,
    SlotHeaderDecoder,
    TensorHeaderDecoder,
)

__all__ = [
    "EMBEDDED_HEADER_LENGTH",
    "EMBEDDED_HEADER_OFFSET",
    "HEADER_BYTES_LENGTH_OFFSET",
    "HEADER_SLOT_BYTES",
    "LAYOUT_VERSION",
    "MAGIC",
    "MAX_DIMS",
    "MAX_NSLOTS",
    "MAX_STRIDE_BYTES",
    "SLOT_FIELDS",
    "SLOT_FIELDS_READ",
    "SUPERBLOCK",
    "SUPERBLOCK_SIZE",
    "TENSOR_BLOB",
    "TENSOR_BLOB_READ",
    "Dtype",
    "MajorOrder",
    "ProgressUnit",
    "RegionType",
    "header_region_bytes",
    "header_slot_offset",
    "payload_region_bytes",
    "payload_slot_offset",
]

#: §6: the superblock is exactly 64 bytes; all offsets are computed from this constant.
SUPERBLOCK_SIZE: Final = 64
#: §8.1: each header slot is exactly 256 bytes.
HEADER_SLOT_BYTES: Final = 256
#: §7.1: ASCII "TPOLSHM1" as a little-endian u64.
MAGIC: Final = 0x544F504C53484D31
#: The SHM layout revision this implementation writes and accepts.
LAYOUT_VERSION: Final = 1
#: §8.2: compile-time constant of the v1.1 schema.
MAX_DIMS: Final = 8
#: ``stride_bytes`` is a u32 in the superblock and in ``ShmPoolAnnounce`` and must be a power of
#: two (§15.22): 2 GiB is the largest stride, hence the largest frame, the wire can describe.
MAX_STRIDE_BYTES: Final = 1 << 31
#: ``nslots`` / ``headerNslots`` are u32 and powers of two (§15.5).
MAX_NSLOTS: Final = 1 << 31

SLOT_HEADER_BLOCK_LENGTH: Final = SlotHeaderDecoder.BLOCK_LENGTH
#: varData length prefix of ``headerBytes`` sits right after the SlotHeader block.
HEADER_BYTES_LENGTH_OFFSET: Final = SLOT_HEADER_BLOCK_LENGTH
EMBEDDED_HEADER_OFFSET: Final = HEADER_BYTES_LENGTH_OFFSET + 4
TENSOR_BLOCK_OFFSET: Final = EMBEDDED_HEADER_OFFSET + MESSAGE_HEADER_LENGTH
#: §8.2: embedded TensorHeader = 8-byte message header + 184-byte block = 192 bytes.
EMBEDDED_HEADER_LENGTH: Final = MESSAGE_HEADER_LENGTH + TensorHeaderDecoder.BLOCK_LENGTH

TENSOR_TEMPLATE_ID: Final = TensorHeaderDecoder.TEMPLATE_ID
TENSOR_SCHEMA_ID: Final = TensorHeaderDecoder.SCHEMA_ID
TENSOR_SCHEMA_VERSION: Final = TensorHeaderDecoder.SCHEMA_VERSION
TENSOR_BLOCK_LENGTH: Final = TensorHeaderDecoder.BLOCK_LENGTH

#: ``seq_commit`` offset inside a slot (§8.2: MUST be 0) and its index in a u64 view of a slot.
SEQ_COMMIT_OFFSET: Final = SlotHeaderDecoder.SEQ_COMMIT_OFFSET
#: Offset of ``activity_timestamp_ns`` in the superblock (8-byte aligned: one store refreshes it).
ACTIVITY_TIMESTAMP_OFFSET: Final = ShmRegionSuperblockDecoder.ACTIVITY_TIMESTAMP_NS_OFFSET

#: The whole superblock (§7.1): magic, layout_version, epoch, stream_id, region_type, pool_id,
#: nslots, slot_bytes, stride_bytes, pid, start_timestamp_ns, activity_timestamp_ns.
SUPERBLOCK: Final = struct.Struct("<QIQIhHIIIQQQ")

# --- hot-path formats ----------------------------------------------------------------------------
#: Slot bytes [8, 60): values_len_bytes, payload_slot, pool_id, payload_offset, timestamp_ns,
#: meta_version, then the 26 pad bytes (packed as zeros: a full overwrite, §8.3 step 3).
SLOT_FIELDS: Final = struct.Struct("<IIHIQI26x")
#: The same fields without the pad, for reading.
SLOT_FIELDS_READ: Final = struct.Struct("<IIHIQI")
#: Offset where SLOT_FIELDS starts (right after seq_commit).
SLOT_FIELDS_OFFSET: Final = SlotHeaderDecoder.VALUES_LEN_BYTES_OFFSET

#: Slot bytes [60, 256): headerBytes length, embedded message header (blockLength, templateId,
#: schemaId, version), TensorHeader block (dtype, majorOrder, ndims, padAlign, progressUnit,
#: progressStrideBytes, dims[8], strides[8]) and the 109-byte pad (zero-filled).
TENSOR_BLOB: Final = struct.Struct(f"<IHHHHhhBBBI{MAX_DIMS}i{MAX_DIMS}i109x")
#: The same without the trailing pad: bytes [60, 139). Readers compare these raw bytes against
#: the previous frame's to reuse an already validated layout.
TENSOR_BLOB_READ: Final = struct.Struct(f"<IHHHHhhBBBI{MAX_DIMS}i{MAX_DIMS}i")
TENSOR_BLOB_OFFSET: Final = HEADER_BYTES_LENGTH_OFFSET
TENSOR_BLOB_END: Final = TENSOR_BLOB_OFFSET + TENSOR_BLOB_READ.size


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One payload pool size class of a stream (§9): its id and slot stride. The slot count is
    always the header ring's, so it is not repeated here. Producers' stream configs and the
    driver's and bridge's profiles all describe their pools with this one type."""

    pool_id: int
    stride_bytes: int


def header_slot_offset(index: int) -> int:
    """Byte offset of header slot ``index`` (§8.1)."""
    return SUPERBLOCK_SIZE + index * HEADER_SLOT_BYTES


def payload_slot_offset(slot: int, stride_bytes: int) -> int:
    """Byte offset of payload slot ``slot`` in a pool with ``stride_bytes`` (§9)."""
    return SUPERBLOCK_SIZE + slot * stride_bytes


def header_region_bytes(nslots: int) -> int:
    return SUPERBLOCK_SIZE + nslots * HEADER_SLOT_BYTES


def payload_region_bytes(nslots: int, stride_bytes: int) -> int:
    return SUPERBLOCK_SIZE + nslots * stride_bytes


assert SUPERBLOCK.size == SUPERBLOCK_SIZE
assert ACTIVITY_TIMESTAMP_OFFSET % 8 == 0 and SEQ_COMMIT_OFFSET == 0
assert SLOT_FIELDS.size + 8 == SLOT_HEADER_BLOCK_LENGTH
assert TENSOR_BLOB.size + TENSOR_BLOB_OFFSET == HEADER_SLOT_BYTES
