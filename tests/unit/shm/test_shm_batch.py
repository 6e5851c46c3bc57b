"""The batch seqlock (issue #15, ``shm/batch.py``): every row gets the per-frame reader's verdict
and drop reason (§8.3, §15.3, §15.21), and the batch writer follows §8.3's order per row."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from _shm_helpers import Stream, make_stream

from tensorpool.counters import Reason
from tensorpool.shm import SlotReader, TensorLayout, header_slot_offset
from tensorpool.shm.batch import BatchReader, BatchWriter

U16 = struct.Struct("<H")
I16 = struct.Struct("<h")
U32 = struct.Struct("<I")
NSLOTS = 16


@pytest.fixture
def ring(shm_base: str):
    s = make_stream(shm_base, nslots=NSLOTS, strides={1: 4096, 2: 16384})
    try:
        yield s
    finally:
        s.close()


def _poke(s: Stream, idx: int, slot_offset: int, fmt: struct.Struct, value: int) -> None:
    fmt.pack_into(s.header.mmap, header_slot_offset(idx) + slot_offset, value)


def _fill(s: Stream, first: int, n: int, shape: tuple[int, ...] = (4, 8)) -> None:
    for seq in range(first, first + n):
        s.writer.write(seq, np.full(shape, seq, np.float32), timestamp_ns=1000 + seq)


def _both(s: Stream, seqs: list[int], idx: list[int] | None = None):
    """Per-frame verdicts and counters vs the batch reader's, on two fresh readers."""
    idx = [q & (NSLOTS - 1) for q in seqs] if idx is None else idx
    one = SlotReader(s.header_ro, s.pools_ro)
    per_frame = [one.read(i, q, True) is not None for i, q in zip(idx, seqs, strict=True)]
    many = SlotReader(s.header_ro, s.pools_ro)
    batch = BatchReader(many).read(np.array(seqs), np.array(idx), copy=True)
    assert batch.valid.tolist() == per_frame
    assert many.counters.snapshot() == one.counters.snapshot()
    return batch, one.counters.snapshot()


# --- corruptions: same reason row by row --------------------------------------------------------
@pytest.mark.parametrize(
    ("slot_offset", "fmt", "value", "reason"),
    [
        (18, U32, 64, Reason.PAYLOAD_OFFSET_NONZERO),
        (12, U32, 99, Reason.PAYLOAD_SLOT_OUT_OF_RANGE),
        (12, U32, 2, Reason.PAYLOAD_SLOT_MISMATCH),
        (16, U16, 9, Reason.UNKNOWN_POOL_ID),
        (8, U32, 4097, Reason.VALUES_LEN_EXCEEDS_STRIDE),
        (8, U32, 31, Reason.VALUES_LEN_BELOW_EXTENT),
        (72, I16, 0, Reason.DTYPE_UNKNOWN),
        (70, U16, 2, Reason.EMBEDDED_VERSION_INVALID),
        (76, struct.Struct("<B"), 9, Reason.NDIMS_OUT_OF_RANGE),
    ],
)
def test_s8_3_s15_21_corrupt_header_in_a_batch_is_the_per_frame_reason(
    ring: Stream, slot_offset: int, fmt: struct.Struct, value: int, reason: str
) -> None:
    _fill(ring, 0, 8)
    _poke(ring, 5, slot_offset, fmt, value)
    batch, counts = _both(ring, list(range(8)))
    assert counts == {reason: 1}
    assert batch.valid.tolist() == [k != 5 for k in range(8)]
    assert batch.reasons()[5] == reason
    assert batch.array is not None  # the other seven still share one layout: stacked
    np.testing.assert_array_equal(batch.array[batch.valid][:, 0, 0], [0, 1, 2, 3, 4, 6, 7])


def test_s8_3_not_committed_mismatch_and_out_of_range(ring: Stream) -> None:
    _fill(ring, 0, 8)
    ring.writer.begin(3)  # in progress
    seqs = [0, 1, 2, 3, 4, 21, 6, 7]  # 21 lands in slot 5, which holds 5
    idx = [0, 1, 2, 3, 4, 5, 6, 99]
    batch, counts = _both(ring, seqs, idx)
    assert counts == {
        Reason.NOT_COMMITTED: 1,
        Reason.SEQ_MISMATCH: 1,
        Reason.HEADER_INDEX_OUT_OF_RANGE: 1,
    }
    assert batch.valid.tolist() == [True, True, True, False, True, False, True, False]


def test_s15_3_regressed_commit_word_is_dropped(ring: Stream) -> None:
    _fill(ring, 16, 4)  # slots 0..3 hold 16..19
    reader = SlotReader(ring.header_ro, ring.pools_ro)
    br = BatchReader(reader)
    assert br.read_run(16, 4, copy=True).valid.all()
    _fill(ring, 0, 4)  # a stale producer writes older seqs into the same slots
    batch = br.read_run(0, 4, copy=True)
    assert not batch.valid.any()
    assert reader.counters.snapshot() == {Reason.SEQ_COMMIT_REGRESSED: 4}


