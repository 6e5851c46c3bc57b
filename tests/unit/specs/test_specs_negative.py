"""Bad input: every rejection is a CodecError with a stable reason, never an OOB read."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from _specs_model import ALL_MESSAGES, MESSAGE_IDS, codec, encode, sample_values
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpool.specs import (
    BlockLengthTooSmall,
    BufferTooSmall,
    CodecError,
    GroupOverflow,
    NonAscii,
    SchemaIdMismatch,
    TemplateIdMismatch,
    TruncatedBuffer,
    UnknownEnumValue,
    UnsupportedVersion,
    ValueOutOfRange,
    VarDataOverflow,
    decode_any,
    peek_header,
)
from tensorpool.specs.codegen import Message
from tensorpool.specs.generated import bridge, driver, wire

SHORT = (TruncatedBuffer, GroupOverflow, VarDataOverflow)


def _fd_bytes(**over: Any) -> bytearray:
    kw: dict[str, Any] = {"stream_id": 1, "epoch": 2, "seq": 3, "header_index": 4}
    kw.update(over)
    buf = bytearray(44)
    wire.FrameDescriptorEncoder.encode(buf, 0, **kw)
    return buf


def test_reasons_are_stable_names() -> None:
    assert CodecError.reason == "codec_error"
    assert TruncatedBuffer.reason == "truncated"
    assert SchemaIdMismatch.reason == "schema_id_mismatch"
    assert TemplateIdMismatch.reason == "template_id_mismatch"
    assert UnsupportedVersion.reason == "unsupported_version"
    assert BlockLengthTooSmall.reason == "block_length_too_small"
    assert GroupOverflow.reason == "group_overflow"
    assert VarDataOverflow.reason == "var_data_overflow"
    assert UnknownEnumValue.reason == "unknown_enum_value"
    assert NonAscii.reason == "non_ascii"
    assert ValueOutOfRange.reason == "value_out_of_range"
    assert BufferTooSmall.reason == "buffer_too_small"
    assert issubclass(CodecError, ValueError)


# ------------------------------------------------------------------ truncation


@pytest.mark.parametrize(("key", "msg"), ALL_MESSAGES, ids=MESSAGE_IDS)
def test_every_prefix_of_a_valid_message_is_rejected(key: str, msg: Message) -> None:
    """No prefix decodes: wrap checks the whole extent (fixed block, groups, var data)."""
    _, dec_cls = codec(key, msg)
    raw = encode(key, msg, sample_values(msg))
    for cut in range(len(raw)):
        with pytest.raises(SHORT):
            dec_cls().wrap(raw[:cut])
        with pytest.raises(SHORT):
            decode_any(memoryview(raw)[:cut])
    body = raw[8:]
    for cut in range(len(body)):
        with pytest.raises(SHORT):
            dec_cls().wrap_body(body[:cut])
    assert dec_cls().wrap(raw).encoded_length == len(raw)


def test_peek_header_needs_eight_bytes() -> None:
    with pytest.raises(TruncatedBuffer):
        peek_header(b"\x24\x00\x04\x00\x84\x03\x01")
    with pytest.raises(TruncatedBuffer):
        peek_header(bytes(16), -8)
    assert peek_header(bytes(_fd_bytes())) == (36, 4, 900, 1)


def test_negative_offsets_are_rejected_not_wrapped_around() -> None:
    raw = bytes(_fd_bytes())
    with pytest.raises(TruncatedBuffer):
        wire.FrameDescriptorDecoder().wrap(raw, -44)
    with pytest.raises(TruncatedBuffer):
        wire.SlotHeaderDecoder().wrap_body(bytes(256), -256)
    with pytest.raises(BufferTooSmall):
        wire.FrameDescriptorEncoder.encode(
            bytearray(88), -44, stream_id=1, epoch=2, seq=3, header_index=4
        )


# ------------------------------------------------------------------ header checks


def test_driver_s4_4a_wrong_schema_id_rejected() -> None:
    """Driver §4.4a: a schemaId other than the expected schema is rejected."""
    raw = _fd_bytes()
    raw[4:6] = struct.pack("<H", 901)
    with pytest.raises(SchemaIdMismatch):
        wire.FrameDescriptorDecoder().wrap(raw)
    raw[4:6] = struct.pack("<H", 777)
    with pytest.raises(SchemaIdMismatch):
        decode_any(raw)
    with pytest.raises(SchemaIdMismatch):
        wire.FrameDescriptorDecoder.decode_tuple(raw)


def test_driver_s4_4a_wrong_template_id_rejected() -> None:
    raw = _fd_bytes()
    raw[2:4] = struct.pack("<H", 5)
    with pytest.raises(TemplateIdMismatch):
        wire.FrameDescriptorDecoder().wrap(raw)
    raw[2:4] = struct.pack("<H", 99)
    with pytest.raises(TemplateIdMismatch):
        decode_any(raw)
    # driver templateId on a driver decoder for another message
    buf = bytearray(64)
    driver.ShmLeaseKeepaliveEncoder.encode(
        buf, lease_id=1, stream_id=2, client_id=3, role=1, client_timestamp_ns=4
    )
    with pytest.raises(TemplateIdMismatch):
        driver.ShmDetachRequestDecoder().wrap(buf)


def test_driver_s4_4a_newer_schema_version_rejected() -> None:
    """Driver §4.4a: clients MUST reject messages with a schema version higher than ours."""
    raw = _fd_bytes()
    raw[6:8] = struct.pack("<H", 2)
    with pytest.raises(UnsupportedVersion):
        wire.FrameDescriptorDecoder().wrap(raw)
    with pytest.raises(UnsupportedVersion):
        decode_any(raw)
    with pytest.raises(UnsupportedVersion):
        wire.SlotHeaderDecoder().wrap_body(bytes(256), 0, 60, 2)
    buf = bytearray(128)
    n = driver.ShmDetachResponseEncoder.encode(buf, correlation_id=1, code=0, error_message="x")
    buf[6:8] = struct.pack("<H", 2)
    with pytest.raises(UnsupportedVersion):
        driver.ShmDetachResponseDecoder().wrap(buf[:n])
    buf[6:8] = struct.pack("<H", 0)  # an older version is fine
    assert driver.ShmDetachResponseDecoder().wrap(buf[:n]).acting_version == 0


def test_block_length_too_small_rejected() -> None:
    raw = _fd_bytes()
    raw[0:2] = struct.pack("<H", 35)
    with pytest.raises(BlockLengthTooSmall):
        wire.FrameDescriptorDecoder().wrap(raw)
    with pytest.raises(BlockLengthTooSmall):
        wire.SlotHeaderDecoder().wrap_body(bytes(256), 0, 59)


# ------------------------------------------------------------------ groups and var data


def _announce(pools: int = 1) -> bytearray:
    buf = bytearray(1024)
    n = wire.ShmPoolAnnounceEncoder.encode(
        buf,
        stream_id=1,
        producer_id=2,
        epoch=3,
        announce_timestamp_ns=4,
        announce_clock_domain=wire.ClockDomain.MONOTONIC,
        layout_version=1,
        header_nslots=8,
        header_slot_bytes=256,
        payload_pools=[
            {"pool_id": i, "pool_nslots": 8, "stride_bytes": 64, "region_uri": "shm:file?path=/p"}
            for i in range(pools)
        ],
        header_region_uri="shm:file?path=/h",
    )
    return buf[:n]


def test_group_count_past_buffer_rejected() -> None:
    raw = _announce(1)
    raw[8 + 35 + 2 : 8 + 35 + 4] = struct.pack("<H", 60000)  # numInGroup
    with pytest.raises(GroupOverflow):
        wire.ShmPoolAnnounceDecoder().wrap(raw)
    raw[8 + 35 + 2 : 8 + 35 + 4] = struct.pack("<H", 2)  # one more than present
    with pytest.raises(SHORT):
        wire.ShmPoolAnnounceDecoder().wrap(raw)


def test_group_block_length_too_small_rejected() -> None:
    raw = _announce(1)
    raw[8 + 35 : 8 + 35 + 2] = struct.pack("<H", 9)
    with pytest.raises(BlockLengthTooSmall):
        wire.ShmPoolAnnounceDecoder().wrap(raw)


def test_empty_group_with_huge_count_of_zero_block_entries_is_bounded() -> None:
    """DataSourceMeta attributes have no fixed fields: the count alone must be bounded."""
    raw = bytearray(wire.DataSourceMetaEncoder.encoded_length())
    wire.DataSourceMetaEncoder.encode(raw, stream_id=1, meta_version=1, timestamp_ns=1)
    raw[8 + 16 + 2 : 8 + 16 + 4] = struct.pack("<H", 65535)
    with pytest.raises(GroupOverflow):
        wire.DataSourceMetaDecoder().wrap(raw)


def test_var_data_length_past_buffer_rejected() -> None:
    raw = _announce(0)
    # header_region_uri length prefix sits after the (empty) group dimension
    pos = 8 + 35 + 4
    raw[pos : pos + 4] = struct.pack("<I", 1000)
    with pytest.raises(VarDataOverflow):
        wire.ShmPoolAnnounceDecoder().wrap(raw)
    raw = _announce(1)
    pos = 8 + 35 + 4 + 10  # region_uri of the first entry
    raw[pos : pos + 4] = struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(VarDataOverflow):
        wire.ShmPoolAnnounceDecoder().wrap(raw)


def test_s8_3_slot_header_bytes_length_past_slot_rejected() -> None:
    slot = bytearray(256)
    slot[60:64] = struct.pack("<I", 193)
    with pytest.raises(VarDataOverflow):
        wire.SlotHeaderDecoder().wrap_body(slot)
    slot[60:64] = struct.pack("<I", 192)
    assert wire.SlotHeaderDecoder().wrap_body(slot).header_bytes_length == 192


def test_bridge_s5_2_header_bytes_above_256_rejected_both_ways() -> None:
    """varDataEncoding256: headerBytes may not exceed 256 bytes, on decode or encode."""
    kw: dict[str, Any] = dict(
        stream_id=1,
        epoch=2,
        seq=3,
        chunk_index=0,
        chunk_count=1,
        chunk_offset=0,
        chunk_length=4,
        payload_length=4,
        header_included=bridge.Bool.TRUE,
        payload_bytes=b"data",
    )
    with pytest.raises(VarDataOverflow):
        bridge.BridgeFrameChunkEncoder.encode(bytearray(1024), header_bytes=bytes(257), **kw)
    raw = bytearray(1024)
    n = bridge.BridgeFrameChunkEncoder.encode(raw, header_bytes=bytes(256), **kw)
    assert bridge.BridgeFrameChunkDecoder().wrap(raw[:n]).header_bytes_length == 256
    # forge 257 with enough bytes present: still rejected by the composite's maxValue
    forged = raw[: 8 + 41] + struct.pack("<I", 257) + bytes(257) + struct.pack("<I", 0)
    with pytest.raises(VarDataOverflow):
        bridge.BridgeFrameChunkDecoder().wrap(forged)


def test_non_ascii_var_ascii_rejected() -> None:
    buf = bytearray(64)
    n = wire.ControlResponseEncoder.encode(buf, correlation_id=1, code=0, error_message="abc")
    buf[8 + 12 + 4] = 0xC3
    dec = wire.ControlResponseDecoder().wrap(buf[:n])
    with pytest.raises(NonAscii):
        _ = dec.error_message
    with pytest.raises(NonAscii):
        wire.ControlResponseEncoder.encode(
            bytearray(64), correlation_id=1, code=0, error_message="é"
        )
    with pytest.raises(NonAscii):
        wire.ControlResponseEncoder.encode(
            bytearray(64), correlation_id=1, code=0, error_message=b"\xff"
        )


# ------------------------------------------------------------------ enums


def test_s15_8_unknown_enum_value_rejected_not_misread() -> None:
    """§15.8: an unknown dtype MUST cause rejection rather than silent misinterpretation."""
    th = bytearray(192)
    wire.TensorHeaderEncoder.encode(
        th,
        dtype=wire.Dtype.UINT8,
        major_order=wire.MajorOrder.ROW,
        ndims=1,
        pad_align=0,
        progress_unit=wire.ProgressUnit.NONE,
        progress_stride_bytes=0,
        dims=(4,),
    )
    th[8:10] = struct.pack("<h", 12)  # the unused registry number
    dec = wire.TensorHeaderDecoder().wrap(th)
    with pytest.raises(UnknownEnumValue):
        _ = dec.dtype
    assert dec.dtype_raw == 12
    with pytest.raises(UnknownEnumValue):
        dec.to_dict()
    assert dec.major_order is wire.MajorOrder.ROW  # other fields unaffected
    th[10:12] = struct.pack("<h", -1)
    with pytest.raises(UnknownEnumValue):
        _ = dec.major_order


def test_unknown_enum_value_on_encode_rejected() -> None:
    with pytest.raises(UnknownEnumValue):
        wire.TensorHeaderEncoder.encode(
            bytearray(192),
            dtype=12,
            major_order=1,
            ndims=1,
            pad_align=0,
            progress_unit=0,
            progress_stride_bytes=0,
        )
    with pytest.raises(UnknownEnumValue):
        driver.ShmAttachRequestEncoder.encode(
            bytearray(64),
            correlation_id=1,
            stream_id=1,
            client_id=1,
            role=1,
            expected_layout_version=0,
            max_dims=0,
            publish_mode=3,
            require_hugepages=0,
        )
    with pytest.raises(UnknownEnumValue):
        wire.ShmPoolAnnounceEncoder.encode(
            bytearray(64),
            stream_id=1,
            producer_id=2,
            epoch=3,
            announce_timestamp_ns=4,
            announce_clock_domain=0,  # unsynchronised realtime has no value in v1.1
            layout_version=1,
            header_nslots=8,
            header_slot_bytes=256,
        )


def test_group_entry_missing_or_unknown_member_rejected_on_encode() -> None:
    with pytest.raises(ValueOutOfRange):
        wire.ShmPoolAnnounceEncoder.encode(
            bytearray(256),
            stream_id=1,
            producer_id=2,
            epoch=3,
            announce_timestamp_ns=4,
            announce_clock_domain=1,
            layout_version=1,
            header_nslots=8,
            header_slot_bytes=256,
            payload_pools=[{"pool_id": 1, "stride_bytes": 64}],
        )
    with pytest.raises(ValueOutOfRange):
        wire.ShmPoolAnnounceEncoder.encode(
            bytearray(256),
            stream_id=1,
            producer_id=2,
            epoch=3,
            announce_timestamp_ns=4,
            announce_clock_domain=1,
            layout_version=1,
            header_nslots=8,
            header_slot_bytes=256,
            payload_pools=[{"pool_id": 1, "pool_nslots": 1, "stride_bytes": 64, "typo": 1}],
        )


# ------------------------------------------------------------------ encoder limits


def test_encoder_buffer_too_small() -> None:
    with pytest.raises(BufferTooSmall):
        wire.FrameDescriptorEncoder.encode(
            bytearray(43), stream_id=1, epoch=2, seq=3, header_index=4
        )
    with pytest.raises(BufferTooSmall):
        wire.ControlResponseEncoder.encode(
            bytearray(8 + 12 + 4 + 2), correlation_id=1, code=0, error_message="abc"
        )
    small = bytearray(10)
    with pytest.raises(BufferTooSmall):
        wire.ControlResponseEncoder.encode(small, correlation_id=1, code=0, error_message="abc")
    assert small == bytearray(10)  # nothing written, and a bytearray is never grown


def test_encoder_value_out_of_range() -> None:
    with pytest.raises(ValueOutOfRange):
        wire.FrameDescriptorEncoder.encode(
            bytearray(44), stream_id=-1, epoch=2, seq=3, header_index=4
        )
    with pytest.raises(ValueOutOfRange):
        wire.FrameDescriptorEncoder.encode(
            bytearray(44), stream_id=1, epoch=2**64, seq=3, header_index=4
        )
    with pytest.raises(ValueOutOfRange):
        wire.FrameDescriptorEncoder.encode(
            bytearray(44),
            stream_id=None,
            epoch=2,
            seq=3,
            header_index=4,  # type: ignore[arg-type]
        )
    with pytest.raises(ValueOutOfRange):  # more dims than MAX_DIMS
        wire.TensorHeaderEncoder.encode(
            bytearray(192),
            dtype=1,
            major_order=1,
            ndims=1,
            pad_align=0,
            progress_unit=0,
            progress_stride_bytes=0,
            dims=tuple(range(9)),
        )
    with pytest.raises(ValueOutOfRange):  # pad longer than 26 bytes
        wire.SlotHeaderEncoder.encode_body(
            bytearray(256),
            seq_commit=1,
            values_len_bytes=0,
            payload_slot=0,
            pool_id=0,
            payload_offset=0,
            timestamp_ns=0,
            meta_version=0,
            pad=bytes(27),
        )
    with pytest.raises(ValueOutOfRange):
        wire.ControlResponseEncoder.encode(bytearray(64), correlation_id=1, code=0, error_message=5)
    with pytest.raises(ValueOutOfRange):
        wire.SlotHeaderEncoder.encode_body(
            bytearray(256),
            seq_commit=1,
            values_len_bytes=0,
            payload_slot=0,
            pool_id=0,
            payload_offset=0,
            timestamp_ns=0,
            meta_version=0,
            header_bytes="not bytes",
        )


def test_encoder_group_overflow() -> None:
    entries = [(0, 0, 0)] * 65535
    with pytest.raises(GroupOverflow):
        wire.ShmPoolAnnounceEncoder.encoded_length(payload_pools=entries)


def test_s10_1_optional_null_value_cannot_be_smuggled_as_data() -> None:
    """§10.1: the null sentinel means absent; encoding it explicitly decodes as None."""
    raw = _fd_bytes(timestamp_ns=0xFFFFFFFFFFFFFFFF, meta_version=0xFFFFFFFF)
    dec = wire.FrameDescriptorDecoder().wrap(raw)
    assert dec.timestamp_ns is None and dec.meta_version is None
    raw = _fd_bytes(timestamp_ns=0, meta_version=0)
    dec = wire.FrameDescriptorDecoder().wrap(raw)
    assert dec.timestamp_ns == 0 and dec.meta_version == 0


# ------------------------------------------------------------------ fuzz


def _decode_everything(data: bytes) -> None:
    try:
        dec = decode_any(data)
        dec.to_dict()
        dec.raw_tuple()
        _ = dec.encoded_length
    except CodecError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_only_raise_codec_errors(data: bytes) -> None:
    _decode_everything(data)


_TEMPLATES = [(m.SCHEMA_ID, tid) for m in (wire, driver, bridge) for tid in m.DECODERS]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(_TEMPLATES),
    st.integers(0, 80),
    st.integers(0, 2),
    st.binary(max_size=400),
)
def test_fuzz_valid_headers_random_bodies(
    ids: tuple[int, int], block_length: int, version: int, body: bytes
) -> None:
    """Random bodies behind a plausible header reach group and var-data walking."""
    schema_id, template_id = ids
    _decode_everything(struct.pack("<HHHH", block_length, template_id, schema_id, version) + body)


@pytest.mark.parametrize(("key", "msg"), ALL_MESSAGES, ids=MESSAGE_IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fuzz_mutated_valid_messages(key: str, msg: Message, data: st.DataObject) -> None:
    raw = bytearray(encode(key, msg, sample_values(msg)))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    _decode_everything(bytes(raw[:cut]))
    _decode_everything(bytes(raw))


def test_s10_1_1_unsynchronised_clock_domain_has_no_value() -> None:
    """§10.1.1: only MONOTONIC and REALTIME_SYNCED exist; any other byte is rejected."""
    raw = _announce(0)
    raw[8 + wire.ShmPoolAnnounceDecoder.ANNOUNCE_CLOCK_DOMAIN_OFFSET] = 0
    dec = wire.ShmPoolAnnounceDecoder().wrap(raw)
    assert dec.announce_clock_domain_raw == 0
    with pytest.raises(UnknownEnumValue):
        _ = dec.announce_clock_domain
