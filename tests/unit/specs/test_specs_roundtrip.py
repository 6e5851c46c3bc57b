"""Round trips over every message of every schema, with values drawn from the schema.

encode(values) → decode → to_dict() must equal values; decode → encode must reproduce
the bytes exactly (also for the header-less ``encode_body``/``wrap_body`` variant).
"""

from __future__ import annotations

import mmap
from typing import Any

import pytest
from _specs_model import (
    ALL_MESSAGES,
    MESSAGE_IDS,
    codec,
    encode,
    expected_dict,
    message_strategy,
    sample_values,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpool.specs import decode_any, peek_header
from tensorpool.specs.codegen import Message

SETTINGS = settings(max_examples=60, deadline=None)


def _expected(msg: Message, values: dict[str, Any]) -> dict[str, Any]:
    return expected_dict(values, msg.fields, msg.groups, msg.data)


@pytest.mark.parametrize(("key", "msg"), ALL_MESSAGES, ids=MESSAGE_IDS)
@SETTINGS
@given(data=st.data())
def test_roundtrip_every_message(key: str, msg: Message, data: st.DataObject) -> None:
    values = data.draw(message_strategy(msg))
    enc, dec_cls = codec(key, msg)
    raw = encode(key, msg, values)

    dec = decode_any(raw)
    assert type(dec) is dec_cls
    assert dec.to_dict() == _expected(msg, values)
    assert dec.encoded_length == len(raw)
    assert peek_header(raw) == (msg.block_length, msg.id, dec_cls.SCHEMA_ID, 1)

    # decode -> encode reproduces the bytes
    again = bytearray(len(raw))
    assert enc.encode(again, 0, **dec.to_dict()) == len(raw)
    assert bytes(again) == raw

    # header-less body: same block and var data without the 8-byte header
    body = encode(key, msg, values, body=True)
    assert body == raw[8:]
    bdec = dec_cls().wrap_body(body)
    assert bdec.to_dict() == _expected(msg, values)
    assert bdec.encoded_length == len(body)


@pytest.mark.parametrize(("key", "msg"), ALL_MESSAGES, ids=MESSAGE_IDS)
def test_roundtrip_at_offset_in_memoryview_and_mmap(key: str, msg: Message) -> None:
    """Decoders work over any buffer type at any offset (SHM uses mmap)."""
    values = sample_values(msg)
    enc, dec_cls = codec(key, msg)
    raw = encode(key, msg, values)
    want = _expected(msg, values)

    with mmap.mmap(-1, len(raw) + 13) as mm:
        assert enc.encode(mm, 13, **values) == len(raw)
        dec = dec_cls().wrap(mm, 13)
        assert dec.to_dict() == want
        assert dec.encoded_length == len(raw)
        del dec  # decoders hold no exported buffer: the mmap can close

    words = bytearray(len(raw) + 3 + (-(len(raw) + 3)) % 4)
    words[3 : 3 + len(raw)] = raw
    mv = memoryview(words).cast("I")  # len() counts items; decoders must count bytes
    assert dec_cls().wrap(mv, 3).to_dict() == want
    assert dec_cls(memoryview(words), 3).to_dict() == want

    out = bytearray(len(words))
    assert enc.encode(memoryview(out).cast("I"), 3, **values) == len(raw)
    assert bytes(out[3 : 3 + len(raw)]) == raw


@pytest.mark.parametrize(("key", "msg"), ALL_MESSAGES, ids=MESSAGE_IDS)
def test_raw_tuple_matches_properties(key: str, msg: Message) -> None:
    values = sample_values(msg)
    _, dec_cls = codec(key, msg)
    raw = encode(key, msg, values)
    dec = dec_cls().wrap(raw)
    flat: list[Any] = []
    for f in msg.fields:
        if f.kind == "constant":
            continue
        v = getattr(dec, f.snake + ("_raw" if f.kind == "enum" else ""))
        if v is None:
            v = f.null_value
        if f.kind == "array" and not f.bytes_array:
            flat.extend(v)
        else:
            flat.append(v)
    assert list(dec.raw_tuple()) == flat
    assert list(dec_cls.decode_tuple(raw)) == flat


def test_larger_acting_block_length_is_skipped_correctly() -> None:
    """An acting blockLength larger than ours (same version) must not shift var data."""
    from tensorpool.specs.generated import wire

    buf = bytearray(200)
    n = wire.ControlResponseEncoder.encode(
        buf, 0, correlation_id=1, code=wire.ResponseCode.OK, error_message="hello"
    )
    raw = bytes(buf[:n])
    # rebuild with 4 extra (unknown) block bytes: blockLength 16 instead of 12
    wider = bytearray(raw[:8] + raw[8:20] + b"\xee" * 4 + raw[20:])
    wider[0:2] = (16).to_bytes(2, "little")
    dec = wire.ControlResponseDecoder().wrap(bytes(wider))
    assert dec.error_message == "hello"
    assert dec.acting_block_length == 16
    assert dec.encoded_length == n + 4


def test_group_entries_with_larger_acting_block_length() -> None:
    from tensorpool.specs.generated import wire

    pool = {"pool_id": 3, "pool_nslots": 8, "stride_bytes": 64, "region_uri": "shm:file?path=/x"}
    buf = bytearray(300)
    n = wire.ShmPoolAnnounceEncoder.encode(
        buf,
        0,
        stream_id=1,
        producer_id=2,
        epoch=3,
        announce_timestamp_ns=4,
        announce_clock_domain=1,
        layout_version=1,
        header_nslots=8,
        header_slot_bytes=256,
        payload_pools=[pool],
        header_region_uri="h",
    )
    raw = bytes(buf[:n])
    g = 8 + 35  # group dimension position
    entry = raw[g + 4 : g + 4 + 10]
    wider = raw[:g] + (12).to_bytes(2, "little") + raw[g + 2 : g + 4] + entry + b"\0\0"
    wider += raw[g + 14 :]
    dec = wire.ShmPoolAnnounceDecoder().wrap(wider)
    assert [e.to_dict() for e in dec.payload_pools] == [pool]
    assert dec.header_region_uri == "h"
