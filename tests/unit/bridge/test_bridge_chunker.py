"""The chunker (Bridge Spec §5.1, §5.2): spans, sizes and byte-exact encoding."""

from __future__ import annotations

import pytest
from bridge_helpers import header_slot, u8_layout
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpool.bridge.chunker import NO_HEADER_OVERHEAD, WITH_HEADER_OVERHEAD, Chunker
from tensorpool.specs.generated.bridge import (
    BridgeFrameChunkDecoder,
    BridgeFrameChunkEncoder,
)


@settings(max_examples=200, deadline=None)
@given(length=st.integers(0, 100_000), chunk=st.integers(64, 9000))
def test_s5_2_spans_tile_the_payload_in_order(length: int, chunk: int) -> None:
    """chunkCount >= 1, indices 0..n-1 in order, offset 0 first, non-overlapping, sum == L."""
    ch = Chunker(chunk)
    spans = list(ch.spans(length))
    assert len(spans) == ch.count(length) >= 1
    assert [i for i, _, _ in spans] == list(range(len(spans)))
    assert spans[0][1] == 0
    pos = 0
    for _, off, n in spans:
        assert off == pos and 0 <= n <= chunk
        pos += n
    assert pos == length
    assert all(n > 0 for _, _, n in spans) or length == 0


def test_s5_2_empty_payload_is_one_empty_chunk() -> None:
    assert list(Chunker(1280).spans(0)) == [(0, 0, 0)]


def test_s5_2_exactly_one_chunk_and_one_more_byte() -> None:
    ch = Chunker(1280)
    assert list(ch.spans(1280)) == [(0, 0, 1280)]
    assert list(ch.spans(1281)) == [(0, 0, 1280), (1, 1280, 1)]


def test_s5_1_encoding_is_byte_identical_to_the_generated_codec() -> None:
    """Every chunk the fast encoder writes equals the generated encoder's output and decodes
    back to the same fields (schema 902, template 1)."""
    ch = Chunker(100)
    payload = bytes(range(256)) * 2
    hdr = header_slot(5, u8_layout(len(payload)), len(payload))
    msgs = ch.encode_frame(stream_id=10000, epoch=3, seq=5, header=hdr, payload=payload)
    assert len(msgs) == 6
    for i, msg in enumerate(msgs):
        off = i * 100
        part = payload[off : off + 100]
        ref = bytearray(len(msg))
        n = BridgeFrameChunkEncoder.encode(
            ref,
            0,
            stream_id=10000,
            epoch=3,
            seq=5,
            chunk_index=i,
            chunk_count=6,
            chunk_offset=off,
            chunk_length=len(part),
            payload_length=len(payload),
            header_included=1 if i == 0 else 0,
            header_bytes=hdr if i == 0 else b"",
            payload_bytes=part,
        )
        assert n == len(msg) == Chunker.message_length(i, len(part))
        assert bytes(ref) == msg
        d = BridgeFrameChunkDecoder(msg)
        assert (d.stream_id, d.epoch, d.seq, d.chunk_index, d.chunk_count) == (10000, 3, 5, i, 6)
        assert (d.chunk_offset, d.chunk_length, d.payload_length) == (off, len(part), 512)
        assert d.header_included_raw == (1 if i == 0 else 0)
        assert d.header_bytes == (hdr if i == 0 else b"")
        assert d.payload_bytes == part


def test_s5_2_header_only_in_chunk_zero() -> None:
    ch = Chunker(10)
    buf = bytearray(400)
    with pytest.raises(ValueError):
        ch.encode(buf, 0, stream_id=1, epoch=1, seq=1, chunk_index=0, chunk_count=1,
                  chunk_offset=0, payload_length=0, header=None, payload=b"")  # fmt: skip
    with pytest.raises(ValueError):
        ch.encode(buf, 0, stream_id=1, epoch=1, seq=1, chunk_index=0, chunk_count=1,
                  chunk_offset=0, payload_length=0, header=b"x" * 255, payload=b"")  # fmt: skip
    with pytest.raises(ValueError):
        ch.encode(buf, 0, stream_id=1, epoch=1, seq=1, chunk_index=1, chunk_count=2,
                  chunk_offset=0, payload_length=0, header=b"x" * 256, payload=b"")  # fmt: skip


def test_wire_sizes() -> None:
    assert NO_HEADER_OVERHEAD == 57 and WITH_HEADER_OVERHEAD == 313
    ch = Chunker(1280)
    assert ch.frame_wire_bytes(655360) == 655360 + 313 + 511 * 57


@pytest.mark.parametrize("bad", [0, 65536])
def test_chunk_size_bounds(bad: int) -> None:
    with pytest.raises(ValueError):
        Chunker(bad)
