"""`tensorpool tap`: message formatting and `--hex` decoding with real encoded messages.

No Aeron here: `--hex` must not need it, and the formatter is pure. The live subscription is
tested in ``tests/integration/test_cmd_tap_live.py``.
"""

from __future__ import annotations

import json

import pytest

from tensorpool.cli import main
from tensorpool.commands.tap import jsonable, message_record, parse_hex
from tensorpool.specs.generated import driver, wire
from tensorpool.specs.generated.wire import ClockDomain, FrameDescriptorEncoder

HEADER_URI = "shm:file?path=/dev/shm/tp/tensorpool/p/epoch-3/header.ring"
POOL_URI = "shm:file?path=/dev/shm/tp/tensorpool/p/epoch-3/payload-1.pool"


def frame_descriptor(**overrides: object) -> bytes:
    fields: dict[str, object] = {
        "stream_id": 77,
        "epoch": 3,
        "seq": 123456789012,
        "header_index": 20,
        "timestamp_ns": 987654321,
        "meta_version": None,
    }
    fields.update(overrides)
    buf = bytearray(FrameDescriptorEncoder.encoded_length())
    n = FrameDescriptorEncoder.encode(buf, 0, **fields)  # type: ignore[arg-type]
    return bytes(buf[:n])


def shm_pool_announce() -> bytes:
    buf = bytearray(1024)
    n = wire.ShmPoolAnnounceEncoder.encode(
        buf,
        0,
        stream_id=77,
        producer_id=9,
        epoch=3,
        announce_timestamp_ns=111,
        announce_clock_domain=int(ClockDomain.MONOTONIC),
        layout_version=1,
        header_nslots=64,
        header_slot_bytes=256,
        payload_pools=[(1, 64, 4096, POOL_URI)],
        header_region_uri=HEADER_URI,
    )
    return bytes(buf[:n])


def tap_hex(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    rc = main(["tap", *argv])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = captured.out.splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def tap_fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = main(["tap", *argv])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tensorpool tap: error: ")
    return lines[0]


# --- --hex ---------------------------------------------------------------------------------------
def test_hex_frame_descriptor_fields_match(capsys: pytest.CaptureFixture[str]) -> None:
    record = tap_hex(capsys, "--hex", frame_descriptor().hex())
    assert record["message"] == "FrameDescriptor"
    assert (record["schema_id"], record["template_id"]) == (900, 4)
    assert record["length"] == 44
    assert record["fields"] == {
        "stream_id": 77,
        "epoch": 3,
        "seq": 123456789012,
        "header_index": 20,
        "timestamp_ns": 987654321,
        "meta_version": None,  # the u32 null sentinel prints as null
    }
    assert (record["ts_ns"], record["stream_id"], record["session_id"]) == (None, None, None)


def test_hex_accepts_whitespace_uppercase_and_0x_prefix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    raw = frame_descriptor(seq=5).hex().upper()
    spaced = "0x" + " ".join(raw[i : i + 8] for i in range(0, len(raw), 8))
    assert tap_hex(capsys, "--hex", spaced)["fields"]["seq"] == 5


def test_hex_needs_no_media_driver(capsys: pytest.CaptureFixture[str]) -> None:
    """Aeron options are ignored with --hex: a missing driver directory is no error."""
    record = tap_hex(capsys, "--aeron-dir", "/nonexistent/aeron", "--hex", frame_descriptor().hex())
    assert record["message"] == "FrameDescriptor"


def test_hex_announce_prints_enum_names_groups_and_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = tap_hex(capsys, "--hex", shm_pool_announce().hex())
    assert record["message"] == "ShmPoolAnnounce" and record["template_id"] == 1
    fields = record["fields"]
    assert fields["announce_clock_domain"] == "MONOTONIC"
    assert fields["header_region_uri"] == HEADER_URI
    assert fields["payload_pools"] == [
        {"pool_id": 1, "pool_nslots": 64, "stride_bytes": 4096, "region_uri": POOL_URI}
    ]


def test_hex_bytes_fields_print_as_hex(capsys: pytest.CaptureFixture[str]) -> None:
    buf = bytearray(256)
    n = wire.DataSourceMetaEncoder.encode(
        buf,
        0,
        stream_id=77,
        meta_version=2,
        timestamp_ns=5,
        attributes=[{"key": "gain", "format": "application/octet-stream", "value": b"\x00\xffab"}],
    )
    record = tap_hex(capsys, "--hex", bytes(buf[:n]).hex())
    assert record["fields"]["attributes"] == [
        {"key": "gain", "format": "application/octet-stream", "value": "00ff6162"}
    ]


def test_hex_decodes_driver_schema_messages(capsys: pytest.CaptureFixture[str]) -> None:
    buf = bytearray(256)
    n = driver.ShmLeaseKeepaliveEncoder.encode(
        buf,
        0,
        lease_id=42,
        stream_id=77,
        client_id=5,
        role=driver.Role.PRODUCER,
        client_timestamp_ns=9,
    )
    record = tap_hex(capsys, "--hex", bytes(buf[:n]).hex())
    assert record["schema_id"] == 901 and record["message"] == "ShmLeaseKeepalive"
    assert record["fields"]["lease_id"] == 42 and record["fields"]["role"] == "PRODUCER"


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("zz", "not a hex digit: 'z'"),
        ("abc", "odd number of hex digits"),
        ("", "no bytes given"),
        ("0x", "no bytes given"),
        ("0000", "truncated"),
        ("0000000000000000", "schema_id_mismatch"),
        (frame_descriptor()[:20].hex(), "truncated"),
    ],
)
def test_hex_that_cannot_be_decoded_exits_2(
    capsys: pytest.CaptureFixture[str], text: str, expect: str
) -> None:
    assert expect in tap_fails(capsys, "--hex", text)