def test_mixed_layouts_and_pools_come_back_per_row(ring: Stream) -> None:
    ring.writer.write(0, np.ones(4, np.int32), timestamp_ns=0)
    ring.writer.write(1, np.zeros((3, 3), np.float64), timestamp_ns=0)
    ring.writer.write(2, np.arange(3000, dtype=np.uint16), timestamp_ns=0)  # pool 2
    batch, counts = _both(ring, [0, 1, 2])
    assert counts == {} and batch.array is None
    shapes = [a.shape for a in batch.arrays]  # type: ignore[union-attr]
    assert shapes == [(4,), (3, 3), (3000,)]
    assert int(batch.arrays[2][-1]) == 2999  # type: ignore[index]


# --- zero copy and the final check --------------------------------------------------------------
def test_s8_3_zero_copy_run_is_one_view_and_confirm_catches_overwrites(ring: Stream) -> None:
    _fill(ring, 0, 8)
    reader = SlotReader(ring.header_ro, ring.pools_ro)
    br = BatchReader(reader)
    batch = br.read_run(0, 8)
    assert batch.valid.all() and not batch.copied
    assert batch.array is not None and batch.array.shape == (8, 4, 8)
    assert not batch.array.flags.owndata and batch.timestamps_ns.tolist() == list(range(1000, 1008))
    ring.writer.write(16 + 2, np.zeros((4, 8), np.float32), timestamp_ns=0)  # laps slot 2
    assert batch.confirm() == 7
    assert batch.reasons()[2] == Reason.TORN_READ
    assert reader.counters.snapshot() == {Reason.TORN_READ: 1}
    assert batch.confirm() == 7 and reader.counters[Reason.TORN_READ] == 1  # idempotent


def test_wrapping_run_is_read_as_one_gather(ring: Stream) -> None:
    _fill(ring, 12, 8)  # slots 12..15, 0..3
    reader = SlotReader(ring.header_ro, ring.pools_ro)
    batch = BatchReader(reader).read_run(12, 8)
    assert batch.valid.all() and batch.copied  # no single view across the wrap: copied
    assert batch.array is not None
    assert batch.array[:, 0, 0].tolist() == list(range(12, 20))


def test_15_lapped_head_answers_only_once_the_producer_is_half_a_ring_ahead(ring: Stream) -> None:
    reader = BatchReader(SlotReader(ring.header_ro, ring.pools_ro))
    _fill(ring, 0, NSLOTS // 2)  # seqs 0..7: the slot of 0 + nslots/2 is still unwritten
    assert reader.lapped_head(0) == -1
    _fill(ring, NSLOTS // 2, 2 * NSLOTS + 1)  # the producer reaches seq 40
    assert reader.lapped_head(0) == 40  # the slot of 8 holds 40: the max over the ring
    assert reader.lapped_head(33) == -1  # the slot of 41 holds 25: not there yet
    # one bad word cannot push the head more than a lap past the probed slot's seq
    _poke(ring, 3, 0, struct.Struct("<Q"), (10**9 << 1) | 1)
    assert reader.lapped_head(0) == 40 + NSLOTS - 1
    reader.close()
    assert reader.lapped_head(0) == -1


def test_confirm_after_close_proves_nothing(ring: Stream) -> None:
    _fill(ring, 0, 2)
    reader = SlotReader(ring.header_ro, ring.pools_ro)
    br = BatchReader(reader)
    batch = br.read_run(0, 2)
    br.close()
    assert batch.confirm() == 0 and reader.counters[Reason.TORN_READ] == 2


# --- writer ---------------------------------------------------------------------------------------
def test_s8_3_batch_writer_slots_read_back_like_per_frame_writes(ring: Stream) -> None:
    bw = BatchWriter(ring.writer)
    layout = TensorLayout.contiguous((4, 8), np.dtype(np.float32))
    claim = bw.claim(14, 5, layout, 1)
    assert claim.n == 2 and claim.header_index == 14  # stops at the wrap
    claim.array[:] = np.arange(14, 16, dtype=np.float32)[:, None, None]
    # in progress: readers drop until the commit
    assert ring.reader.read(14, 14) is None
    assert ring.reader.last_drop_reason == Reason.NOT_COMMITTED
    bw.commit(claim, np.array([7, 8], np.uint64), 3)
    for seq, ts in ((14, 7), (15, 8)):
        got = ring.reader.read(seq & (NSLOTS - 1), seq)
        assert got is not None
        assert (got.timestamp_ns, got.meta_version, got.pool_id) == (ts, 3, 1)
        assert got.layout == layout and got.values_len_bytes == layout.extent_bytes
        np.testing.assert_array_equal(got.array, np.full((4, 8), seq, np.float32))
    # the slot bytes equal what the per-frame writer would have written (full overwrite)
    hdr = bytes(ring.header.mmap[header_slot_offset(14) : header_slot_offset(15)])
    ring.writer.write(14, np.full((4, 8), 14, np.float32), timestamp_ns=7, meta_version=3)
    assert bytes(ring.header.mmap[header_slot_offset(14) : header_slot_offset(15)]) == hdr
