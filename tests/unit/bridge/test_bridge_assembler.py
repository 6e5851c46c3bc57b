"""The receiver core (Bridge Spec §5.2, §5.3, §5.3a, §6, §8, §9): every rule, no I/O."""

from __future__ import annotations

import random

import numpy as np
import pytest
from bridge_helpers import (
    CHUNK,
    DEST,
    MS,
    NSLOTS,
    OFF_COUNT,
    OFF_HINC,
    OFF_HLEN,
    OFF_INDEX,
    OFF_LENGTH,
    OFF_OFFSET,
    OFF_PLEN,
    OFF_STREAM,
    SRC,
    TIMEOUT_NS,
    announce,
    completes,
    drops,
    feed,
    header_slot,
    make_core,
    make_frame,
    patch,
    pattern,
    u8_layout,
)

from tensorpool.bridge.assembler import (
    Dropped,
    FrameComplete,
    OpenDestination,
    ProgressOut,
    ReceiverCore,
    ReceiverMapping,
    SourceAnnounce,
)
from tensorpool.bridge.reasons import ChunkDrop, ControlDrop, FrameDrop
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs.generated.wire import Dtype


def one(results: list[object]) -> FrameComplete:
    done = completes(results)
    assert len(done) == 1, results
    return done[0]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "nbytes", [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 655360], ids=lambda n: f"{n}B"
)
def test_s5_2_frames_of_one_and_many_chunks_reassemble(nbytes: int) -> None:
    """Frames of exactly one chunk, just over, and many chunks come out byte-identical."""
    core, _ = make_core()
    f = make_frame(3, nbytes)
    assert len(f.chunks) == max(1, -(-nbytes // CHUNK))
    done = one(feed(core, f.chunks))
    assert bytes(done.payload) == f.payload
    assert (done.seq, done.epoch, done.dest_stream_id) == (3, 1, DEST)
    assert done.values_len_bytes == nbytes
    assert core.stats(0).frames == 1 and core.stats(0).bytes == nbytes


def test_s6_9_header_fields_are_preserved() -> None:
    """seq, timestamp, meta_version and the tensor layout survive; source pool id is kept
    only for reference (the local pool is chosen by the destination, §6 step 9)."""
    core, _ = make_core(ann=announce(pools=((1, NSLOTS, 4096), (2, NSLOTS, 1 << 20))))
    layout = TensorLayout.contiguous((16, 64), np.dtype("<f4"))
    f = make_frame(
        41, 16 * 64 * 4, layout=layout, pool_id=2, timestamp_ns=987654321, meta_version=12,
        payload_slot=5,
    )  # fmt: skip
    done = one(feed(core, f.chunks))
    assert done.layout == layout and done.layout.shape == (16, 64)
    assert done.layout.np_dtype == np.dtype("<f4")
    assert (done.timestamp_ns, done.meta_version, done.source_pool_id) == (987654321, 12, 2)
    assert done.header == f.header


def test_s5_2_empty_payload() -> None:
    core, sink = make_core()
    layout = TensorLayout.contiguous((0,), np.uint8)
    f = make_frame(0, 0, layout=layout)
    assert len(f.chunks) == 1
    done = one(feed(core, f.chunks))
    assert bytes(done.payload) == b"" and done.values_len_bytes == 0
    assert sink.sizes == [0]


# --------------------------------------------------------------------------- ordering


def test_s5_2_out_of_order_chunks_assemble_by_offset() -> None:
    core, _ = make_core()
    for seq in range(1, 6):
        f = make_frame(seq, 10 * CHUNK + 77)
        order = list(f.chunks)
        random.Random(seq).shuffle(order)
        done = one(feed(core, order))
        assert bytes(done.payload) == f.payload


def test_s5_2_reverse_order_chunks() -> None:
    core, _ = make_core()
    f = make_frame(1, 7 * CHUNK)
    assert bytes(one(feed(core, f.chunks[::-1])).payload) == f.payload


def test_s5_2_identical_duplicates_are_ignored() -> None:
    core, _ = make_core()
    f = make_frame(1, 5 * CHUNK)
    stream = [f.chunks[0], f.chunks[0], f.chunks[1], f.chunks[3], f.chunks[1], f.chunks[2],
              f.chunks[3], f.chunks[4]]  # fmt: skip
    results = feed(core, stream)
    assert bytes(one(results).payload) == f.payload
    assert drops(results) == [ChunkDrop.DUPLICATE] * 3
    # a duplicate arriving after the frame completed is stale, never a second frame
    again = feed(core, [f.chunks[2]])
    assert drops(again) == [ChunkDrop.STALE_SEQ] and not completes(again)


def test_s5_2_conflicting_duplicate_drops_the_frame() -> None:
    """Same offset and length, different bytes: the frame is dropped (§5.2, §5.3)."""
    core, sink = make_core()
    f = make_frame(1, 4 * CHUNK)
    bad = bytearray(f.chunks[1])
    bad[-1] ^= 0xFF
    results = feed(core, [f.chunks[0], f.chunks[1], bytes(bad), f.chunks[2], f.chunks[3]])
    assert not completes(results)
    assert FrameDrop.CHUNK_CONFLICT in drops(results)
    assert core.stats(0).frame_drops[FrameDrop.CHUNK_CONFLICT] == 1
    assert sink.released == 1


def test_s5_2_overlapping_chunk_drops_the_frame() -> None:
    """A chunk overlapping received bytes at another offset is conflicting."""
    core, _ = make_core()
    f = make_frame(1, 4 * CHUNK)
    overlap = patch(f.chunks[2], OFF_OFFSET, "<I", 2 * CHUNK - 10)
    results = feed(core, [f.chunks[0], f.chunks[1], overlap, f.chunks[3]])
    assert not completes(results)
    assert FrameDrop.CHUNK_OVERLAP in drops(results)


def test_s5_2_overlap_with_a_later_out_of_order_chunk() -> None:
    core, _ = make_core()
    f = make_frame(1, 4 * CHUNK)
    shifted = patch(f.chunks[2], OFF_OFFSET, "<I", 3 * CHUNK - 5)  # overlaps chunk 3
    assert drops(feed(core, [f.chunks[3], shifted])) == [FrameDrop.CHUNK_OVERLAP]


def test_s5_2_same_index_twice_with_another_span_is_a_conflict() -> None:
    core, _ = make_core()
    f = make_frame(1, 4 * CHUNK)
    moved = patch(f.chunks[1], OFF_OFFSET, "<I", 3 * CHUNK)  # index 1 again, elsewhere
    assert drops(feed(core, [f.chunks[0], f.chunks[1], moved])) == [FrameDrop.CHUNK_CONFLICT]


def test_s5_2_inconsistent_count_or_length_within_a_frame() -> None:
    core, _ = make_core()
    f = make_frame(1, 4 * CHUNK)
    other = patch(f.chunks[1], OFF_COUNT, "<I", 5)
    assert drops(feed(core, [f.chunks[0], other])) == [FrameDrop.CHUNK_INCONSISTENT]


# --------------------------------------------------------------------------- loss


def test_s5_3_missing_chunk_publishes_nothing() -> None:
    core, sink = make_core()
    f = make_frame(1, 6 * CHUNK)
    results = feed(core, f.chunks[:3] + f.chunks[4:])
    assert not completes(results)
    assert core.in_flight(0) == 1
    # the next frame supersedes the incomplete one
    g = make_frame(2, 6 * CHUNK)
    results = feed(core, g.chunks)
    assert [c.seq for c in completes(results)] == [2]
    assert core.stats(0).frame_drops[FrameDrop.SUPERSEDED] == 1
    assert sink.released == 1


def test_s5_3a_assembly_timeout_from_the_first_chunk() -> None:
    """Incomplete frames are dropped once the timeout has passed since their FIRST chunk,
    even if chunks keep trickling in; tick() enforces it without any traffic."""
    core, sink = make_core()
    f = make_frame(1, 4 * CHUNK)
    assert feed(core, f.chunks[:1], now_ns=0) == []
    assert feed(core, f.chunks[1:2], now_ns=TIMEOUT_NS - MS) == []
    assert core.tick(TIMEOUT_NS) == []  # not beyond the timeout yet
    expired = core.tick(TIMEOUT_NS + 1)
    assert [(d.seq, d.reason, d.frame) for d in expired] == [(1, FrameDrop.ASSEMBLY_TIMEOUT, True)]
    assert core.in_flight(0) is None and sink.released == 1
    late = feed(core, f.chunks[2:], now_ns=TIMEOUT_NS + 2)
    assert not completes(late) and set(drops(late)) == {ChunkDrop.STALE_SEQ}
    assert core.stats(0).snapshot()["assembly_timeouts"] == 1


def test_s5_3a_timeout_detected_on_the_next_chunk() -> None:
    core, _ = make_core()
    f = make_frame(1, 3 * CHUNK)
    feed(core, f.chunks[:2], now_ns=0)
    results = feed(core, f.chunks[2:], now_ns=TIMEOUT_NS + 1)
    assert not completes(results)
    assert core.stats(0).frame_drops[FrameDrop.ASSEMBLY_TIMEOUT] == 1


def test_s5_3a_timeout_is_configurable() -> None:
    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST)], chunk_bound=CHUNK, max_payload_bytes=1 << 30,
        assembly_timeout_ns=5 * MS,
    )  # fmt: skip
    core.on_announce(announce(), 0)
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    feed(core, make_frame(1, 3 * CHUNK).chunks[:1], now_ns=0)
    assert len(core.tick(5 * MS + 1)) == 1