def test_s4_4a_hex_newer_schema_version_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    raw = bytearray(frame_descriptor())
    raw[6] = 2  # message header version: newer than ours
    assert "unsupported_version" in tap_fails(capsys, "--hex", raw.hex())


# --- the record for undecodable messages ---------------------------------------------------------
def test_undecodable_record_has_reason_ids_and_a_64_byte_preview() -> None:
    raw = bytes([0x24, 0, 99, 0, 0x84, 0x03, 1, 0]) + bytes(range(100))  # schema 900, template 99
    record = message_record(raw, ts_ns=7, stream_id=1000, session_id=-5)
    assert record["error"] == "template_id_mismatch"
    assert (record["schema_id"], record["template_id"]) == (900, 99)
    assert record["hex"] == raw[:64].hex()
    assert (record["ts_ns"], record["stream_id"], record["session_id"]) == (7, 1000, -5)
    assert record["length"] == 108
    assert "message" not in record and "fields" not in record
    json.dumps(record)  # printable as is


def test_s15_8_unknown_enum_value_is_an_error_record_not_a_guess() -> None:
    raw = bytearray(shm_pool_announce())
    raw[8 + 24] = 9  # announce_clock_domain: no such ClockDomain
    record = message_record(raw, ts_ns=1, stream_id=1000, session_id=1)
    assert record["error"] == "unknown_enum_value"
    assert record["template_id"] == 1


def test_short_buffer_has_no_ids() -> None:
    record = message_record(b"\x01\x02\x03", ts_ns=1, stream_id=1000, session_id=1)
    assert record["error"] == "truncated" and record["hex"] == "010203"
    assert "schema_id" not in record


def test_record_takes_any_buffer_and_keeps_no_view_of_it() -> None:
    raw = bytearray(frame_descriptor(seq=9))
    record = message_record(memoryview(raw), ts_ns=1, stream_id=1100, session_id=3)
    raw[:] = bytes(len(raw))  # the Aeron buffer is reused after the handler returns
    assert record["fields"]["seq"] == 9
    assert json.loads(json.dumps(record)) == record


def test_jsonable_maps_enums_bytes_and_tuples() -> None:
    assert jsonable(
        {"a": ClockDomain.REALTIME_SYNCED, "b": b"\x01\x02", "c": (1, [b"", None])}
    ) == {
        "a": "REALTIME_SYNCED",
        "b": "0102",
        "c": [1, ["", None]],
    }


def test_parse_hex() -> None:
    assert parse_hex(" 0xDE ad\nbe EF ") == b"\xde\xad\xbe\xef"
    with pytest.raises(ValueError, match="odd number"):
        parse_hex("abc")


# --- option errors before any Aeron work ---------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--count", "0"], "--count"),
        (["--duration", "0"], "--duration"),
        (["--duration", "-1"], "--duration"),
        (["--channel", "udp://host:1"], "--channel"),
        (["--stream-id", str(2**31)], "--stream-id"),
        (["--aeron-dir", "/nonexistent/aeron"], "no running media driver"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], expect: str
) -> None:
    assert expect in tap_fails(capsys, *argv)


# --- #14.2: the shutdown token is never printed ---------------------------------------------------
TOKEN = "s3cret-shutdown-token"


def shutdown_request(token: str | None = TOKEN) -> bytes:
    buf = bytearray(512)
    n = driver.ShmDriverShutdownRequestEncoder.encode(
        buf,
        0,
        correlation_id=5,
        reason=driver.ShutdownReason.ADMIN,
        token=token,
        error_message="maintenance",
    )
    return bytes(buf[:n])


def test_shutdown_request_token_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    """#14.2: a tap (live or --hex) prints that a token was sent, never the token itself, so
    its output and logs cannot be replayed as a shutdown request; the other fields stay."""
    raw = shutdown_request()
    record = tap_hex(capsys, "--hex", raw.hex())
    assert record["message"] == "ShmDriverShutdownRequest"
    assert record["fields"]["token"] == "<redacted>"
    assert record["fields"]["correlation_id"] == 5
    assert record["fields"]["error_message"] == "maintenance"
    live = message_record(raw, ts_ns=1, stream_id=1000, session_id=1)
    assert live["fields"] == record["fields"]
    for text in (json.dumps(record), json.dumps(live)):
        assert TOKEN not in text and TOKEN.encode().hex() not in text


def test_shutdown_request_without_token_prints_empty() -> None:
    record = message_record(shutdown_request(None), ts_ns=1, stream_id=1000, session_id=1)
    assert record["fields"]["token"] == ""


def test_undecodable_shutdown_request_preview_stops_before_the_token() -> None:
    """#14.2: the hex preview of a shutdown request that fails to decode (here: truncated
    inside its error message) shows its header and fixed block only, not the token bytes."""
    raw = shutdown_request()[:-3]
    record = message_record(raw, ts_ns=1, stream_id=1000, session_id=1)
    assert "error" in record and "fields" not in record
    assert TOKEN.encode().hex() not in record["hex"]
    assert record["hex"] == raw[:17].hex()
