"""Region superblock (§7.1): layout, write/read, per-field validation (§15.1), liveness (§15.14)."""

from __future__ import annotations

import dataclasses

import pytest

from tensorpool.counters import Reason
from tensorpool.shm import (
    MAGIC,
    SUPERBLOCK_SIZE,
    ExpectedRegion,
    SuperblockError,
    SuperblockFields,
    check_fresh,
    is_fresh,
    read_superblock,
    validate_superblock,
    write_superblock,
)
from tensorpool.shm.layout import RegionType
from tensorpool.shm.superblock import U32_NULL, read_activity, refresh_activity
from tensorpool.specs.generated.wire import ShmRegionSuperblockDecoder, ShmRegionSuperblockEncoder

HDR = SuperblockFields.header_ring(epoch=9, stream_id=1000, nslots=64, now_ns=111, pid=4242)
POOL = SuperblockFields.payload_pool(
    epoch=9, stream_id=1000, pool_id=3, nslots=64, stride_bytes=1 << 20, now_ns=111, pid=4242
)
EXP_HDR = ExpectedRegion.header_ring(epoch=9, stream_id=1000, nslots=64)
EXP_POOL = ExpectedRegion.payload_pool(
    epoch=9, stream_id=1000, pool_id=3, nslots=64, stride_bytes=1 << 20
)


def test_s6_s7_1_superblock_is_64_bytes_and_magic_is_the_spec_u64() -> None:
    """§7.1 gives the magic as the u64 0x544F504C53484D31 stored little-endian. (That number
    spells "TOPLSHM1" read big-endian, not the "TPOLSHM1" the prose names; both reference
    implementations store the number, so byte compatibility follows the number.)"""
    assert SUPERBLOCK_SIZE == 64 == ShmRegionSuperblockDecoder.BLOCK_LENGTH
    buf = bytearray(64)
    write_superblock(buf, HDR)
    assert MAGIC == 0x544F504C53484D31
    assert bytes(buf[:8]) == bytes.fromhex("314d48534c504f54")


def test_s7_1_superblock_bytes_match_generated_codec() -> None:
    """Our write equals the SBE encoder's body; the SBE decoder reads back every field."""
    ours = bytearray(64)
    write_superblock(ours, POOL)
    theirs = bytearray(64)
    ShmRegionSuperblockEncoder.encode_body(theirs, 0, **dataclasses.asdict(POOL))
    assert ours == theirs
    dec = ShmRegionSuperblockDecoder().wrap_body(ours, 0)
    for field in dataclasses.fields(SuperblockFields):
        got = getattr(dec, field.name)
        assert got == getattr(POOL, field.name), field.name
    assert read_superblock(theirs) == POOL


def test_s7_1_writer_conventions_for_ring_and_pool() -> None:
    assert (HDR.region_type, HDR.pool_id, HDR.slot_bytes, HDR.stride_bytes) == (
        RegionType.HEADER_RING,
        0,
        256,
        0,
    )
    assert (POOL.region_type, POOL.pool_id, POOL.slot_bytes, POOL.stride_bytes) == (
        RegionType.PAYLOAD_POOL,
        3,
        1 << 20,
        1 << 20,
    )
    assert HDR.start_timestamp_ns == HDR.activity_timestamp_ns == 111
    assert HDR.region_bytes == 64 + 64 * 256
    assert POOL.region_bytes == 64 + 64 * (1 << 20)


def test_s15_1_matching_superblocks_validate() -> None:
    validate_superblock(HDR, EXP_HDR)
    validate_superblock(POOL, EXP_POOL)
    # tensor_pool_c writes the u32 null value into a pool's slot_bytes: accepted.
    validate_superblock(dataclasses.replace(POOL, slot_bytes=U32_NULL), EXP_POOL)
    # header stride_bytes is not announced and not checked.
    validate_superblock(dataclasses.replace(HDR, stride_bytes=4096), EXP_HDR)


