"""Header ring indexing and payload pool mapping/selection (§9, §10.2.1, §15.5, §15.18)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _shm_helpers import make_stream

from tensorpool.counters import Reason
from tensorpool.shm import (
    PoolTable,
    SlotReader,
    SlotWriter,
    SuperblockError,
    SuperblockFields,
    check_ring_shape,
    create_region,
    header_index_for,
)


def test_s15_18_header_index_is_seq_masked_by_nslots() -> None:
    assert [header_index_for(s, 8) for s in (0, 1, 7, 8, 9, 2**40 + 3)] == [0, 1, 7, 0, 1, 3]


def test_s9_smallest_fitting_pool_selected() -> None:
    table = PoolTable({1: 1 << 20, 2: 4096, 3: 1 << 16})
    assert table.select(0) == 2
    assert table.select(4096) == 2
    assert table.select(4097) == 3
    assert table.select(1 << 16) == 3
    assert table.select((1 << 16) + 1) == 1
    assert table.select(1 << 20) == 1
    assert table.pool_ids == (2, 3, 1)
    assert table.max_stride == 1 << 20
    assert table.stride_of(3) == 1 << 16 and table.stride_of(9) is None


def test_s9_no_pool_fits_returns_none() -> None:
    assert PoolTable({1: 4096}).select(4097) is None


def test_s9_equal_strides_resolve_deterministically() -> None:
    assert PoolTable({7: 4096, 5: 4096}).select(10) == 5


def test_s9_pool_table_needs_a_pool() -> None:
    with pytest.raises(ValueError):
        PoolTable({})


def test_s9_writer_drops_frame_when_no_pool_fits(shm_base: str) -> None:
    """§9: the producer MUST drop (not block) when values_len exceeds every stride."""
    s = make_stream(shm_base, strides={1: 4096, 2: 8192})
    try:
        before = bytes(s.header.mmap[:])
        assert s.writer.write(0, np.zeros(8193, np.uint8), timestamp_ns=1) is None
        assert s.writer.counters[Reason.NO_POOL_FITS] == 1
        assert s.writer.last_drop_reason == Reason.NO_POOL_FITS
        assert bytes(s.header.mmap[:]) == before, "a dropped frame must not touch the ring"
    finally:
        s.close()


def test_s9_writer_uses_smallest_fitting_pool_and_payload_slot_equals_header_index(
    shm_base: str,
) -> None:
    s = make_stream(shm_base, strides={1: 4096, 2: 8192, 3: 16384})
    try:
        for seq, n in [(0, 100), (1, 4096), (2, 4097), (3, 8193), (9, 16384)]:
            idx = s.writer.write(seq, np.full(n, seq, np.uint8), timestamp_ns=seq)
            assert idx == seq & 7
            got = s.reader.read(idx, seq)
            assert got is not None
            assert got.pool_id == s.writer.pools.select(n)
            assert got.array is not None and (got.array == seq).all()
            # §15.5 / §9: payload slot == header index, at 64 + i * stride in that pool
            stride = s.writer.pools.stride_of(got.pool_id)
            assert (
                got.array.ctypes.data
                - np.frombuffer(s.pools_ro[got.pool_id - 1].mmap, np.uint8).ctypes.data
                == 64 + idx * stride
            )
    finally:
        s.close()


def test_s15_5_pools_must_share_header_nslots(shm_base: str) -> None:
    d = os.path.join(shm_base, "e")
    h = create_region(
        os.path.join(d, "header.ring"),
        SuperblockFields.header_ring(epoch=1, stream_id=1, nslots=8, now_ns=1),
    )
    p = create_region(
        os.path.join(d, "payload-1.pool"),
        SuperblockFields.payload_pool(
            epoch=1, stream_id=1, pool_id=1, nslots=16, stride_bytes=4096, now_ns=1
        ),
    )
    try:
        for build in (
            lambda: check_ring_shape(h, [p]),
            lambda: SlotWriter(h, [p]),
            lambda: SlotReader(h, [p]),
        ):
            with pytest.raises(SuperblockError) as info:
                build()
            assert info.value.reason == Reason.SUPERBLOCK_NSLOTS_MISMATCH
        with pytest.raises(SuperblockError) as info:
            check_ring_shape(p, [h])
        assert info.value.reason == Reason.SUPERBLOCK_REGION_TYPE_MISMATCH
    finally:
        h.close()
        p.close()


# --- the one ring scan (#14 section 1) ------------------------------------------------------------
def _ring_bytes(nslots: int, words: dict[int, int]) -> bytearray:
    from tensorpool.shm.layout import HEADER_SLOT_BYTES, SUPERBLOCK_SIZE

    buf = bytearray(SUPERBLOCK_SIZE + nslots * HEADER_SLOT_BYTES)
    for index, word in words.items():
        off = SUPERBLOCK_SIZE + index * HEADER_SLOT_BYTES
        buf[off : off + 8] = word.to_bytes(8, "little")
        buf[off + 8 : off + 12] = (100 + index).to_bytes(4, "little")  # values_len_bytes
    return buf


def test_s8_3_ring_scan_classifies_slots_and_finds_the_head() -> None:
    """#14: one ring scan in shm/ (consumer join head, Spark scans, inspect occupancy)."""
    from tensorpool.shm.ring import HeaderRingView

    committed = lambda seq: (seq << 1) | 1  # noqa: E731
    buf = _ring_bytes(8, {0: committed(8), 1: committed(9), 2: 10 << 1, 5: committed(4)})
    ring = HeaderRingView(buf, 8)
    scan = ring.scan()
    assert scan.seq.tolist() == [8, 9, 10, -1, -1, 4, -1, -1]
    assert scan.committed.tolist() == [True, True, False, False, False, True, False, False]
    assert scan.in_progress.tolist() == [False, False, True] + [False] * 5
    assert int(scan.empty.sum()) == 4
    assert scan.misplaced(8).tolist() == [False] * 5 + [True, False, False]  # 4 is not slot 5
    assert scan.head_seq() == 9 and ring.head_seq() == 9
    assert ring.sizes(8, 3, missing=-7) == [100, 101, -7]  # seq 10 is not committed
    ring.close()
    assert HeaderRingView(_ring_bytes(4, {}), 4).head_seq() == -1


def test_ring_scan_newest_seq_follows_a_slot_rewritten_during_the_scan() -> None:
    """A slot whose second load differs was rewritten meanwhile: it is not committed, and it
    holds the newer seq (the first load's frame is gone), committed or still being written."""
    import numpy as np

    from tensorpool.shm.ring import RingScan

    c = lambda seq: (seq << 1) | 1  # noqa: E731
    w1 = np.array([c(8), c(1), c(2), 0, c(4)], np.uint64)
    w2 = np.array([c(8), c(9), 10 << 1, c(3), c(4)], np.uint64)
    scan = RingScan(np.arange(5, dtype=np.intp), w1, w2, np.empty(0))
    assert scan.committed.tolist() == [True, False, False, False, True]
    assert scan.seq.tolist() == [8, 1, 2, -1, 4]
    assert scan.newest_seq.tolist() == [8, 9, 10, 3, 4]


def test_no_raw_seq_commit_loads_outside_shm() -> None:
    """#14: only shm/ reads ``seq_commit`` words (the seqlock reader and the ring scan)."""
    import pathlib

    import tensorpool

    root = pathlib.Path(tensorpool.__file__).parent
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.parts[len(root.parts)] not in ("shm", "specs")
        and any(p in path.read_text() for p in ('cast("Q")', "np.uint64)[", "_SEQ_WORD"))
    ]
    assert offenders == []
