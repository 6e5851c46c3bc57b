"""Layout facts the specs state as MUSTs: sizes, offsets, ids, enum numbers, constants."""

from __future__ import annotations

import pytest

from tensorpool.specs.generated import bridge, driver, wire


def test_s6_superblock_size_is_exactly_64() -> None:
    """§6: superblock_size is the constant 64; the schema's blockLength agrees."""
    assert wire.ShmRegionSuperblockDecoder.BLOCK_LENGTH == 64
    assert wire.ShmRegionSuperblockEncoder.encoded_length() - 8 == 64


def test_s7_1_superblock_field_offsets_cacheline_order() -> None:
    """§7.1: validation fields in the first 40 bytes, liveness fields after, little-endian."""
    d = wire.ShmRegionSuperblockDecoder
    offsets = {
        "MAGIC": 0,
        "LAYOUT_VERSION": 8,
        "EPOCH": 12,
        "STREAM_ID": 20,
        "REGION_TYPE": 24,
        "POOL_ID": 26,
        "NSLOTS": 28,
        "SLOT_BYTES": 32,
        "STRIDE_BYTES": 36,
        "PID": 40,
        "START_TIMESTAMP_NS": 48,
        "ACTIVITY_TIMESTAMP_NS": 56,
    }
    for name, off in offsets.items():
        assert getattr(d, f"{name}_OFFSET") == off, name
    assert wire.RegionType.HEADER_RING == 1
    assert wire.RegionType.PAYLOAD_POOL == 2


def test_s8_2_slot_header_offsets_and_seq_commit_at_zero() -> None:
    """§8.2: seq_commit at slot offset 0; 60-byte fixed prefix; packed without alignment."""
    d = wire.SlotHeaderDecoder
    assert d.SEQ_COMMIT_OFFSET == 0
    assert d.VALUES_LEN_BYTES_OFFSET == 8
    assert d.PAYLOAD_SLOT_OFFSET == 12
    assert d.POOL_ID_OFFSET == 16
    assert d.PAYLOAD_OFFSET_OFFSET == 18
    assert d.TIMESTAMP_NS_OFFSET == 22
    assert d.META_VERSION_OFFSET == 30
    assert d.PAD_OFFSET == 34
    assert d.PAD_LENGTH == 26
    assert d.BLOCK_LENGTH == 60
    assert d.TEMPLATE_ID == 51


def test_s8_2_tensor_header_offsets_and_192_byte_embedding() -> None:
    """§8.2: TensorHeader block is 184 bytes (192 with its header); maxDims takes no bytes."""
    d = wire.TensorHeaderDecoder
    assert d.DTYPE_OFFSET == 0
    assert d.MAJOR_ORDER_OFFSET == 2
    assert d.NDIMS_OFFSET == 4
    assert d.PAD_ALIGN_OFFSET == 5  # right after ndims: the constant maxDims is not encoded
    assert d.PROGRESS_UNIT_OFFSET == 6
    assert d.PROGRESS_STRIDE_BYTES_OFFSET == 7
    assert d.PROGRESS_STRIDE_BYTES_MIN_VALUE == 1
    assert d.DIMS_OFFSET == 11
    assert d.STRIDES_OFFSET == 43
    assert d.PAD_OFFSET == 75
    assert d.PAD_LENGTH == 109
    assert d.BLOCK_LENGTH == 184
    assert d.TEMPLATE_ID == 52
    assert d.MAX_DIMS_VALUE == wire.MAX_DIMS_CONST == 8
    assert wire.TensorHeaderEncoder.encoded_length() == 192
    assert not hasattr(d, "MAX_DIMS_OFFSET")


def test_s15_8_dtype_and_major_order_numeric_values() -> None:
    """§15.8: normative registry numbers (12 is unused)."""
    assert {m.name: m.value for m in wire.Dtype} == {
        "UNKNOWN": 0,
        "UINT8": 1,
        "INT8": 2,
        "UINT16": 3,
        "INT16": 4,
        "UINT32": 5,
        "INT32": 6,
        "UINT64": 7,
        "INT64": 8,
        "FLOAT32": 9,
        "FLOAT64": 10,
        "BOOLEAN": 11,
        "BYTES": 13,
        "BIT": 14,
    }
    assert {m.name: m.value for m in wire.MajorOrder} == {"UNKNOWN": 0, "ROW": 1, "COLUMN": 2}


