"""Prefix reads of a frame still being written (Wire §10.2.2 prefix safety, §8.3 seqlock).

Real SHM files and mappings (the ``stream`` fixture): the writer claims a slot, writes the
header and part of the payload, and the reader copies the filled prefix, validated by the
slot's commit word like any read (shm/seqlock.py, "Prefix reads").
"""

from __future__ import annotations

import numpy as np
from _shm_helpers import Stream

from tensorpool.counters import Reason
from tensorpool.shm import TensorLayout
from tensorpool.shm.layout import Dtype, MajorOrder, ProgressUnit
from tensorpool.shm.seqlock import (
    PREFIX_EXCEEDS_VALUES_LEN,
    PREFIX_NOT_LAYOUT_SAFE,
    PREFIX_SLOT_REUSED,
    prefix_safe,
)


def _claim(s: Stream, seq: int, layout: TensorLayout, rows: int) -> np.ndarray:
    """Claim ``seq``, write its header (as a producer with progress does), fill ``rows``."""
    idx = s.writer.begin(seq)
    s.writer.write_header(
        idx, pool_id=1, layout=layout, values_len_bytes=layout.extent_bytes, timestamp_ns=1
    )
    view = s.writer.payload_view(1, idx, layout)
    view[:rows] = seq + np.arange(rows, dtype=np.int64)[:, None]
    return view


def test_s10_2_2_prefix_of_an_in_progress_frame_is_copied_and_shaped_as_rows(
    stream: Stream,
) -> None:
    layout = TensorLayout.contiguous((8, 16), np.int32)
    _claim(stream, 3, layout, 5)
    got = stream.reader.read_prefix(3 & 7, 3, 5 * 64)
    assert not isinstance(got, str), got
    rows = got.rows()
    assert rows is not None and rows.shape == (5, 16)
    np.testing.assert_array_equal(rows[:, 0], 3 + np.arange(5))
    assert got.data.flags.owndata  # a copy: the producer is still writing the slot
    # a frame read of the same slot still refuses it: the frame is not committed yet
    assert stream.reader.read(3 & 7, 3) is None
    assert stream.reader.last_drop_reason == Reason.NOT_COMMITTED


def test_s10_2_2_partial_row_is_in_data_but_not_in_rows(stream: Stream) -> None:
    layout = TensorLayout.contiguous((8, 16), np.int32)
    _claim(stream, 2, layout, 3)
    got = stream.reader.read_prefix(2, 2, 3 * 64 + 10)
    assert not isinstance(got, str)
    assert len(got.data) == 3 * 64 + 10 and got.rows().shape == (3, 16)  # type: ignore[union-attr]


def test_s10_2_2_prefix_of_the_committed_frame_is_still_accepted(stream: Stream) -> None:
    layout = TensorLayout.contiguous((8, 16), np.int32)
    _claim(stream, 4, layout, 8)
    stream.writer.commit(4)
    got = stream.reader.read_prefix(4, 4, layout.extent_bytes)
    assert not isinstance(got, str)
    assert got.rows().shape == (8, 16)  # type: ignore[union-attr]


def test_s8_3_prefix_of_a_reused_slot_is_refused(stream: Stream) -> None:
    """The slot now holds a newer frame (in progress or committed): the old prefix is gone."""
    layout = TensorLayout.contiguous((8, 16), np.int32)
    _claim(stream, 1, layout, 2)
    stream.writer.commit(1)
    _claim(stream, 1 + 8, layout, 1)  # same slot, next lap
    assert stream.reader.read_prefix(1, 1, 64) == PREFIX_SLOT_REUSED
    stream.writer.commit(9)
    assert stream.reader.read_prefix(1, 1, 64) == PREFIX_SLOT_REUSED
    # a progress message for a frame the slot has not reached yet is a mismatch, not a reuse
    assert stream.reader.read_prefix(1, 17, 64) == Reason.SEQ_MISMATCH
    assert stream.reader.counters.total() == 0  # prefix refusals are the caller's to count


def test_s10_2_2_filled_beyond_values_len_is_refused(stream: Stream) -> None:
    layout = TensorLayout.contiguous((8, 16), np.int32)
    _claim(stream, 5, layout, 8)
    assert stream.reader.read_prefix(5, 5, layout.extent_bytes + 1) == PREFIX_EXCEEDS_VALUES_LEN


def test_s10_2_2_strided_layout_without_progress_unit_is_not_prefix_safe(stream: Stream) -> None:
    """§10.2.2: not contiguous and ``progress_unit=NONE``: bytes filled are informational only."""
    padded = TensorLayout(int(Dtype.INT32), int(MajorOrder.ROW), (8, 16), (128, 4))
    assert not prefix_safe(padded)
    _claim(stream, 6, padded, 8)
    assert stream.reader.read_prefix(6, 6, 128) == PREFIX_NOT_LAYOUT_SAFE


def test_s10_2_2_strided_layout_with_rows_unit_is_prefix_safe(stream: Stream) -> None:
    rows = TensorLayout(
        int(Dtype.INT32), int(MajorOrder.ROW), (8, 16), (128, 4), int(ProgressUnit.ROWS), 128
    )
    assert prefix_safe(rows)
    _claim(stream, 7, rows, 8)
    got = stream.reader.read_prefix(7, 7, 3 * 128)
    assert not isinstance(got, str)
    assert got.rows() is None  # not dense: the caller interprets rows by progress_stride_bytes
    assert got.layout.progress_stride_bytes == 128


def test_s10_2_2_reader_may_copy_less_than_filled(stream: Stream) -> None:
    """Only the first row of a large prefix (the consumer's choice; still validated)."""
    layout = TensorLayout.contiguous((8, 16), np.int32)
    _claim(stream, 3, layout, 6)
    got = stream.reader.read_prefix(3, 3, 6 * 64, max_bytes=64)
    assert not isinstance(got, str)
    assert got.bytes_filled == 64 and got.rows().shape == (1, 16)  # type: ignore[union-attr]
