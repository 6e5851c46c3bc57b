"""Seqlock boundaries the mutation check (#14.4, docs/compliance/mutation.md) found untested.

Each test pins one edge of a rule of ``shm/seqlock.py`` that a surviving mutant moved: the
valid seq range of the claim/commit path (§8.3, §15.18), the payload slot address (§8.2),
a tensor filling the whole stride (§8.2, §10.2.1), and the writer's and reader's layout/view
caches, which must never hand out the previous frame's dtype, order or pool.
"""

from __future__ import annotations

import numpy as np
import pytest
from _shm_helpers import Stream

from tensorpool.shm import TensorLayout, header_slot_offset
from tensorpool.shm.layout import Dtype, MajorOrder
from tensorpool.shm.seqlock import MAX_SEQ


def _word(s: Stream, idx: int) -> int:
    return s.header.words[header_slot_offset(idx) >> 3]


@pytest.mark.parametrize("seq", [0, MAX_SEQ])
def test_s8_3_s15_18_claim_and_commit_accept_the_first_and_the_largest_seq(
    stream: Stream, seq: int
) -> None:
    """§8.3: a logical seq is any value in 0..2**63-1; ``begin``/``commit`` take both ends."""
    idx = stream.writer.begin(seq)
    assert _word(stream, idx) == seq << 1
    layout = TensorLayout(Dtype.UINT8, MajorOrder.ROW, (4,))
    stream.writer.payload_view(1, idx, layout)[:] = [1, 2, 3, 4]
    stream.writer.write_header(idx, pool_id=1, layout=layout, values_len_bytes=4, timestamp_ns=0)
    assert stream.writer.commit(seq) == idx
    assert _word(stream, idx) == (seq << 1) | 1
    got = stream.reader.read(idx, seq)
    assert got is not None and got.array is not None
    assert got.array.tolist() == [1, 2, 3, 4]


def test_s8_2_payload_claim_of_slot_n_is_payload_slot_n(stream: Stream) -> None:
    """§8.2: payload slot ``i`` starts at ``superblock + i * stride`` -- the claim buffer the
    writer hands out for slot 3 is the one the reader reads for header index 3."""
    seq = 3
    idx = stream.writer.begin(seq)
    buf = stream.writer.payload(1, idx)
    buf[:8] = np.arange(10, 18, dtype=np.uint8)
    layout = TensorLayout(Dtype.UINT8, MajorOrder.ROW, (8,))
    stream.writer.write_header(idx, pool_id=1, layout=layout, values_len_bytes=8, timestamp_ns=0)
    stream.writer.commit(seq)
    got = stream.reader.read(idx, seq)
    assert got is not None and got.array is not None
    assert got.array.tolist() == list(range(10, 18))


def test_s8_2_tensor_filling_the_whole_stride_is_accepted_in_slot_0(stream: Stream) -> None:
    """§8.2/§10.2.1: ``extent <= values_len_bytes <= stride`` -- both equalities are valid,
    and header index 0 is a slot like any other."""
    layout = TensorLayout(Dtype.UINT8, MajorOrder.ROW, (4096,))  # pool 1 stride is 4096
    idx = stream.writer.begin(0)
    assert idx == 0
    stream.writer.payload_view(1, idx, layout)[:] = 7
    stream.writer.write_header(0, pool_id=1, layout=layout, values_len_bytes=4096, timestamp_ns=0)
    stream.writer.commit(0)
    got = stream.reader.read(0, 0)
    assert got is not None and got.values_len_bytes == 4096 and got.pool_id == 1


def test_s8_3_consecutive_writes_of_one_shape_keep_their_own_dtype_order_and_wire_dtype(
    stream: Stream,
) -> None:
    """The writer caches the last layout: a frame with the same shape but another dtype, major
    order or wire dtype must still be described by its own TensorHeader (§8.3)."""
    frames = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(12, dtype=np.int32).reshape(3, 4),  # dtype changes, shape does not
        np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),  # order changes
    ]
    for seq, a in enumerate(frames):
        idx = stream.writer.write(seq, a, timestamp_ns=0)
        assert idx is not None
        got = stream.reader.read(idx, seq)
        assert got is not None and got.array is not None
        assert got.array.dtype == a.dtype
        np.testing.assert_array_equal(got.array, a)
    assert stream.reader.read(2, 2).layout.major_order == MajorOrder.COLUMN  # type: ignore[union-attr]
    a = np.zeros(4, np.uint8)
    stream.writer.write(3, a, timestamp_ns=0)
    stream.writer.write(4, a, timestamp_ns=0, wire_dtype=int(Dtype.BYTES))
    got = stream.reader.read(4, 4)
    assert got is not None and got.layout.dtype == Dtype.BYTES


def test_s8_2_reader_never_reuses_a_view_of_the_slot_in_another_pool(stream: Stream) -> None:
    """A header slot whose next frame (same TensorHeader) lives in another payload pool is read
    from that pool, not through the view cached for the slot's previous frame (§8.2, §15.5)."""
    small = np.full(16, 1, np.uint8)
    stream.writer.write(1, small, timestamp_ns=0)  # pool 1 (stride 4096)
    first = stream.reader.read(1, 1)
    assert first is not None and first.pool_id == 1
    layout = stream.writer.layout_for(small)
    idx = stream.writer.begin(9)  # same header slot (9 & 7 == 1), same layout, pool 2
    stream.writer.payload_view(2, idx, layout)[:] = 2
    stream.writer.write_header(idx, pool_id=2, layout=layout, values_len_bytes=16, timestamp_ns=0)
    stream.writer.commit(9)
    second = stream.reader.read(1, 9)
    assert second is not None and second.pool_id == 2 and second.array is not None
    assert second.array.tolist() == [2] * 16