# --------------------------------------------------------------------------- announces, epochs


def test_s5_2_chunks_before_any_announce_are_dropped() -> None:
    core, sink = make_core(announced=False)
    f = make_frame(1, 2 * CHUNK)
    results = feed(core, f.chunks)
    assert drops(results) == [ChunkDrop.NO_ANNOUNCE] * 2 and sink.sizes == []
    events = core.on_announce(announce(), 0)
    assert events == [OpenDestination(0, 1, False)]
    # announced but the destination is not open yet
    assert drops(feed(core, f.chunks[:1])) == [ChunkDrop.DEST_NOT_READY]
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    assert bytes(one(feed(core, make_frame(2, 2 * CHUNK).chunks)).payload) == pattern(2, 2 * CHUNK)


def test_s8_epoch_change_mid_frame_drops_in_flight_and_old_chunks() -> None:
    core, sink = make_core()
    f1 = make_frame(7, 4 * CHUNK, epoch=1)
    feed(core, f1.chunks[:2])
    events = core.on_announce(announce(2), 0)
    assert [type(e) for e in events] == [Dropped, OpenDestination]
    assert events[0].reason == FrameDrop.EPOCH_CHANGE and events[1] == OpenDestination(0, 2, True)
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    # the rest of the epoch-1 frame is stale now
    assert set(drops(feed(core, f1.chunks[2:]))) == {ChunkDrop.STALE_EPOCH}
    # the new epoch restarts at seq 0 and is accepted
    f2 = make_frame(0, 2 * CHUNK, epoch=2)
    assert bytes(one(feed(core, f2.chunks)).payload) == f2.payload
    assert sink.released == 1


