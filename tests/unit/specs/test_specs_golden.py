"""Golden bytes: expected encodings written by hand from the schema, never by the codec.

Each expectation is a literal hex string or ``struct.pack`` of every field in layout
order (little-endian, no alignment), so it states what ``sbe-tool`` would put on the
wire for the same schema. The codec must produce exactly these bytes and decode
them back to the same values.
"""

from __future__ import annotations

import struct

from tensorpool.specs import decode_any
from tensorpool.specs.generated import bridge, driver, wire


def hdr(block_length: int, template_id: int, schema_id: int, version: int = 1) -> bytes:
    return struct.pack("<HHHH", block_length, template_id, schema_id, version)


def u32_str(s: str | bytes) -> bytes:
    b = s.encode("ascii") if isinstance(s, str) else s
    return struct.pack("<I", len(b)) + b


def encode(enc: type, **kw: object) -> bytes:
    buf = bytearray(enc.encoded_length(**kw))  # type: ignore[attr-defined]
    n = enc.encode(buf, 0, **kw)  # type: ignore[attr-defined]
    assert n == len(buf)
    return bytes(buf)


# ------------------------------------------------------------------ FrameDescriptor


def test_s10_2_1_frame_descriptor_golden_all_fields() -> None:
    expected = bytes.fromhex(
        "24000400"
        "84030100"  # blockLength 36, templateId 4, schemaId 900, version 1
        "11270000"  # streamId 10001
        "0700000000000000"  # epoch 7
        "0807060504030201"  # seq 0x0102030405060708
        "05000000"  # headerIndex 5
        "00f0eb7e8dc1ec17"  # timestampNs 0x17ECC18D7EEBF000
        "03000000"  # metaVersion 3
    )
    got = encode(
        wire.FrameDescriptorEncoder,
        stream_id=10001,
        epoch=7,
        seq=0x0102030405060708,
        header_index=5,
        timestamp_ns=0x17ECC18D7EEBF000,
        meta_version=3,
    )
    assert got == expected
    assert len(got) == 44
    dec = wire.FrameDescriptorDecoder().wrap(expected)
    assert dec.to_dict() == {
        "stream_id": 10001,
        "epoch": 7,
        "seq": 0x0102030405060708,
        "header_index": 5,
        "timestamp_ns": 0x17ECC18D7EEBF000,
        "meta_version": 3,
    }
    assert dec.encoded_length == 44


def test_s10_1_null_sentinels_frame_descriptor_optionals_absent() -> None:
    """§10.1: absent optional u64/u32 are encoded as all-ones and decoded as None."""
    expected = bytes.fromhex(
        "2400040084030100"
        "11270000"
        "0700000000000000"
        "0807060504030201"
        "05000000"
        "ffffffffffffffff"  # timestampNs null
        "ffffffff"  # metaVersion null
    )
    got = encode(
        wire.FrameDescriptorEncoder,
        stream_id=10001,
        epoch=7,
        seq=0x0102030405060708,
        header_index=5,
    )
    assert got == expected
    dec = wire.FrameDescriptorDecoder().wrap(expected)
    assert dec.timestamp_ns is None
    assert dec.meta_version is None
    assert wire.FrameDescriptorDecoder.decode_tuple(expected) == (
        10001,
        7,
        0x0102030405060708,
        5,
        0xFFFFFFFFFFFFFFFF,
        0xFFFFFFFF,
    )


# ------------------------------------------------------------------ ShmPoolAnnounce

POOL_A = "shm:file?path=/dev/shm/tp/pool1"
POOL_B = "shm:file?path=/dev/shm/tp/pool2"
HEADER_URI = "shm:file?path=/dev/shm/tp/header"


