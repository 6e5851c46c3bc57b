"""The seq_commit seqlock and slot validation (§8.2, §8.3, §10.2.1, §15.3, §15.18, §15.21)."""

from __future__ import annotations

import itertools
import platform
import struct

import numpy as np
import pytest
from _shm_helpers import Stream, make_stream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorpool.counters import LATE_REASONS, Reason
from tensorpool.shm import (
    SlotReader,
    SlotWriter,
    TensorLayout,
    TensorLayoutError,
    UnsupportedPlatform,
    header_slot_offset,
    memory_order_supported,
)
from tensorpool.shm.layout import Dtype, MajorOrder, ProgressUnit

U32 = struct.Struct("<I")
U16 = struct.Struct("<H")
I16 = struct.Struct("<h")


def _word(s: Stream, idx: int) -> int:
    return s.header.words[header_slot_offset(idx) >> 3]


def _drop(s: Stream, idx: int, seq: int) -> str:
    before = s.reader.counters.total()
    assert s.reader.read(idx, seq) is None
    assert s.reader.counters.total() == before + 1
    assert s.reader.last_drop_reason is not None
    return s.reader.last_drop_reason


def _poke(s: Stream, idx: int, slot_offset: int, fmt: struct.Struct, value: int) -> None:
    fmt.pack_into(s.header.mmap, header_slot_offset(idx) + slot_offset, value)


# --- happy path -----------------------------------------------------------------------------------
def test_s8_3_committed_frame_is_read_zero_copy(stream: Stream) -> None:
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    idx = stream.writer.write(10, a, timestamp_ns=123_456, meta_version=7)
    assert idx == 10 & 7
    assert _word(stream, idx) == (10 << 1) | 1
    got = stream.reader.read(idx, 10)
    assert got is not None
    assert (got.seq, got.header_index, got.timestamp_ns, got.meta_version) == (10, idx, 123_456, 7)
    assert got.values_len_bytes == a.nbytes and got.pool_id == 1
    assert got.layout.dtype == Dtype.FLOAT32 and got.layout.major_order == MajorOrder.ROW
    assert got.array is not None
    np.testing.assert_array_equal(got.array, a)
    assert not got.array.flags.writeable, "consumer views of a read-only mapping are read-only"
    assert not got.array.flags.owndata, "zero-copy"
    assert stream.reader.is_current(got)
    assert stream.reader.counters.total() == 0


def test_s8_3_fortran_and_strided_arrays_round_trip(stream: Stream) -> None:
    a = np.asfortranarray(np.arange(24, dtype=np.int16).reshape(4, 6))
    got = stream.reader.read(stream.writer.write(1, a, timestamp_ns=0), 1)
    assert got is not None and got.layout.major_order == MajorOrder.COLUMN
    np.testing.assert_array_equal(got.array, a)
    s = np.arange(100, dtype=np.float64).reshape(10, 10)[::3, 1::2]
    got = stream.reader.read(stream.writer.write(2, s, timestamp_ns=0), 2)
    assert got is not None
    np.testing.assert_array_equal(got.array, s)


def test_s8_3_read_copy_survives_overwrite(stream: Stream) -> None:
    stream.writer.write(3, np.full(16, 3, np.int64), timestamp_ns=0)
    got = stream.reader.read_copy(3, 3)
    assert got is not None and got.array is not None and got.array.flags.owndata
    stream.writer.write(11, np.full(16, 11, np.int64), timestamp_ns=0)  # same slot
    assert (got.array == 3).all()


def test_s8_2_empty_payload_is_committed_and_not_read(stream: Stream) -> None:
    """values_len_bytes == 0 is valid: the slot is committed, payload bytes are not read."""
    idx = stream.writer.write(4, np.zeros((0, 3), np.float32), timestamp_ns=9)
    got = stream.reader.read(idx, 4)
    assert got is not None and got.values_len_bytes == 0 and got.array is None
    assert got.layout.dims == (0, 3)


def test_zero_dim_array_written_as_shape_1(stream: Stream) -> None:
    got = stream.reader.read(stream.writer.write(5, np.array(2.5), timestamp_ns=0), 5)
    assert got is not None and got.array is not None and got.array.tolist() == [2.5]