def test_wire_enums_numeric_values() -> None:
    assert [(m.name, m.value) for m in wire.Mode] == [("STREAM", 1), ("RATE_LIMITED", 2)]
    assert [m.value for m in wire.FrameProgressState] == [0, 1, 2, 3]
    assert [(m.name, m.value) for m in wire.ProgressUnit] == [
        ("NONE", 0),
        ("ROWS", 1),
        ("COLUMNS", 2),
    ]
    assert [(m.name, m.value) for m in wire.ClockDomain] == [
        ("MONOTONIC", 1),
        ("REALTIME_SYNCED", 2),
    ]
    for codes in (wire.ResponseCode, driver.ResponseCode):
        assert [(m.name, m.value) for m in codes] == [
            ("OK", 0),
            ("UNSUPPORTED", 1),
            ("INVALID_PARAMS", 2),
            ("REJECTED", 3),
            ("INTERNAL_ERROR", 4),
        ]


def test_driver_enums_numeric_values() -> None:
    assert [(m.name, m.value) for m in driver.HugepagesPolicy] == [
        ("UNSPECIFIED", 0),
        ("STANDARD", 1),
        ("HUGEPAGES", 2),
    ]
    assert [(m.name, m.value) for m in driver.Role] == [("PRODUCER", 1), ("CONSUMER", 2)]
    assert [(m.name, m.value) for m in driver.PublishMode] == [
        ("REQUIRE_EXISTING", 1),
        ("EXISTING_OR_CREATE", 2),
    ]
    assert [(m.name, m.value) for m in driver.LeaseRevokeReason] == [
        ("DETACHED", 1),
        ("EXPIRED", 2),
        ("REVOKED", 3),
    ]
    assert [(m.name, m.value) for m in driver.ShutdownReason] == [
        ("NORMAL", 0),
        ("ADMIN", 1),
        ("ERROR", 2),
    ]


@pytest.mark.parametrize(("module", "schema_id"), [(wire, 900), (driver, 901), (bridge, 902)])
def test_schema_ids_and_versions(module: object, schema_id: int) -> None:
    assert schema_id == module.SCHEMA_ID  # type: ignore[attr-defined]
    assert module.SCHEMA_VERSION == 1  # type: ignore[attr-defined]
    assert module.MESSAGE_HEADER_LENGTH == 8  # type: ignore[attr-defined]


def test_template_ids() -> None:
    assert {cls.NAME: tid for tid, cls in wire.DECODERS.items()} == {
        "ShmPoolAnnounce": 1,
        "ConsumerHello": 2,
        "ConsumerConfig": 3,
        "FrameDescriptor": 4,
        "QosConsumer": 5,
        "QosProducer": 6,
        "DataSourceAnnounce": 7,
        "DataSourceMeta": 8,
        "ControlResponse": 9,
        "FrameProgress": 11,
        "ShmRegionSuperblock": 50,
        "SlotHeader": 51,
        "TensorHeader": 52,
    }
    assert {cls.NAME: tid for tid, cls in driver.DECODERS.items()} == {
        "ShmAttachRequest": 1,
        "ShmAttachResponse": 2,
        "ShmDetachRequest": 3,
        "ShmDetachResponse": 4,
        "ShmLeaseKeepalive": 5,
        "ShmDriverShutdown": 6,
        "ShmLeaseRevoked": 7,
        "ShmDriverShutdownRequest": 8,
    }
    assert {cls.NAME: tid for tid, cls in bridge.DECODERS.items()} == {"BridgeFrameChunk": 1}