def test_s8_chunk_of_an_unannounced_newer_epoch() -> None:
    """A newer epoch before its announce: dropped (§6.3), and what is in flight is dropped
    (§8); it does not raise the floor, so the announced epoch keeps working."""
    core, _ = make_core()
    f1 = make_frame(1, 3 * CHUNK, epoch=1)
    feed(core, f1.chunks[:1])
    ahead = make_frame(1, 3 * CHUNK, epoch=5)
    assert drops(feed(core, ahead.chunks[:1])) == [ChunkDrop.EPOCH_MISMATCH]
    assert core.stats(0).frame_drops[FrameDrop.EPOCH_CHANGE] == 1
    f2 = make_frame(2, 3 * CHUNK, epoch=1)
    assert one(feed(core, f2.chunks)).seq == 2


def test_s8_older_announce_after_newer_is_ignored() -> None:
    core, _ = make_core(ann=announce(3))
    assert core.on_announce(announce(2), 0) == []
    assert core.stats(0).control_drops[ControlDrop.ANNOUNCE_OLD_EPOCH] == 1
    assert core.source_epoch(0) == 3
    assert drops(feed(core, make_frame(1, 10, epoch=2).chunks)) == [ChunkDrop.STALE_EPOCH]


def test_s8_repeated_announce_is_a_refresh() -> None:
    core, _ = make_core()
    f = make_frame(1, 3 * CHUNK)
    feed(core, f.chunks[:2])
    assert core.on_announce(announce(1), 0) == []
    assert one(feed(core, f.chunks[2:])).seq == 1