def test_s8_3_full_overwrite_zero_fills_pads(stream: Stream) -> None:
    off = header_slot_offset(6)
    stream.header.mmap[off : off + 256] = b"\xff" * 256
    stream.writer.write(6, np.ones(3, np.uint8), timestamp_ns=0)
    slot = bytes(stream.header.mmap[off : off + 256])
    assert slot[34:60] == bytes(26), "SlotHeader pad"
    assert slot[147:256] == bytes(109), "TensorHeader pad"
    assert slot[64 + 8 + 11 + 4 : 64 + 8 + 43] == bytes(28), "dims beyond ndims"


# --- claim / commit ---------------------------------------------------------------------------
def test_s15_18_claim_commit_protocol(stream: Stream) -> None:
    seq = 21
    layout = TensorLayout(Dtype.UINT16, MajorOrder.ROW, (8, 16), None, ProgressUnit.ROWS, 32)
    idx = stream.writer.begin(seq)
    assert idx == seq & 7
    assert _word(stream, idx) == seq << 1, "step 3: in-progress store"
    assert _drop(stream, idx, seq) == Reason.NOT_COMMITTED
    view = stream.writer.payload_view(1, idx, layout)
    view[:] = np.arange(128, dtype=np.uint16).reshape(8, 16)
    stream.writer.write_header(
        idx, pool_id=1, layout=layout, values_len_bytes=layout.extent_bytes, timestamp_ns=5
    )
    assert _drop(stream, idx, seq) == Reason.NOT_COMMITTED, "header alone does not publish"
    assert stream.writer.commit(seq) == idx
    assert _word(stream, idx) == (seq << 1) | 1, "step 7: committed store"
    got = stream.reader.read(idx, seq)
    assert got is not None and got.layout.progress_unit == ProgressUnit.ROWS
    np.testing.assert_array_equal(got.array, np.arange(128, dtype=np.uint16).reshape(8, 16))


def test_claim_payload_buffer_is_the_whole_slot(stream: Stream) -> None:
    buf = stream.writer.payload(2, 3)
    assert buf.dtype == np.uint8 and buf.nbytes == 16384 and buf.flags.writeable


def test_write_header_rejects_inconsistent_sizes(stream: Stream) -> None:
    layout = TensorLayout(Dtype.FLOAT32, MajorOrder.ROW, (10,))
    with pytest.raises(TensorLayoutError) as info:
        stream.writer.write_header(0, pool_id=1, layout=layout, values_len_bytes=39, timestamp_ns=0)
    assert info.value.reason == Reason.VALUES_LEN_BELOW_EXTENT
    with pytest.raises(TensorLayoutError) as info:
        stream.writer.write_header(
            0, pool_id=1, layout=layout, values_len_bytes=4097, timestamp_ns=0
        )
    assert info.value.reason == Reason.VALUES_LEN_EXCEEDS_STRIDE
    with pytest.raises(ValueError):
        stream.writer.write_header(0, pool_id=9, layout=layout, values_len_bytes=40, timestamp_ns=0)
    with pytest.raises(ValueError):
        stream.writer.write_header(8, pool_id=1, layout=layout, values_len_bytes=40, timestamp_ns=0)
    big = TensorLayout(Dtype.FLOAT64, MajorOrder.ROW, (1000,))
    with pytest.raises(TensorLayoutError):
        stream.writer.payload_view(1, 0, big)


@pytest.mark.parametrize("seq", [-1, 1 << 63])
def test_s8_3_logical_sequence_must_fit_63_bits(stream: Stream, seq: int) -> None:
    for fn in (stream.writer.begin, stream.writer.commit):
        with pytest.raises(ValueError):
            fn(seq)
    with pytest.raises(ValueError):
        stream.writer.write(seq, np.zeros(1), timestamp_ns=0)


def test_largest_sequence_round_trips(stream: Stream) -> None:
    seq = (1 << 63) - 1
    idx = stream.writer.write(seq, np.ones(2, np.uint8), timestamp_ns=0)
    assert _word(stream, idx) == (1 << 64) - 1
    assert stream.reader.read(idx, seq) is not None


def test_unwritable_array_dtype_leaves_slot_untouched(stream: Stream) -> None:
    before = bytes(stream.header.mmap[:])
    with pytest.raises(TensorLayoutError):
        stream.writer.write(0, np.zeros(3, np.complex64), timestamp_ns=0)
    assert bytes(stream.header.mmap[:]) == before


# --- consumer drop rules ------------------------------------------------------------------------
@pytest.mark.parametrize("idx", [8, 9, 1 << 32, -1])
def test_s10_2_1_header_index_out_of_range_dropped(stream: Stream, idx: int) -> None:
    assert _drop(stream, idx, 0) == Reason.HEADER_INDEX_OUT_OF_RANGE


