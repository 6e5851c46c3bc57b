"""The 64-byte region superblock (§7.1): write, read, validate, keep alive.

The producer writes the superblock once when it creates a region and then only refreshes
``activity_timestamp_ns`` (an aligned 8-byte field at offset 56, so one store). A consumer checks
every field against what was announced before trusting a single byte of the region (§15.1);
each mismatch is a *distinct* :class:`SuperblockError` reason so operators can tell a stale epoch
from a misconfigured pool at a glance. Liveness (§15.14) is a separate check because it depends
on the caller's clock and freshness window.

Conventions shared with the reference implementations:

* header ring: ``pool_id = 0``, ``slot_bytes = 256``, ``stride_bytes = 0`` (not announced, not
  checked);
* payload pool: ``pool_id`` = announced id, ``stride_bytes`` = announced stride, and
  ``slot_bytes = stride_bytes``. The C implementation writes the u32 null value
  (``0xFFFFFFFF``) in a pool's ``slot_bytes`` instead; both are accepted for pools.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tensorpool.counters import Reason
from tensorpool.shm.backend import is_power_of_two
from tensorpool.shm.errors import SuperblockError
from tensorpool.shm.layout import (
    ACTIVITY_TIMESTAMP_OFFSET,
    HEADER_SLOT_BYTES,
    LAYOUT_VERSION,
    MAGIC,
    SUPERBLOCK,
    SUPERBLOCK_SIZE,
    RegionType,
)

#: u32 null sentinel; the C reference writes it as a pool's slot_bytes.
U32_NULL = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class SuperblockFields:
    """Decoded superblock; ``region_type`` stays a raw int so unknown values can be reported."""

    magic: int
    layout_version: int
    epoch: int
    stream_id: int
    region_type: int
    pool_id: int
    nslots: int
    slot_bytes: int
    stride_bytes: int
    pid: int
    start_timestamp_ns: int
    activity_timestamp_ns: int

    @classmethod
    def header_ring(
        cls,
        *,
        epoch: int,
        stream_id: int,
        nslots: int,
        now_ns: int,
        layout_version: int = LAYOUT_VERSION,
        pid: int | None = None,
    ) -> SuperblockFields:
        return cls(
            MAGIC,
            layout_version,
            epoch,
            stream_id,
            int(RegionType.HEADER_RING),
            0,
            nslots,
            HEADER_SLOT_BYTES,
            0,
            os.getpid() if pid is None else pid,
            now_ns,
            now_ns,
        )

    @classmethod
    def payload_pool(
        cls,
        *,
        epoch: int,
        stream_id: int,
        pool_id: int,
        nslots: int,
        stride_bytes: int,
        now_ns: int,
        layout_version: int = LAYOUT_VERSION,
        pid: int | None = None,
    ) -> SuperblockFields:
        return cls(
            MAGIC,
            layout_version,
            epoch,
            stream_id,
            int(RegionType.PAYLOAD_POOL),
            pool_id,
            nslots,
            stride_bytes,
            stride_bytes,
            os.getpid() if pid is None else pid,
            now_ns,
            now_ns,
        )

    @property
    def slot_size(self) -> int:
        """Bytes per slot in this region: 256 for the header ring, ``stride_bytes`` for pools."""
        return (
            HEADER_SLOT_BYTES if self.region_type == RegionType.HEADER_RING else self.stride_bytes
        )

    @property
    def region_bytes(self) -> int:
        return SUPERBLOCK_SIZE + self.nslots * self.slot_size


def write_superblock(buf: object, fields: SuperblockFields) -> None:
    """Pack all 64 bytes at offset 0 of ``buf`` (a writable buffer such as an mmap)."""
    SUPERBLOCK.pack_into(
        buf,  # type: ignore[arg-type]
        0,
        fields.magic,
        fields.layout_version,
        fields.epoch,
        fields.stream_id,
        fields.region_type,
        fields.pool_id,
        fields.nslots,
        fields.slot_bytes,
        fields.stride_bytes,
        fields.pid,
        fields.start_timestamp_ns,
        fields.activity_timestamp_ns,
    )


def read_superblock(buf: object) -> SuperblockFields:
    """Decode the superblock at offset 0; a buffer shorter than 64 bytes is ``region_too_small``."""
    if len(buf) < SUPERBLOCK_SIZE:  # type: ignore[arg-type]
        raise SuperblockError(Reason.REGION_TOO_SMALL, f"{len(buf)} < {SUPERBLOCK_SIZE} bytes")  # type: ignore[arg-type]
    return SuperblockFields(*SUPERBLOCK.unpack_from(buf, 0))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ExpectedRegion:
    """What the most recent announce says a region must contain (§15.1)."""

    region_type: int
    layout_version: int
    epoch: int
    stream_id: int
    nslots: int
    pool_id: int = 0
    stride_bytes: int = 0

    @classmethod
    def header_ring(
        cls, *, epoch: int, stream_id: int, nslots: int, layout_version: int = LAYOUT_VERSION
    ) -> ExpectedRegion:
        return cls(int(RegionType.HEADER_RING), layout_version, epoch, stream_id, nslots)

    @classmethod
    def payload_pool(
        cls,
        *,
        epoch: int,
        stream_id: int,
        pool_id: int,
        nslots: int,
        stride_bytes: int,
        layout_version: int = LAYOUT_VERSION,
    ) -> ExpectedRegion:
        return cls(
            int(RegionType.PAYLOAD_POOL),
            layout_version,
            epoch,
            stream_id,
            nslots,
            pool_id,
            stride_bytes,
        )

    @property
    def is_header_ring(self) -> bool:
        return self.region_type == RegionType.HEADER_RING

    @property
    def slot_size(self) -> int:
        return HEADER_SLOT_BYTES if self.is_header_ring else self.stride_bytes

    @property
    def region_bytes(self) -> int:
        return SUPERBLOCK_SIZE + self.nslots * self.slot_size


def validate_superblock(fields: SuperblockFields, expected: ExpectedRegion) -> None:
    """Raise :class:`SuperblockError` with the first failing rule's reason (§7.1, §15.1)."""
    if fields.magic != MAGIC:
        raise SuperblockError(Reason.SUPERBLOCK_BAD_MAGIC, f"{fields.magic:#018x}")
    if fields.layout_version != expected.layout_version:
        raise SuperblockError(
            Reason.SUPERBLOCK_LAYOUT_VERSION_MISMATCH,
            f"{fields.layout_version} != {expected.layout_version}",
        )
    if fields.epoch != expected.epoch:
        raise SuperblockError(
            Reason.SUPERBLOCK_EPOCH_MISMATCH, f"{fields.epoch} != {expected.epoch}"
        )
    if fields.stream_id != expected.stream_id:
        raise SuperblockError(
            Reason.SUPERBLOCK_STREAM_ID_MISMATCH, f"{fields.stream_id} != {expected.stream_id}"
        )
    if fields.region_type != expected.region_type:
        raise SuperblockError(
            Reason.SUPERBLOCK_REGION_TYPE_MISMATCH,
            f"{fields.region_type} != {expected.region_type}",
        )
    # §7.1: a header ring's pool_id MUST be 0; a pool's MUST equal the announced id.
    want_pool = 0 if expected.is_header_ring else expected.pool_id
    if fields.pool_id != want_pool:
        raise SuperblockError(
            Reason.SUPERBLOCK_POOL_ID_MISMATCH, f"{fields.pool_id} != {want_pool}"
        )
    if not is_power_of_two(fields.nslots):
        raise SuperblockError(Reason.SUPERBLOCK_NSLOTS_NOT_POWER_OF_TWO, str(fields.nslots))
    if fields.nslots != expected.nslots:
        raise SuperblockError(
            Reason.SUPERBLOCK_NSLOTS_MISMATCH, f"{fields.nslots} != {expected.nslots}"
        )
    if expected.is_header_ring:
        if fields.slot_bytes != HEADER_SLOT_BYTES:
            raise SuperblockError(
                Reason.SUPERBLOCK_SLOT_BYTES_MISMATCH, f"{fields.slot_bytes} != 256"
            )
    else:
        if fields.stride_bytes != expected.stride_bytes:
            raise SuperblockError(
                Reason.SUPERBLOCK_STRIDE_BYTES_MISMATCH,
                f"{fields.stride_bytes} != {expected.stride_bytes}",
            )
        if fields.slot_bytes not in (expected.stride_bytes, U32_NULL):
            raise SuperblockError(
                Reason.SUPERBLOCK_SLOT_BYTES_MISMATCH,
                f"{fields.slot_bytes} != stride {expected.stride_bytes}",
            )