@pytest.mark.parametrize(
    "ann",
    [
        announce(header_slot_bytes=128),
        announce(nslots=48, pools=((1, 48, 4096),)),
        announce(pools=()),
        announce(pools=((1, NSLOTS, 4096), (1, NSLOTS, 8192))),
        announce(pools=((1, 32, 4096),)),
    ],
    ids=["slot_bytes", "nslots", "no_pools", "dup_pool", "pool_nslots"],
)
def test_s7_2_invalid_forwarded_announce_is_ignored(ann: SourceAnnounce) -> None:
    core, _ = make_core(announced=False)
    assert core.on_announce(ann, 0) == []
    assert core.stats(0).control_drops[ControlDrop.ANNOUNCE_INVALID] == 1
    assert drops(feed(core, make_frame(1, 10).chunks)) == [ChunkDrop.NO_ANNOUNCE]


def test_announce_for_unmapped_stream_is_ignored() -> None:
    core, _ = make_core(announced=False)
    assert core.on_announce(announce(stream_id=999), 0) == []


# --------------------------------------------------------------------------- §5.2 chunk rules


@pytest.mark.parametrize(
    ("index", "offset", "fmt", "value", "reason"),
    [
        (0, OFF_COUNT, "<I", 0, ChunkDrop.CHUNK_COUNT_INVALID),
        (0, OFF_COUNT, "<I", 65536, ChunkDrop.CHUNK_COUNT_INVALID),
        (1, OFF_INDEX, "<I", 3, ChunkDrop.CHUNK_INDEX_OUT_OF_RANGE),
        (0, OFF_HINC, "<B", 2, ChunkDrop.HEADER_INCLUDED_INVALID),
        (0, OFF_HINC, "<B", 0, ChunkDrop.HEADER_FLAG_MISMATCH),
        (1, OFF_HINC, "<B", 1, ChunkDrop.HEADER_FLAG_MISMATCH),
        (0, OFF_OFFSET, "<I", CHUNK, ChunkDrop.CHUNK_OFFSET_INVALID),
        (1, OFF_LENGTH, "<I", CHUNK - 1, ChunkDrop.CHUNK_LENGTH_MISMATCH),
        (2, OFF_OFFSET, "<I", 2 * CHUNK + 1, ChunkDrop.CHUNK_OUT_OF_BOUNDS),
        (0, OFF_STREAM, "<I", 4242, ChunkDrop.UNKNOWN_STREAM),
    ],
)
def test_s5_2_malformed_chunk_fields_are_dropped(
    index: int, offset: int, fmt: str, value: int, reason: str
) -> None:
    core, sink = make_core()
    f = make_frame(1, 3 * CHUNK)
    bad = patch(f.chunks[index], offset, fmt, value)
    assert drops(feed(core, [bad])) == [reason]
    assert sink.sizes == []  # refused before any buffer was requested


def test_s5_2_header_bytes_length_must_match_the_flag() -> None:
    """headerIncluded=TRUE with 255 header bytes, FALSE with 1: both dropped."""
    core, _ = make_core()
    f = make_frame(1, 2 * CHUNK)
    msg0 = f.chunks[0]
    # chunk 0 with 255 header bytes: shrink the length prefix and drop one header byte
    short = msg0[:OFF_HLEN] + (255).to_bytes(4, "little") + msg0[OFF_HLEN + 5 :]
    assert drops(feed(core, [short])) == [ChunkDrop.HEADER_LENGTH_INVALID]
    msg1 = f.chunks[1]
    with_hdr = msg1[:OFF_HLEN] + (1).to_bytes(4, "little") + b"\x00" + msg1[OFF_HLEN + 4 :]
    assert drops(feed(core, [with_hdr])) == [ChunkDrop.HEADER_LENGTH_INVALID]