def test_s8_3_never_written_slot_is_not_committed(stream: Stream) -> None:
    assert _drop(stream, 0, 0) == Reason.NOT_COMMITTED


def test_s10_2_1_stale_header_index_reuse_dropped(stream: Stream) -> None:
    """Descriptor for seq 3 arrives after the slot was reused by seq 11 (8-slot ring)."""
    stream.writer.write(3, np.ones(4), timestamp_ns=0)
    stream.writer.write(11, np.ones(4), timestamp_ns=0)
    assert _drop(stream, 3, 3) == Reason.SEQ_MISMATCH
    assert stream.reader.read(3, 11) is not None


def test_s15_3_seq_commit_lower_than_descriptor_dropped(stream: Stream) -> None:
    stream.writer.write(2, np.ones(4), timestamp_ns=0)
    assert _drop(stream, 2, 10) == Reason.SEQ_MISMATCH


def test_s8_2_payload_offset_nonzero_dropped(stream: Stream) -> None:
    stream.writer.write(1, np.ones(4), timestamp_ns=0)
    _poke(stream, 1, 18, U32, 64)
    assert _drop(stream, 1, 1) == Reason.PAYLOAD_OFFSET_NONZERO


def test_s10_2_1_payload_slot_out_of_range_dropped(stream: Stream) -> None:
    stream.writer.write(1, np.ones(4), timestamp_ns=0)
    _poke(stream, 1, 12, U32, 8)
    assert _drop(stream, 1, 1) == Reason.PAYLOAD_SLOT_OUT_OF_RANGE


def test_s15_5_payload_slot_must_equal_header_index(stream: Stream) -> None:
    stream.writer.write(1, np.ones(4), timestamp_ns=0)
    _poke(stream, 1, 12, U32, 2)
    assert _drop(stream, 1, 1) == Reason.PAYLOAD_SLOT_MISMATCH


def test_unknown_pool_id_dropped(stream: Stream) -> None:
    stream.writer.write(1, np.ones(4), timestamp_ns=0)
    _poke(stream, 1, 16, U16, 9)
    assert _drop(stream, 1, 1) == Reason.UNKNOWN_POOL_ID


def test_s10_2_1_values_len_exceeding_stride_dropped(stream: Stream) -> None:
    stream.writer.write(1, np.ones(4), timestamp_ns=0)
    _poke(stream, 1, 8, U32, 4097)
    assert _drop(stream, 1, 1) == Reason.VALUES_LEN_EXCEEDS_STRIDE


def test_s8_2_values_len_must_cover_tensor_extent(stream: Stream) -> None:
    stream.writer.write(1, np.ones(4), timestamp_ns=0)  # 32 bytes
    _poke(stream, 1, 8, U32, 31)
    assert _drop(stream, 1, 1) == Reason.VALUES_LEN_BELOW_EXTENT


@pytest.mark.parametrize(
    ("slot_offset", "fmt", "value", "reason"),
    [
        (60, U32, 191, Reason.HEADER_BYTES_LENGTH_INVALID),
        (60, U32, 0, Reason.HEADER_BYTES_LENGTH_INVALID),
        (64, U16, 183, Reason.EMBEDDED_BLOCK_LENGTH_INVALID),
        (66, U16, 51, Reason.EMBEDDED_TEMPLATE_ID_INVALID),
        (68, U16, 901, Reason.EMBEDDED_SCHEMA_ID_INVALID),
        (70, U16, 2, Reason.EMBEDDED_VERSION_INVALID),
        (70, U16, 0, Reason.EMBEDDED_VERSION_INVALID),
        (72, I16, 0, Reason.DTYPE_UNKNOWN),
        (72, I16, 12, Reason.DTYPE_UNKNOWN),
        (74, I16, 0, Reason.MAJOR_ORDER_UNKNOWN),
        (76, struct.Struct("<B"), 0, Reason.NDIMS_OUT_OF_RANGE),
        (76, struct.Struct("<B"), 9, Reason.NDIMS_OUT_OF_RANGE),
        (78, struct.Struct("<B"), 7, Reason.PROGRESS_UNIT_UNKNOWN),
        (78, struct.Struct("<B"), 1, Reason.PROGRESS_STRIDE_INVALID),  # ROWS with stride 0
        (72 + 11, struct.Struct("<i"), -4, Reason.DIMS_NEGATIVE),
        (72 + 43, struct.Struct("<i"), -8, Reason.STRIDES_NEGATIVE),
        (72 + 43, struct.Struct("<i"), 4, Reason.STRIDES_INCONSISTENT),  # row stride overlaps
    ],
)
def test_s8_3_s15_21_invalid_embedded_header_dropped(
    stream: Stream, slot_offset: int, fmt: struct.Struct, value: int, reason: str
) -> None:
    """§8.3 step 5 / §15.21 rule 3: length, templateId, schemaId, version of the embedded header;
    §8.2/§15.8: TensorHeader contents. Each is a counted drop with its own reason."""
    stream.writer.write(1, np.ones((2, 3)), timestamp_ns=0)
    assert stream.reader.read(1, 1) is not None  # cache the valid layout first
    _poke(stream, 1, slot_offset, fmt, value)
    assert _drop(stream, 1, 1) == reason
    assert stream.reader.counters[reason] == 1