HDR_CASES = [
    ("magic", 0x1122334455667788, Reason.SUPERBLOCK_BAD_MAGIC),
    ("layout_version", 2, Reason.SUPERBLOCK_LAYOUT_VERSION_MISMATCH),
    ("epoch", 8, Reason.SUPERBLOCK_EPOCH_MISMATCH),
    ("stream_id", 1001, Reason.SUPERBLOCK_STREAM_ID_MISMATCH),
    ("region_type", int(RegionType.PAYLOAD_POOL), Reason.SUPERBLOCK_REGION_TYPE_MISMATCH),
    ("region_type", 7, Reason.SUPERBLOCK_REGION_TYPE_MISMATCH),
    ("pool_id", 1, Reason.SUPERBLOCK_POOL_ID_MISMATCH),
    ("nslots", 32, Reason.SUPERBLOCK_NSLOTS_MISMATCH),
    ("nslots", 48, Reason.SUPERBLOCK_NSLOTS_NOT_POWER_OF_TWO),
    ("nslots", 0, Reason.SUPERBLOCK_NSLOTS_NOT_POWER_OF_TWO),
    ("slot_bytes", 512, Reason.SUPERBLOCK_SLOT_BYTES_MISMATCH),
]


@pytest.mark.parametrize(("field", "value", "reason"), HDR_CASES)
def test_s15_1_header_ring_mismatch_has_distinct_reason(
    field: str, value: int, reason: str
) -> None:
    """§7.1/§15.1: each header-ring field that differs from the announce is its own failure;
    pool_id of a header ring MUST be 0."""
    with pytest.raises(SuperblockError) as info:
        validate_superblock(dataclasses.replace(HDR, **{field: value}), EXP_HDR)
    assert info.value.reason == reason


POOL_CASES = [
    ("epoch", 10, Reason.SUPERBLOCK_EPOCH_MISMATCH),
    ("region_type", int(RegionType.HEADER_RING), Reason.SUPERBLOCK_REGION_TYPE_MISMATCH),
    ("pool_id", 4, Reason.SUPERBLOCK_POOL_ID_MISMATCH),
    ("pool_id", 0, Reason.SUPERBLOCK_POOL_ID_MISMATCH),
    ("nslots", 128, Reason.SUPERBLOCK_NSLOTS_MISMATCH),
    ("stride_bytes", 1 << 21, Reason.SUPERBLOCK_STRIDE_BYTES_MISMATCH),
    ("slot_bytes", 256, Reason.SUPERBLOCK_SLOT_BYTES_MISMATCH),
]


@pytest.mark.parametrize(("field", "value", "reason"), POOL_CASES)
def test_s15_1_payload_pool_mismatch_has_distinct_reason(
    field: str, value: int, reason: str
) -> None:
    """§7.1: a pool's pool_id MUST equal the announced one; §15.1 stride/nslots must match."""
    with pytest.raises(SuperblockError) as info:
        validate_superblock(dataclasses.replace(POOL, **{field: value}), EXP_POOL)
    assert info.value.reason == reason


def test_s15_5_pool_nslots_must_equal_header_nslots() -> None:
    """A pool announced with the header ring's nslots but carrying another count is rejected."""
    with pytest.raises(SuperblockError) as info:
        validate_superblock(dataclasses.replace(POOL, nslots=32), EXP_POOL)
    assert info.value.reason == Reason.SUPERBLOCK_NSLOTS_MISMATCH


def test_s15_13_short_buffer_is_region_too_small() -> None:
    with pytest.raises(SuperblockError) as info:
        read_superblock(b"\0" * 63)
    assert info.value.reason == Reason.REGION_TOO_SMALL


def test_s15_13_zeroed_region_fails_closed() -> None:
    with pytest.raises(SuperblockError) as info:
        validate_superblock(read_superblock(bytes(64)), EXP_HDR)
    assert info.value.reason == Reason.SUPERBLOCK_BAD_MAGIC


def test_s15_14_activity_refresh_is_one_aligned_word_store() -> None:
    buf = bytearray(64)
    write_superblock(buf, HDR)
    words = memoryview(buf).cast("Q")
    refresh_activity(words, 0xDEADBEEF12345678)
    assert read_activity(words) == 0xDEADBEEF12345678
    fields = read_superblock(buf)
    assert fields.activity_timestamp_ns == 0xDEADBEEF12345678
    assert dataclasses.replace(fields, activity_timestamp_ns=111) == HDR  # nothing else moved


def test_s15_1_freshness_window() -> None:
    window = 3_000_000_000
    assert is_fresh(1_000, 1_000 + window, window)
    assert not is_fresh(1_000, 1_001 + window, window)
    assert not is_fresh(0, 10, window), "never-refreshed timestamp is stale"
    assert is_fresh(2_000, 1_000, window), "slightly-ahead clock read counts as fresh"
    check_fresh(HDR, 111 + window, window)
    with pytest.raises(SuperblockError) as info:
        check_fresh(HDR, 112 + window, window)
    assert info.value.reason == Reason.SUPERBLOCK_ACTIVITY_STALE
