"""Golden bytes for every message of issue #29 (per-consumer streams and FrameProgress).

How the vectors were derived (never from tensorpool's codec): from the reference schema
``schemas/wire-schema.xml`` of DarrylGamroth/AeronTensorPool.jl at commit 931e047 (the schema
the Julia and C implementations generate their codecs from with ``sbe-tool``), applying the SBE
1.0 rules by hand: an 8-byte message header ``<HHHH`` (blockLength, templateId, schemaId 900,
version 1); the block's fields in schema order, little-endian, packed with no alignment (no
``offset`` attributes in that schema); enums in their ``encodingType`` (``Bool``, ``Mode``,
``FrameProgressState``: uint8); ``epoch_t``/``seq_t`` uint64, ``version_t`` uint32; optional
fields hold their ``nullValue`` when absent; each ``varAsciiEncoding`` is a uint32 length then the
bytes, in schema order after the block. Each expectation below is ``struct.pack`` of every field
in that order, or a literal hex string with the field per line. ``tensorpool/specs/schemas/
wire.xml`` carries the same layouts (whitespace and comments aside); the codec must produce
exactly these bytes, decode them back, and ``tensorpool tap --hex`` must print them decoded.
"""

from __future__ import annotations

import json
import struct

import pytest

from tensorpool.cli import main
from tensorpool.specs import decode_any
from tensorpool.specs.generated import wire

SCHEMA = 900
U32_NULL = 0xFFFFFFFF


def hdr(block_length: int, template_id: int) -> bytes:
    return struct.pack("<HHHH", block_length, template_id, SCHEMA, 1)


def var_ascii(s: str) -> bytes:
    return struct.pack("<I", len(s)) + s.encode("ascii")


def encode(enc: type, **kw: object) -> bytes:
    buf = bytearray(enc.encoded_length(**kw))  # type: ignore[attr-defined]
    n = enc.encode(buf, 0, **kw)  # type: ignore[attr-defined]
    assert n == len(buf)
    return bytes(buf)