def test_s5_2_oversized_chunk_length_rejected_without_allocation() -> None:
    """chunkLength above the chunk bound (effective chunk size / max_chunk_bytes) is dropped
    before any buffer is requested, even when the message really carries that many bytes."""
    core, sink = make_core(chunk_bound=1024)
    f = make_frame(1, 3000, chunk=2000)
    # chunk 0 is too large; chunk 1 (1000 B) fits but 2 chunks of <= 1024 cannot hold 3000
    assert drops(feed(core, f.chunks)) == [ChunkDrop.CHUNK_TOO_LARGE, ChunkDrop.CHUNK_COUNT_INVALID]
    assert sink.sizes == []


def test_s5_2_declared_lengths_beyond_the_message_are_truncation() -> None:
    """A varData length prefix claiming 60 KiB in a short message: refused, nothing read."""
    core, sink = make_core()
    f = make_frame(1, 2 * CHUNK)
    m = bytearray(f.chunks[1])
    m[53:57] = (60_000).to_bytes(4, "little")
    assert drops(feed(core, [bytes(m)])) == [ChunkDrop.TRUNCATED]
    m0 = bytearray(f.chunks[0])
    m0[OFF_HLEN : OFF_HLEN + 4] = (0xFFFFFFFF).to_bytes(4, "little")
    assert drops(feed(core, [bytes(m0)])) == [ChunkDrop.HEADER_LENGTH_INVALID]
    assert sink.sizes == []


def test_s5_2_oversized_header_bytes_rejected() -> None:
    """headerBytes longer than the 256-byte slot (the bytes really present) is refused from
    its length prefix; nothing is copied or allocated."""
    core, sink = make_core()
    f = make_frame(1, 2 * CHUNK)
    m0 = f.chunks[0]
    big = m0[:OFF_HLEN] + (300).to_bytes(4, "little") + m0[OFF_HLEN + 4 : OFF_HLEN + 4 + 256]
    big += bytes(44) + m0[OFF_HLEN + 4 + 256 :]
    assert drops(feed(core, [big])) == [ChunkDrop.HEADER_LENGTH_INVALID]
    assert sink.sizes == [] and core.stats(0).chunks == 0