def shm_pool_announce_bytes() -> bytes:
    block = struct.pack(
        "<IIQQBIIH",
        42,  # streamId
        7,  # producerId
        3,  # epoch
        123_456_789,  # announceTimestampNs
        1,  # announceClockDomain MONOTONIC
        1,  # layoutVersion
        1024,  # headerNslots
        256,  # headerSlotBytes
    )
    assert len(block) == 35
    group = struct.pack("<HH", 10, 2)  # entry blockLength 10, two entries
    group += struct.pack("<HII", 1, 1024, 1 << 20) + u32_str(POOL_A)
    group += struct.pack("<HII", 2, 1024, 16 << 20) + u32_str(POOL_B)
    return hdr(35, 1, 900) + block + group + u32_str(HEADER_URI)


def test_s10_1_1_shm_pool_announce_golden_two_pools() -> None:
    expected = shm_pool_announce_bytes()
    got = encode(
        wire.ShmPoolAnnounceEncoder,
        stream_id=42,
        producer_id=7,
        epoch=3,
        announce_timestamp_ns=123_456_789,
        announce_clock_domain=wire.ClockDomain.MONOTONIC,
        layout_version=1,
        header_nslots=1024,
        header_slot_bytes=256,
        payload_pools=[
            {"pool_id": 1, "pool_nslots": 1024, "stride_bytes": 1 << 20, "region_uri": POOL_A},
            (2, 1024, 16 << 20, POOL_B),  # tuple form: fields then data, schema order
        ],
        header_region_uri=HEADER_URI,
    )
    assert got == expected
    dec = decode_any(expected)
    assert isinstance(dec, wire.ShmPoolAnnounceDecoder)
    # var data after the group is readable before the group is touched
    assert dec.header_region_uri == HEADER_URI
    pools = list(dec.payload_pools)
    assert [(p.pool_id, p.pool_nslots, p.stride_bytes, p.region_uri) for p in pools] == [
        (1, 1024, 1 << 20, POOL_A),
        (2, 1024, 16 << 20, POOL_B),
    ]
    assert dec.payload_pools[1].region_uri == POOL_B  # random access, reverse order
    assert dec.announce_clock_domain is wire.ClockDomain.MONOTONIC
    assert dec.encoded_length == len(expected)


# ------------------------------------------------------------------ ConsumerHello


def test_s10_1_2_consumer_hello_golden_empty_channels() -> None:
    """§10.1: empty var data is a bare zero length; the optionals carry sentinels."""
    block = struct.pack(
        "<IIBBBIIIIIII",
        5,  # streamId
        99,  # consumerId
        1,  # supportsShm TRUE
        0,  # supportsProgress FALSE
        2,  # mode RATE_LIMITED
        30,  # maxRateHz
        1,  # expectedLayoutVersion
        250,  # progressIntervalUs
        0xFFFFFFFF,  # progressBytesDelta null
        0xFFFFFFFF,  # progressMajorDeltaUnits null
        0,  # descriptorStreamId
        0,  # controlStreamId
    )
    assert len(block) == 39
    expected = hdr(39, 2, 900) + block + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
    got = encode(
        wire.ConsumerHelloEncoder,
        stream_id=5,
        consumer_id=99,
        supports_shm=wire.Bool.TRUE,
        supports_progress=wire.Bool.FALSE,
        mode=wire.Mode.RATE_LIMITED,
        max_rate_hz=30,
        expected_layout_version=1,
        progress_interval_us=250,
        descriptor_stream_id=0,
        control_stream_id=0,
        descriptor_channel="",
    )  # control_channel omitted: also length 0
    assert got == expected
    dec = wire.ConsumerHelloDecoder().wrap(expected)
    assert dec.descriptor_channel == ""
    assert dec.control_channel == ""
    assert dec.progress_interval_us == 250
    assert dec.progress_bytes_delta is None
    assert dec.progress_major_delta_units is None
    assert dec.mode is wire.Mode.RATE_LIMITED


# ------------------------------------------------------------------ DataSourceMeta