def test_block_lengths_of_control_messages() -> None:
    """Packed sizes (sum of field sizes, no alignment) as sbe-tool computes them."""
    expected = {
        wire.ShmPoolAnnounceDecoder: 35,
        wire.ConsumerHelloDecoder: 39,
        wire.ConsumerConfigDecoder: 18,
        wire.FrameDescriptorDecoder: 36,
        wire.FrameProgressDecoder: 33,
        wire.QosConsumerDecoder: 41,
        wire.QosProducerDecoder: 28,
        wire.DataSourceAnnounceDecoder: 20,
        wire.DataSourceMetaDecoder: 16,
        wire.ControlResponseDecoder: 12,
        driver.ShmAttachRequestDecoder: 24,
        driver.ShmAttachResponseDecoder: 51,
        driver.ShmDetachRequestDecoder: 25,
        driver.ShmDetachResponseDecoder: 12,
        driver.ShmLeaseKeepaliveDecoder: 25,
        driver.ShmDriverShutdownDecoder: 9,
        driver.ShmLeaseRevokedDecoder: 26,
        driver.ShmDriverShutdownRequestDecoder: 9,
        bridge.BridgeFrameChunkDecoder: 41,
    }
    for cls, bl in expected.items():
        assert bl == cls.BLOCK_LENGTH, cls.NAME


def test_s10_1_null_values_exposed() -> None:
    """§10.1: uint32 null 0xFFFFFFFF, uint64 null 0xFFFFFFFFFFFFFFFF."""
    assert wire.FrameDescriptorDecoder.TIMESTAMP_NS_NULL_VALUE == 0xFFFFFFFFFFFFFFFF
    assert wire.FrameDescriptorDecoder.META_VERSION_NULL_VALUE == 0xFFFFFFFF
    assert wire.QosProducerDecoder.WATERMARK_NULL_VALUE == 0xFFFFFFFF
    assert driver.ShmAttachResponseDecoder.HEADER_SLOT_BYTES_NULL_VALUE == 0xFFFF
    assert driver.ShmAttachResponseDecoder.MAX_DIMS_NULL_VALUE == 0xFF
    assert driver.ShmAttachRequestDecoder.PUBLISH_MODE_NULL_VALUE == 0xFF


def test_bridge_s5_1_chunk_offsets_and_limits() -> None:
    d = bridge.BridgeFrameChunkDecoder
    assert (d.STREAM_ID_OFFSET, d.EPOCH_OFFSET, d.SEQ_OFFSET) == (0, 4, 12)
    assert (d.CHUNK_INDEX_OFFSET, d.CHUNK_COUNT_OFFSET, d.CHUNK_OFFSET_OFFSET) == (20, 24, 28)
    assert (d.CHUNK_LENGTH_OFFSET, d.PAYLOAD_LENGTH_OFFSET, d.HEADER_INCLUDED_OFFSET) == (
        32,
        36,
        40,
    )
    assert d.CHUNK_COUNT_MAX_VALUE == 65535
    assert d.PAYLOAD_LENGTH_MAX_VALUE == 1 << 30
    assert d.HEADER_BYTES_MAX_LENGTH == 256
    assert d.PAYLOAD_BYTES_MAX_LENGTH == 1 << 30


def test_s8_3_shm_layout_decoders_read_live_bytes() -> None:
    """§8.3: the consumer re-reads seq_commit after reading the slot; an SHM decoder must
    return the value in memory now, not a copy taken at wrap."""
    slot = bytearray(256)
    slot[60:64] = (192).to_bytes(4, "little")
    dec = wire.SlotHeaderDecoder().wrap_body(slot)
    slot[0:8] = ((5 << 1) | 0).to_bytes(8, "little")  # writer: in progress
    assert dec.seq_commit == 10
    slot[0:8] = ((5 << 1) | 1).to_bytes(8, "little")  # writer: committed
    assert dec.seq_commit == 11
    sb = bytearray(64)
    sdec = wire.ShmRegionSuperblockDecoder().wrap_body(sb)
    sb[56:64] = (123).to_bytes(8, "little")  # producer refreshes activity timestamp
    assert sdec.activity_timestamp_ns == 123


def test_aeron_message_decoders_snapshot_fixed_fields_at_wrap() -> None:
    """Aeron fragments are immutable while handled: fixed fields are unpacked once."""
    buf = bytearray(44)
    wire.FrameDescriptorEncoder.encode(buf, stream_id=1, epoch=2, seq=3, header_index=4)
    dec = wire.FrameDescriptorDecoder().wrap(buf)
    wire.FrameDescriptorEncoder.encode(buf, stream_id=9, epoch=2, seq=4, header_index=5)
    assert dec.seq == 3
    assert dec.wrap(buf).seq == 4