def test_layout_change_in_same_slot_is_picked_up(stream: Stream) -> None:
    stream.writer.write(0, np.zeros((2, 2), np.float32), timestamp_ns=0)
    a = stream.reader.read(0, 0)
    stream.writer.write(8, np.ones((3, 5), np.int64), timestamp_ns=0)
    b = stream.reader.read(0, 8)
    assert a is not None and b is not None
    assert b.array is not None and b.array.shape == (3, 5) and b.array.dtype == np.int64
    stream.writer.write(16, np.zeros((2, 2), np.float32), timestamp_ns=0)
    c = stream.reader.read(0, 16)
    assert c is not None and c.layout is a.layout, "known layouts are reused"
    assert c.array is not None and c.array is not a.array, "each read returns its own view"


# --- torn reads --------------------------------------------------------------------------------
class _Hook(dict):  # type: ignore[type-arg]
    """Fault injection: run ``action`` when the reader looks up a pool stride — i.e. after its
    first seq_commit load and header read, before its second load. Impossible to time otherwise
    in a single process."""

    def __init__(self, base: dict[int, int], action) -> None:  # type: ignore[no-untyped-def]
        super().__init__(base)
        self.action = action

    def get(self, key, default=None):  # type: ignore[no-untyped-def]
        self.action()
        return super().get(key, default)


def test_s15_3_seq_commit_changing_between_loads_is_torn(stream: Stream) -> None:
    stream.writer.write(1, np.ones(8), timestamp_ns=0)
    stream.reader._pool_stride = _Hook(
        stream.reader._pool_stride,
        lambda: stream.writer.write(9, np.full(8, 9.0), timestamp_ns=0),
    )
    assert _drop(stream, 1, 1) == Reason.TORN_READ
    assert Reason.TORN_READ in LATE_REASONS


def test_s15_3_in_progress_store_between_loads_is_torn(stream: Stream) -> None:
    stream.writer.write(1, np.ones(8), timestamp_ns=0)
    stream.reader._pool_stride = _Hook(
        stream.reader._pool_stride,
        lambda: stream.writer.begin(9),
    )
    assert _drop(stream, 1, 1) == Reason.TORN_READ


def test_s15_3_bad_looking_header_while_rewritten_counts_as_torn_not_malformed(
    stream: Stream,
) -> None:
    stream.writer.write(1, np.ones(8), timestamp_ns=0)

    def rewrite_and_break() -> None:
        stream.writer.begin(9)
        _poke(stream, 1, 16, U16, 42)

    stream.reader._pool_stride = _Hook(stream.reader._pool_stride, rewrite_and_break)
    assert _drop(stream, 1, 1) == Reason.TORN_READ
    assert stream.reader.counters[Reason.UNKNOWN_POOL_ID] == 0


def test_s8_3_zero_copy_view_revalidated_after_use(stream: Stream) -> None:
    stream.writer.write(2, np.full(32, 2, np.int32), timestamp_ns=0)
    got = stream.reader.read(2, 2)
    assert got is not None and stream.reader.is_current(got)
    stream.writer.write(10, np.full(32, 10, np.int32), timestamp_ns=0)
    assert got.array is not None and (got.array == 10).all(), "the view aliases the ring"
    assert not stream.reader.is_current(got)
    assert stream.reader.counters[Reason.TORN_READ] == 1


# --- construction rules ---------------------------------------------------------------------
def test_writer_needs_writable_regions(stream: Stream) -> None:
    with pytest.raises(PermissionError):
        SlotWriter(stream.header_ro, stream.pools_ro)