def is_fresh(activity_timestamp_ns: int, now_ns: int, window_ns: int) -> bool:
    """True while the producer's heartbeat is within ``window_ns`` of ``now_ns`` (§15.1, §15.14).

    A zero timestamp means "never refreshed" and is stale. A timestamp slightly in the future
    (another CPU's clock read raced ours) counts as fresh.
    """
    return activity_timestamp_ns != 0 and now_ns - activity_timestamp_ns <= window_ns


def check_fresh(fields: SuperblockFields, now_ns: int, window_ns: int) -> None:
    if not is_fresh(fields.activity_timestamp_ns, now_ns, window_ns):
        raise SuperblockError(
            Reason.SUPERBLOCK_ACTIVITY_STALE,
            f"activity {fields.activity_timestamp_ns} vs now {now_ns} (window {window_ns} ns)",
        )


#: Index of ``activity_timestamp_ns`` in a ``memoryview.cast('Q')`` of the region.
ACTIVITY_WORD_INDEX = ACTIVITY_TIMESTAMP_OFFSET // 8


def refresh_activity(words: memoryview, now_ns: int) -> None:
    """Store ``activity_timestamp_ns`` with one aligned 8-byte store (``words`` is a u64 view)."""
    words[ACTIVITY_WORD_INDEX] = now_ns


def read_activity(words: memoryview) -> int:
    """Load ``activity_timestamp_ns`` with one aligned 8-byte load."""
    return words[ACTIVITY_WORD_INDEX]  # type: ignore[no-any-return]