@pytest.mark.parametrize(
    ("plen", "kw", "reason"),
    [
        (2_000_000, {"max_payload": 1 << 20}, ChunkDrop.PAYLOAD_TOO_LARGE),
        (1 << 21, {}, ChunkDrop.PAYLOAD_EXCEEDS_SOURCE_STRIDE),
        (1 << 19, {"local_stride": 1 << 18}, ChunkDrop.PAYLOAD_EXCEEDS_LOCAL_STRIDE),
        (0x40000000, {}, ChunkDrop.PAYLOAD_EXCEEDS_SOURCE_STRIDE),
    ],
    ids=["max_payload", "source_stride", "local_stride", "schema_max"],
)
def test_s5_2_s6_7_oversized_payload_length_rejected_without_allocation(
    plen: int, kw: dict[str, int], reason: str
) -> None:
    """payloadLength beyond max_payload_bytes, the source stride or every local stride is
    dropped from its first chunk; no buffer of that size is ever requested."""
    core, sink = make_core(**kw)
    f = make_frame(1, 2 * CHUNK)
    lie = patch(f.chunks[0], OFF_PLEN, "<I", plen)
    lie = patch(lie, OFF_COUNT, "<I", min(-(-plen // CHUNK), 65535))
    assert drops(feed(core, [lie])) == [reason]
    assert sink.sizes == []


def test_s5_2_chunk_count_cannot_cover_or_exceeds_the_payload() -> None:
    core, _ = make_core()
    f = make_frame(1, 3 * CHUNK)
    too_few = patch(f.chunks[0], OFF_COUNT, "<I", 2)  # 2 chunks of <= CHUNK cannot hold 3*CHUNK
    assert drops(feed(core, [too_few])) == [ChunkDrop.CHUNK_COUNT_INVALID]
    g = make_frame(2, 10, chunk=CHUNK)
    too_many = patch(g.chunks[0], OFF_COUNT, "<I", 11)  # more chunks than bytes
    assert drops(feed(core, [too_many])) == [ChunkDrop.CHUNK_COUNT_INVALID]


def test_truncated_and_foreign_messages() -> None:
    core, _ = make_core()
    f = make_frame(1, 100)
    assert drops(feed(core, [f.chunks[0][:40]])) == [ChunkDrop.TRUNCATED]
    assert drops(feed(core, [f.chunks[0][:-1]])) == [ChunkDrop.TRUNCATED]
    wrong_schema = patch(f.chunks[0], 4, "<H", 900)
    assert drops(feed(core, [wrong_schema])) == [ChunkDrop.BAD_MESSAGE_HEADER]
    newer = patch(f.chunks[0], 6, "<H", 2)
    assert drops(feed(core, [newer])) == [ChunkDrop.BAD_MESSAGE_HEADER]
    assert core.chunk_drops[ChunkDrop.TRUNCATED] == 2


def test_longer_block_from_a_schema_extension_is_accepted() -> None:
    """SBE: a larger blockLength moves the var data; the known fields still decode."""
    core, _ = make_core()
    f = make_frame(1, 100)
    m = f.chunks[0]
    extended = patch(m[:49] + b"\xab\xcd" + m[49:], 0, "<H", 43)
    assert bytes(one(feed(core, [extended])).payload) == f.payload


# --------------------------------------------------------------------------- §6 header checks


def _frame_with_header(header: bytes, nbytes: int = 2 * CHUNK, seq: int = 1) -> list[bytes]:
    return make_frame(seq, nbytes, header=header).chunks


@pytest.mark.parametrize(
    ("seq", "extent", "values_len", "kw", "reason"),
    [
        (1, 2, 2 * CHUNK - 1, {}, FrameDrop.HEADER_VALUES_LEN_MISMATCH),
        (2, 2, 2 * CHUNK, {}, FrameDrop.HEADER_SEQ_MISMATCH),
        (1, 2, 2 * CHUNK, {"pool_id": 9}, FrameDrop.HEADER_POOL_ID_UNKNOWN),
        (1, 2, 2 * CHUNK, {"payload_offset": 64}, "payload_offset_nonzero"),
        (1, 3, 2 * CHUNK, {}, "values_len_below_extent"),
    ],
    ids=["values_len", "seq", "pool_id", "payload_offset", "extent"],
)
def test_s6_4_s6_5_header_validation(
    seq: int, extent: int, values_len: int, kw: dict[str, int], reason: str
) -> None:
    """values_len_bytes == payloadLength, seq_commit >> 1 == seq, pool id announced,
    payload_offset == 0, values_len covering the tensor extent — else the frame is dropped."""
    core, sink = make_core()
    hdr = header_slot(seq, u8_layout(extent * CHUNK), values_len, **kw)
    results = feed(core, _frame_with_header(hdr))
    assert not completes(results)
    assert drops(results)[-1] == reason
    assert sink.released == 1


@pytest.mark.parametrize(
    ("fmt", "offset", "value", "reason"),
    [
        ("<I", 60, 191, "header_bytes_length_invalid"),  # embedded header length
        ("<H", 64, 100, "embedded_block_length_invalid"),
        ("<H", 66, 99, "embedded_template_id_invalid"),
        ("<H", 68, 901, "embedded_schema_id_invalid"),
        ("<H", 70, 2, "embedded_version_invalid"),
        ("<h", 72, 99, "dtype_unknown"),
        ("<h", 74, 7, "major_order_unknown"),
        ("<B", 76, 9, "ndims_out_of_range"),
    ],
)
def test_s6_4_malformed_embedded_tensor_header(
    fmt: str, offset: int, value: int, reason: str
) -> None:
    """The embedded header must decode to a supported TensorHeader (schema/template/version,
    length 192, dtype, ndims within local limits), else the frame is dropped."""
    import struct

    hdr = bytearray(header_slot(1, u8_layout(2 * CHUNK), 2 * CHUNK))
    struct.pack_into(fmt, hdr, offset, value)
    core, _ = make_core()
    results = feed(core, _frame_with_header(bytes(hdr)))
    assert not completes(results) and drops(results)[-1] == reason


def test_s6_6_payload_within_the_headers_source_pool_stride() -> None:
    """pool 1 has a 4 KiB stride: a 5000-byte frame claiming pool 1 is dropped, even though
    pool 2 is large enough (§6 step 6 uses the header's pool)."""
    core, _ = make_core(ann=announce(pools=((1, NSLOTS, 4096), (2, NSLOTS, 1 << 20))))
    results = feed(core, make_frame(1, 5000, pool_id=1).chunks)
    assert drops(results)[-1] == ChunkDrop.PAYLOAD_EXCEEDS_SOURCE_STRIDE
    assert one(feed(core, make_frame(2, 5000, pool_id=2).chunks)).seq == 2


def test_s6_float_layout_and_column_major_survive() -> None:
    core, _ = make_core()
    layout = TensorLayout.contiguous((3, 5), np.dtype("<f8"), order="F")
    data = np.asfortranarray(np.arange(15, dtype="<f8").reshape(3, 5))
    f = make_frame(1, data.nbytes, layout=layout, payload=data.tobytes(order="A"))
    done = one(feed(core, f.chunks))
    view = done.layout.view(done.payload, 0)
    assert np.array_equal(view, data) and done.layout.dtype == Dtype.FLOAT64


# --------------------------------------------------------------------------- seq handling


def test_stale_and_older_seq_chunks() -> None:
    core, _ = make_core()
    f5 = make_frame(5, 2 * CHUNK)
    one(feed(core, f5.chunks))
    assert drops(feed(core, make_frame(4, 2 * CHUNK).chunks[:1])) == [ChunkDrop.STALE_SEQ]
    f7 = make_frame(7, 3 * CHUNK)
    feed(core, f7.chunks[:1])
    # a chunk of seq 6 while 7 is in flight is older: dropped, 7 continues
    assert drops(feed(core, make_frame(6, 3 * CHUNK).chunks[1:2])) == [ChunkDrop.STALE_SEQ]
    assert one(feed(core, f7.chunks[1:])).seq == 7


def test_sink_refusal_drops_the_frame() -> None:
    class Full:
        def acquire(self, mapping: int, seq: int, payload_length: int) -> str:
            return "no_lease"

        def release(self, mapping: int, seq: int) -> None:  # pragma: no cover
            raise AssertionError

    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST)], chunk_bound=CHUNK, max_payload_bytes=1 << 30,
        assembly_timeout_ns=TIMEOUT_NS, sink=Full(),
    )  # fmt: skip
    core.on_announce(announce(), 0)
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    f = make_frame(1, 2 * CHUNK)
    results = feed(core, f.chunks)
    assert drops(results) == ["no_lease", ChunkDrop.STALE_SEQ]
    assert core.stats(0).frame_drops["no_lease"] == 1