def test_memory_order_gate(stream: Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    assert memory_order_supported() == (platform.machine() in ("x86_64", "AMD64"))
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")  # fault injection: other CPU
    assert not memory_order_supported()
    with pytest.raises(UnsupportedPlatform):
        SlotReader(stream.header_ro, stream.pools_ro)
    with pytest.raises(UnsupportedPlatform):
        SlotWriter(stream.header, stream.pools)
    r = SlotReader(stream.header_ro, stream.pools_ro, allow_weak_memory_order=True)
    r.close()


# --- property: anything the writer accepts reads back identically ----------------------------
_DT = st.sampled_from(["u1", "i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f4", "<f8", "?"])


@st.composite
def _frames(draw: st.DrawFn) -> np.ndarray:
    ndim = draw(st.integers(1, 8))
    shape = tuple(draw(st.integers(0, 4 if ndim < 4 else 2)) for _ in range(ndim))
    dt = np.dtype(draw(_DT))
    a = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dt).reshape(shape)
    kind = draw(st.sampled_from(["C", "F", "slice"]))
    if kind == "F":
        a = np.asfortranarray(a)
    elif kind == "slice" and ndim >= 1:
        a = a[tuple(slice(None, None, draw(st.integers(1, 2))) for _ in range(ndim))]
    return a


@pytest.fixture(scope="module")
def shared_stream(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    s = make_stream(str(tmp_path_factory.mktemp("seqlock")), nslots=4, strides={1: 4096, 2: 65536})
    yield s, itertools.count()
    s.close()


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(arr=_frames())
def test_s8_3_property_write_then_read_round_trips(shared_stream, arr: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    s, counter = shared_stream
    seq = next(counter)
    idx = s.writer.write(seq, arr, timestamp_ns=seq, meta_version=seq & 0xFFFF)
    assert idx is not None
    got = s.reader.read(idx, seq)
    assert got is not None, s.reader.last_drop_reason
    assert got.values_len_bytes == arr.nbytes and got.meta_version == seq & 0xFFFF
    if arr.nbytes == 0:
        assert got.array is None
    else:
        assert got.array is not None and got.array.dtype == arr.dtype
        np.testing.assert_array_equal(got.array, arr)
    assert s.reader.is_current(got)


def test_s15_3_seq_commit_decrease_in_slot_is_stale(stream: Stream) -> None:
    """§15.3: a slot whose seq_commit went backwards is stale, even if a descriptor names it."""
    stream.writer.write(11, np.ones(4), timestamp_ns=0)
    assert stream.reader.read(3, 11) is not None
    stream.writer.write(3, np.ones(4), timestamp_ns=0)  # a stale producer rewinds slot 3
    assert _drop(stream, 3, 3) == Reason.SEQ_COMMIT_REGRESSED
    assert Reason.SEQ_COMMIT_REGRESSED in LATE_REASONS
    stream.writer.write(19, np.ones(4), timestamp_ns=0)
    assert stream.reader.read(3, 19) is not None


def test_s8_2_padding_and_pad_align_are_ignored(stream: Stream) -> None:
    """Reserved bytes are opaque: consumers MUST ignore them (SlotHeader pad, TensorHeader pad
    and pad_align may hold producer-specific data)."""
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    idx = stream.writer.write(1, a, timestamp_ns=0)
    off = header_slot_offset(idx)
    mm = stream.header.mmap
    mm[off + 34 : off + 60] = b"\xa5" * 26
    mm[off + 147 : off + 256] = b"\x5a" * 109
    mm[off + 72 + 5] = 0x77  # pad_align
    got = stream.reader.read(idx, 1)
    assert got is not None and got.array is not None
    np.testing.assert_array_equal(got.array, a)


def test_s15_1_big_endian_hosts_rejected(stream: Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(sys, "byteorder", "big")  # fault injection: a big-endian host
    with pytest.raises(UnsupportedPlatform):
        SlotReader(stream.header_ro, stream.pools_ro, allow_weak_memory_order=True)


def test_s15_21_read_never_waits_for_an_in_progress_slot(stream: Stream) -> None:
    """§15.21 rule 5: no blocking or spinning; an in-progress slot is dropped at once."""
    stream.writer.begin(2)
    for _ in range(3):
        assert _drop(stream, 2, 2) == Reason.NOT_COMMITTED
    assert stream.reader.counters[Reason.NOT_COMMITTED] == 3