def test_s10_3_2_data_source_meta_golden_two_attributes() -> None:
    block = struct.pack("<IIQ", 11, 4, 1_000_000)
    group = struct.pack("<HH", 0, 2)  # no fixed fields in an attribute entry
    group += u32_str("camera_serial") + u32_str("text/plain") + u32_str(b"SN-0042")
    group += u32_str("intrinsics") + u32_str("application/msgpack") + u32_str(b"\x93\x01\x02\xff")
    expected = hdr(16, 8, 900) + block + group
    got = encode(
        wire.DataSourceMetaEncoder,
        stream_id=11,
        meta_version=4,
        timestamp_ns=1_000_000,
        attributes=[
            {"key": "camera_serial", "format": "text/plain", "value": b"SN-0042"},
            {"key": "intrinsics", "format": "application/msgpack", "value": b"\x93\x01\x02\xff"},
        ],
    )
    assert got == expected
    dec = wire.DataSourceMetaDecoder().wrap(expected)
    attrs = [(a.key, a.format, a.value) for a in dec.attributes]
    assert attrs == [
        ("camera_serial", "text/plain", b"SN-0042"),
        ("intrinsics", "application/msgpack", b"\x93\x01\x02\xff"),
    ]
    assert dec.encoded_length == len(expected)


# ------------------------------------------------------------------ ShmAttachResponse


def test_driver_shm_attach_response_golden_ok_form() -> None:
    """Driver §4.2: on OK all optional fields are present, pools and URI follow."""
    block = struct.pack(
        "<qiQQIQIIHB",
        77,  # correlationId
        0,  # code OK
        9001,  # leaseId
        5_000_000_000,  # leaseExpiryTimestampNs
        42,  # streamId
        3,  # epoch
        1,  # layoutVersion
        1024,  # headerNslots
        256,  # headerSlotBytes
        8,  # maxDims
    )
    assert len(block) == 51
    group = struct.pack("<HH", 10, 2)
    group += struct.pack("<HII", 1, 1024, 1 << 20) + u32_str(POOL_A)
    group += struct.pack("<HII", 2, 1024, 16 << 20) + u32_str(POOL_B)
    expected = hdr(51, 2, 901) + block + group + u32_str(HEADER_URI) + u32_str("")
    got = encode(
        driver.ShmAttachResponseEncoder,
        correlation_id=77,
        code=driver.ResponseCode.OK,
        lease_id=9001,
        lease_expiry_timestamp_ns=5_000_000_000,
        stream_id=42,
        epoch=3,
        layout_version=1,
        header_nslots=1024,
        header_slot_bytes=256,
        max_dims=8,
        payload_pools=[
            {"pool_id": 1, "pool_nslots": 1024, "stride_bytes": 1 << 20, "region_uri": POOL_A},
            {"pool_id": 2, "pool_nslots": 1024, "stride_bytes": 16 << 20, "region_uri": POOL_B},
        ],
        header_region_uri=HEADER_URI,
    )
    assert got == expected
    dec = decode_any(expected)
    assert isinstance(dec, driver.ShmAttachResponseDecoder)
    assert dec.code is driver.ResponseCode.OK
    assert (dec.lease_id, dec.header_slot_bytes, dec.max_dims) == (9001, 256, 8)
    assert [p.region_uri for p in dec.payload_pools] == [POOL_A, POOL_B]
    assert dec.error_message == ""


def test_driver_shm_attach_response_golden_error_form() -> None:
    """Driver §4.2/§4.6: on error the optionals are null and errorMessage explains."""
    block = struct.pack(
        "<qiQQIQIIHB",
        78,
        3,  # REJECTED
        0xFFFFFFFFFFFFFFFF,
        0xFFFFFFFFFFFFFFFF,
        0xFFFFFFFF,
        0xFFFFFFFFFFFFFFFF,
        0xFFFFFFFF,
        0xFFFFFFFF,
        0xFFFF,
        0xFF,
    )
    message = "exclusive producer already attached"
    expected = hdr(51, 2, 901) + block + struct.pack("<HH", 10, 0) + u32_str("") + u32_str(message)
    got = encode(
        driver.ShmAttachResponseEncoder,
        correlation_id=78,
        code=driver.ResponseCode.REJECTED,
        error_message=message,
    )
    assert got == expected
    d = driver.ShmAttachResponseDecoder().wrap(expected).to_dict()
    assert d == {
        "correlation_id": 78,
        "code": driver.ResponseCode.REJECTED,
        "lease_id": None,
        "lease_expiry_timestamp_ns": None,
        "stream_id": None,
        "epoch": None,
        "layout_version": None,
        "header_nslots": None,
        "header_slot_bytes": None,
        "max_dims": None,
        "payload_pools": [],
        "header_region_uri": "",
        "error_message": message,
    }