def test_destination_lost_drops_in_flight() -> None:
    core, sink = make_core()
    feed(core, make_frame(1, 3 * CHUNK).chunks[:1])
    d = core.destination_lost(0)
    assert d is not None and d.reason == FrameDrop.DEST_LOST and sink.released == 1
    assert drops(feed(core, make_frame(2, 10).chunks)) == [ChunkDrop.DEST_NOT_READY]


def test_s4_attaching_destination_drops_its_chunks_as_destination_attaching() -> None:
    """While the agent attaches the destination (a driver that is slow to answer), the
    stream's chunks are dropped and counted as ``destination_attaching``; once ready they
    assemble; a failed attach leaves ``dest_not_ready`` until the agent retries."""
    core, _ = make_core(ready=False)
    assert core.destination_state(0) == "closed"
    core.destination_attaching(0)
    assert core.destination_state(0) == "attaching"
    f = make_frame(1, 3 * CHUNK)
    assert drops(feed(core, f.chunks)) == [ChunkDrop.DESTINATION_ATTACHING] * 3
    assert core.stats(0).chunk_drops[ChunkDrop.DESTINATION_ATTACHING] == 3
    assert core.on_progress(SRC, 1, 1, 0, 1) == ControlDrop.PROGRESS_NO_DESTINATION
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    assert core.destination_state(0) == "open"
    assert one(feed(core, make_frame(2, 3 * CHUNK).chunks)).seq == 2
    core.destination_attaching(0)  # a re-attach
    core.destination_lost(0)  # ...that failed
    assert core.destination_state(0) == "closed"
    assert drops(feed(core, make_frame(3, 10).chunks)) == [ChunkDrop.DEST_NOT_READY]
    assert core.stats(0).chunk_drops[ChunkDrop.DESTINATION_ATTACHING] == 3