def tap_fields(capsys: pytest.CaptureFixture[str], message: bytes) -> dict:
    """What ``tensorpool tap --hex`` prints for ``message`` (Wire names, enums by name)."""
    assert main(["tap", "--hex", message.hex()]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert record["length"] == len(message)
    return record


# ------------------------------------------------------------------ FrameProgress (§10.2.2)
#: FrameProgress, template 11, block 4+8+8+4+8+1 = 33 bytes, 41 with the header.
FRAME_PROGRESS = bytes.fromhex(
    "2100"  # blockLength 33
    "0b00"  # templateId 11
    "8403"  # schemaId 900
    "0100"  # version 1
    "55b50000"  # streamId 46421
    "0900000000000000"  # epoch 9
    "0807060504030201"  # frameId 0x0102030405060708
    "08000000"  # headerIndex 8 (= frameId & (16 - 1))
    "0000400000000000"  # payloadBytesFilled 4 MiB
    "02"  # state PROGRESS
)


@pytest.mark.parametrize("state", list(wire.FrameProgressState))
def test_s10_2_2_frame_progress_golden_every_state(state: wire.FrameProgressState) -> None:
    expected = hdr(33, 11) + struct.pack(
        "<IQQIQB", 46421, 9, 0x0102030405060708, 8, 4 << 20, int(state)
    )
    got = encode(
        wire.FrameProgressEncoder,
        stream_id=46421,
        epoch=9,
        frame_id=0x0102030405060708,
        header_index=8,
        payload_bytes_filled=4 << 20,
        state=state,
    )
    assert got == expected and len(got) == 41
    assert decode_any(expected).to_dict() == {
        "stream_id": 46421,
        "epoch": 9,
        "frame_id": 0x0102030405060708,
        "header_index": 8,
        "payload_bytes_filled": 4 << 20,
        "state": state,
    }


def test_s10_2_2_frame_progress_golden_literal_and_tap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    packed = hdr(33, 11) + struct.pack("<IQQIQB", 46421, 9, 0x0102030405060708, 8, 4 << 20, 2)
    assert packed == FRAME_PROGRESS  # the hex literal and the packed fields agree
    record = tap_fields(capsys, FRAME_PROGRESS)
    assert (record["message"], record["schema_id"], record["template_id"]) == (
        "FrameProgress",
        900,
        11,
    )
    assert record["fields"] == {
        "stream_id": 46421,
        "epoch": 9,
        "frame_id": 0x0102030405060708,
        "header_index": 8,
        "payload_bytes_filled": 4 << 20,
        "state": "PROGRESS",
    }


# ------------------------------------------------------------------ ConsumerHello (§10.1.2)
def _hello_block(**over: int) -> bytes:
    v = {
        "stream_id": 46421,
        "consumer_id": 0x7FFF0001,
        "supports_shm": 1,
        "supports_progress": 1,
        "mode": 2,  # RATE_LIMITED
        "max_rate_hz": 10,
        "expected_layout_version": 1,
        "progress_interval_us": 250,
        "progress_bytes_delta": 65536,
        "progress_major_delta_units": U32_NULL,
        "descriptor_stream_id": 2101,
        "control_stream_id": 2102,
    } | over
    return struct.pack("<IIBBBIIIIIII", *v.values())


def test_s10_1_2_consumer_hello_golden_progress_hints_and_per_consumer_channels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """supportsProgress with two of three hints (the third null) and both channel requests."""
    desc, ctrl = "aeron:ipc?term-length=4m", "aeron:ipc"
    expected = hdr(39, 2) + _hello_block() + var_ascii(desc) + var_ascii(ctrl)
    got = encode(
        wire.ConsumerHelloEncoder,
        stream_id=46421,
        consumer_id=0x7FFF0001,
        supports_shm=wire.Bool.TRUE,
        supports_progress=wire.Bool.TRUE,
        mode=wire.Mode.RATE_LIMITED,
        max_rate_hz=10,
        expected_layout_version=1,
        progress_interval_us=250,
        progress_bytes_delta=65536,
        progress_major_delta_units=None,
        descriptor_stream_id=2101,
        control_stream_id=2102,
        descriptor_channel=desc,
        control_channel=ctrl,
    )
    assert got == expected
    assert len(got) == 8 + 39 + 4 + len(desc) + 4 + len(ctrl)
    fields = tap_fields(capsys, expected)["fields"]
    assert fields["supports_progress"] == "TRUE" and fields["mode"] == "RATE_LIMITED"
    assert (fields["progress_interval_us"], fields["progress_bytes_delta"]) == (250, 65536)
    assert fields["progress_major_delta_units"] is None
    assert (fields["descriptor_channel"], fields["control_channel"]) == (desc, ctrl)


def test_s10_1_2_consumer_hello_golden_what_an_opted_in_tensorpool_consumer_sends() -> None:
    """The hello ``Consumer(progress=ProgressRequest(interval_us=100))`` sends: hints it did
    not give are null, no channel requested (length 0)."""
    expected = (
        hdr(39, 2)
        + _hello_block(
            mode=1,
            max_rate_hz=0,
            expected_layout_version=0,
            progress_interval_us=100,
            progress_bytes_delta=U32_NULL,
            descriptor_stream_id=0,
            control_stream_id=0,
        )
        + var_ascii("")
        + var_ascii("")
    )
    got = encode(
        wire.ConsumerHelloEncoder,
        stream_id=46421,
        consumer_id=0x7FFF0001,
        supports_shm=int(wire.Bool.TRUE),
        supports_progress=int(wire.Bool.TRUE),
        mode=1,
        max_rate_hz=0,
        expected_layout_version=0,
        progress_interval_us=100,
        progress_bytes_delta=None,
        descriptor_stream_id=0,
        control_stream_id=0,
        descriptor_channel="",
        control_channel="",
    )
    assert got == expected


# ------------------------------------------------------------------ ConsumerConfig (§10.1.3)
def test_s10_1_3_consumer_config_golden_assigned_streams(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Field id 5 is unused in the schema: the block is 4+4+1+1+4+4 = 18 bytes, no gap."""
    fallback, desc, ctrl = "", "aeron:ipc?term-length=4m", "aeron:ipc"
    block = struct.pack("<IIBBII", 46421, 0x7FFF0001, 1, 2, 2101, 2102)
    assert len(block) == 18
    expected = hdr(18, 3) + block + var_ascii(fallback) + var_ascii(desc) + var_ascii(ctrl)
    got = encode(
        wire.ConsumerConfigEncoder,
        stream_id=46421,
        consumer_id=0x7FFF0001,
        use_shm=wire.Bool.TRUE,
        mode=wire.Mode.RATE_LIMITED,
        descriptor_stream_id=2101,
        control_stream_id=2102,
        payload_fallback_uri=fallback,
        descriptor_channel=desc,
        control_channel=ctrl,
    )
    assert got == expected
    fields = tap_fields(capsys, expected)["fields"]
    assert fields == {
        "stream_id": 46421,
        "consumer_id": 0x7FFF0001,
        "use_shm": "TRUE",
        "mode": "RATE_LIMITED",
        "descriptor_stream_id": 2101,
        "control_stream_id": 2102,
        "payload_fallback_uri": "",
        "descriptor_channel": desc,
        "control_channel": ctrl,
    }


def test_s10_1_3_consumer_config_golden_decline_is_empty_channels_and_zero_ids() -> None:
    expected = bytes.fromhex(
        "1200"  # blockLength 18
        "0300"  # templateId 3
        "8403"  # schemaId 900
        "0100"  # version 1
        "55b50000"  # streamId 46421
        "0100ff7f"  # consumerId 0x7FFF0001
        "01"  # useShm TRUE
        "01"  # mode STREAM
        "00000000"  # descriptorStreamId 0
        "00000000"  # controlStreamId 0
        "00000000"  # payloadFallbackUri: length 0
        "00000000"  # descriptorChannel: length 0
        "00000000"  # controlChannel: length 0
    )
    got = encode(
        wire.ConsumerConfigEncoder,
        stream_id=46421,
        consumer_id=0x7FFF0001,
        use_shm=int(wire.Bool.TRUE),
        mode=1,
        descriptor_stream_id=0,
        control_stream_id=0,
        payload_fallback_uri="",
        descriptor_channel="",
        control_channel="",
    )
    assert got == expected


# ------------------------------------------------------------------ FrameDescriptor (§10.2.1)
def test_s10_2_1_frame_descriptor_golden_on_a_per_consumer_stream_and_tap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same 44 bytes on a per-consumer stream as on the shared one (§10.1.3 changes the
    stream, never the message); the frame FrameProgress above announced."""
    expected = hdr(36, 4) + struct.pack(
        "<IQQIQI", 46421, 9, 0x0102030405060708, 8, 1_700_000_000_000_000_000, 4
    )
    got = encode(
        wire.FrameDescriptorEncoder,
        stream_id=46421,
        epoch=9,
        seq=0x0102030405060708,
        header_index=8,
        timestamp_ns=1_700_000_000_000_000_000,
        meta_version=4,
    )
    assert got == expected and len(got) == 44
    record = tap_fields(capsys, expected)
    assert record["message"] == "FrameDescriptor"
    assert record["fields"]["seq"] == 0x0102030405060708


# ------------------------------------------------------------------ QoS (§10.4)
def test_s10_4_1_qos_consumer_golden_rate_limited(capsys: pytest.CaptureFixture[str]) -> None:
    """QosConsumer: the per-consumer stream's staleness clock (§10.1.3) and its drops."""
    expected = hdr(41, 5) + struct.pack("<IIQQQQB", 46421, 0x7FFF0001, 9, 1234, 5, 6, 2)
    got = encode(
        wire.QosConsumerEncoder,
        stream_id=46421,
        consumer_id=0x7FFF0001,
        epoch=9,
        last_seq_seen=1234,
        drops_gap=5,
        drops_late=6,
        mode=wire.Mode.RATE_LIMITED,
    )
    assert got == expected and len(got) == 49
    fields = tap_fields(capsys, expected)["fields"]
    assert fields["mode"] == "RATE_LIMITED" and fields["drops_late"] == 6


@pytest.mark.parametrize("watermark", [None, 77])
def test_s10_4_2_qos_producer_golden_watermark_optional(watermark: int | None) -> None:
    expected = hdr(28, 6) + struct.pack(  # block 4+4+8+8+4
        "<IIQQI", 46421, 1, 9, 1235, U32_NULL if watermark is None else watermark
    )
    got = encode(
        wire.QosProducerEncoder,
        stream_id=46421,
        producer_id=1,
        epoch=9,
        current_seq=1235,
        watermark=watermark,
    )
    assert got == expected and len(got) == 36
    assert decode_any(expected).to_dict()["watermark"] == watermark