def test_driver_shm_attach_request_golden_optional_enum_null() -> None:
    """publishMode is an optional enum whose null sentinel is 255."""
    expected = hdr(24, 1, 901) + struct.pack("<qIIBIBBB", 5, 42, 7, 1, 0, 0, 255, 0)
    got = encode(
        driver.ShmAttachRequestEncoder,
        correlation_id=5,
        stream_id=42,
        client_id=7,
        role=driver.Role.PRODUCER,
        expected_layout_version=0,
        max_dims=0,
        require_hugepages=driver.HugepagesPolicy.UNSPECIFIED,
    )
    assert got == expected
    assert driver.ShmAttachRequestDecoder().wrap(expected).publish_mode is None


# ------------------------------------------------------------------ BridgeFrameChunk


def _chunk_block(index: int, header_included: int, chunk_len: int) -> bytes:
    return struct.pack(
        "<IQQIIIIIB",
        42,  # streamId
        3,  # epoch
        1000,  # seq
        index,  # chunkIndex
        2,  # chunkCount
        0 if index == 0 else 1400,  # chunkOffset
        chunk_len,  # chunkLength
        2000,  # payloadLength
        header_included,
    )


def test_bridge_s5_1_frame_chunk_golden_with_header() -> None:
    slot = bytes(range(256))
    payload = bytes(i % 251 for i in range(1400))
    expected = hdr(41, 1, 902) + _chunk_block(0, 1, 1400) + u32_str(slot) + u32_str(payload)
    got = encode(
        bridge.BridgeFrameChunkEncoder,
        stream_id=42,
        epoch=3,
        seq=1000,
        chunk_index=0,
        chunk_count=2,
        chunk_offset=0,
        chunk_length=1400,
        payload_length=2000,
        header_included=bridge.Bool.TRUE,
        header_bytes=slot,
        payload_bytes=payload,
    )
    assert got == expected
    dec = decode_any(expected)
    assert isinstance(dec, bridge.BridgeFrameChunkDecoder)
    assert dec.header_bytes == slot
    assert dec.payload_bytes == payload
    assert dec.payload_bytes_offset == 8 + 41 + 4 + 256 + 4
    assert dec.header_included is bridge.Bool.TRUE


def test_bridge_s5_1_frame_chunk_golden_without_header() -> None:
    payload = b"\xab" * 600
    expected = hdr(41, 1, 902) + _chunk_block(1, 0, 600) + u32_str(b"") + u32_str(payload)
    got = encode(
        bridge.BridgeFrameChunkEncoder,
        stream_id=42,
        epoch=3,
        seq=1000,
        chunk_index=1,
        chunk_count=2,
        chunk_offset=1400,
        chunk_length=600,
        payload_length=2000,
        header_included=bridge.Bool.FALSE,
        payload_bytes=memoryview(payload),
    )
    assert got == expected
    dec = bridge.BridgeFrameChunkDecoder().wrap(expected)
    assert dec.header_bytes == b""
    assert dec.header_bytes_length == 0
    assert dec.payload_bytes == payload


# ------------------------------------------------------------------ SlotHeader + TensorHeader


def tensor_header_bytes() -> bytes:
    block = struct.pack(
        "<hhBBBI8i8i",
        9,  # dtype FLOAT32
        1,  # majorOrder ROW
        2,  # ndims
        # maxDims is a constant: no bytes
        0,  # padAlign
        1,  # progressUnit ROWS
        2560,  # progressStrideBytes
        480, 640, 0, 0, 0, 0, 0, 0,  # dims
        2560, 4, 0, 0, 0, 0, 0, 0,  # strides
    )  # fmt: skip
    assert len(block) == 75
    return hdr(184, 52, 900) + block + bytes(109)