def test_s4_one_attaching_destination_does_not_hold_back_another() -> None:
    """Per-mapping state: mapping 1 attaching drops only its own chunks; mapping 0's frames
    interleaved with them complete."""
    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST), ReceiverMapping(1, SRC + 1, DEST + 1)],
        chunk_bound=CHUNK, max_payload_bytes=1 << 30, assembly_timeout_ns=TIMEOUT_NS,
    )  # fmt: skip
    core.on_announce(announce(), 0)
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    core.on_announce(announce(stream_id=SRC + 1), 0)
    core.destination_attaching(1)
    a = make_frame(1, 3 * CHUNK)
    b = make_frame(1, 3 * CHUNK, stream_id=SRC + 1)
    out = feed(core, [x for pair in zip(a.chunks, b.chunks, strict=True) for x in pair])
    assert [bytes(c.payload) for c in completes(out)] == [a.payload]
    assert drops(out) == [ChunkDrop.DESTINATION_ATTACHING] * 3
    assert core.stats(0).chunk_drops.snapshot() == {}


# --------------------------------------------------------------------------- §9 progress


def test_s9_progress_is_remapped_to_the_local_header_index() -> None:
    core, _ = make_core(local_nslots=16)
    out = core.on_progress(SRC, 1, 37, 4096, 2)
    assert out == ProgressOut(DEST, 1, 37, 37 & 15, 4096, 2)


def test_s9_progress_drops() -> None:
    core, _ = make_core(announced=False)
    assert core.on_progress(SRC, 1, 1, 0, 1) == ControlDrop.PROGRESS_EPOCH_MISMATCH
    core.on_announce(announce(), 0)
    assert core.on_progress(SRC, 1, 1, 0, 1) == ControlDrop.PROGRESS_NO_DESTINATION
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    assert core.on_progress(SRC, 2, 1, 0, 1) == ControlDrop.PROGRESS_EPOCH_MISMATCH
    assert core.on_progress(999, 1, 1, 0, 1) == ControlDrop.PROGRESS_UNKNOWN_STREAM
    one(feed(core, make_frame(4, 10).chunks))
    assert core.on_progress(SRC, 1, 4, 10, 3) == ControlDrop.PROGRESS_EXPIRED
    assert isinstance(core.on_progress(SRC, 1, 5, 0, 1), ProgressOut)


def test_two_mappings_are_independent() -> None:
    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST), ReceiverMapping(1, SRC + 1, DEST + 1)],
        chunk_bound=CHUNK, max_payload_bytes=1 << 30, assembly_timeout_ns=TIMEOUT_NS,
    )  # fmt: skip
    for i, sid in enumerate((SRC, SRC + 1)):
        core.on_announce(announce(stream_id=sid), 0)
        core.destination_ready(i, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST + i)
    a = make_frame(1, 3 * CHUNK)
    b = make_frame(1, 3 * CHUNK, stream_id=SRC + 1, payload=pattern(99, 3 * CHUNK))
    inter = [x for pair in zip(a.chunks, b.chunks, strict=True) for x in pair]
    out = completes(feed(core, inter))
    assert [(c.dest_stream_id, bytes(c.payload)) for c in out] == [
        (DEST, a.payload),
        (DEST + 1, b.payload),
    ]