def test_s8_2_slot_header_with_embedded_tensor_header_is_256_bytes() -> None:
    """§8.1/§8.2: a header slot is 60-byte prefix + 4-byte length + 192-byte TensorHeader."""
    th = tensor_header_bytes()
    assert len(th) == 192
    prefix = struct.pack(
        "<QIIHIQI26s",
        (17 << 1) | 1,  # seqCommit: logical sequence 17, committed
        1_228_800,  # valuesLenBytes
        5,  # payloadSlot
        1,  # poolId
        0,  # payloadOffset
        999,  # timestampNs
        2,  # metaVersion
        b"",  # pad: zero-filled
    )
    assert len(prefix) == 60
    expected = prefix + struct.pack("<I", 192) + th
    assert len(expected) == 256

    slot = bytearray(256)
    n = wire.TensorHeaderEncoder.encode(
        slot,
        64,  # the embedded TensorHeader is written in place after the length prefix
        dtype=wire.Dtype.FLOAT32,
        major_order=wire.MajorOrder.ROW,
        ndims=2,
        pad_align=0,
        progress_unit=wire.ProgressUnit.ROWS,
        progress_stride_bytes=2560,
        dims=(480, 640),
        strides=(2560, 4),
    )
    assert n == 192
    encoded = bytearray(256)
    written = wire.SlotHeaderEncoder.encode_body(
        encoded,
        0,
        seq_commit=(17 << 1) | 1,
        values_len_bytes=1_228_800,
        payload_slot=5,
        pool_id=1,
        payload_offset=0,
        timestamp_ns=999,
        meta_version=2,
        header_bytes=slot[64:],
    )
    assert written == 256
    assert bytes(encoded) == expected

    sh = wire.SlotHeaderDecoder().wrap_body(expected)
    assert sh.encoded_length == 256
    assert sh.seq_commit >> 1 == 17
    assert sh.header_bytes_offset == 64
    assert sh.header_bytes_length == 192
    th_dec = wire.TensorHeaderDecoder().wrap(expected, sh.header_bytes_offset)
    assert th_dec.dtype is wire.Dtype.FLOAT32
    assert th_dec.ndims == 2
    assert th_dec.max_dims == wire.MAX_DIMS_CONST == 8
    assert th_dec.dims == (480, 640, 0, 0, 0, 0, 0, 0)
    assert th_dec.strides == (2560, 4, 0, 0, 0, 0, 0, 0)
    assert th_dec.encoded_length == 192


def test_s7_1_superblock_golden_64_bytes() -> None:
    """§6/§7.1: the superblock is a 64-byte header-less body in the documented order."""
    expected = struct.pack(
        "<QIQIhHIIIQQQ",
        0x544F504C53484D31,  # magic
        1,  # layoutVersion
        3,  # epoch
        42,  # streamId
        2,  # regionType PAYLOAD_POOL
        1,  # poolId
        1024,  # nslots
        1 << 20,  # slotBytes
        1 << 20,  # strideBytes
        4242,  # pid
        100,  # startTimestampNs
        200,  # activityTimestampNs
    )
    assert len(expected) == 64
    buf = bytearray(64)
    n = wire.ShmRegionSuperblockEncoder.encode_body(
        buf,
        magic=0x544F504C53484D31,
        layout_version=1,
        epoch=3,
        stream_id=42,
        region_type=wire.RegionType.PAYLOAD_POOL,
        pool_id=1,
        nslots=1024,
        slot_bytes=1 << 20,
        stride_bytes=1 << 20,
        pid=4242,
        start_timestamp_ns=100,
        activity_timestamp_ns=200,
    )
    assert n == 64
    assert bytes(buf) == expected
    dec = wire.ShmRegionSuperblockDecoder().wrap_body(expected)
    assert dec.region_type is wire.RegionType.PAYLOAD_POOL
    assert dec.activity_timestamp_ns == 200
    assert dec.encoded_length == 64
