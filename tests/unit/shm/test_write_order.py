"""#14 §4, Wire §8.3 / §15.18: the order of stores in `SlotWriter.write`.

The order of stores inside one process is not observable from outside without racing a
reader, so this test instruments the one thing the order is about: the commit word. The
writer's word view is wrapped by a recorder (the only fake: it injects an otherwise
unobservable ordering) that, at each store to a commit word, snapshots the real mapped header
slot and payload slot. §8.3: the slot is marked in progress (even) *before* any payload or
header byte of the frame changes, and committed (odd) only *after* all of them are written.
Each of the mutants "committed first" and "payload after commit" fails it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
from _shm_helpers import Stream, make_stream

from tensorpool.shm.layout import HEADER_SLOT_BYTES, SUPERBLOCK_SIZE


class _RecordingWords:
    """Delegates to the real word view; records (word index, value, header, payload) on store."""

    def __init__(self, words: object, snapshot) -> None:  # type: ignore[no-untyped-def]
        self._words = words
        self._snapshot = snapshot
        self.stores: list[tuple[int, int, bytes, bytes]] = []

    def __getitem__(self, i: int) -> int:
        return self._words[i]  # type: ignore[index,no-any-return]

    def __setitem__(self, i: int, value: int) -> None:
        header, payload = self._snapshot()
        self.stores.append((i, value, header, payload))
        self._words[i] = value  # type: ignore[index]


@pytest.fixture
def stream() -> Iterator[Stream]:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as base:
        s = make_stream(base, nslots=8, strides={1: 4096})
        try:
            yield s
        finally:
            s.close()


def test_14_4_write_marks_in_progress_first_and_commits_last(stream: Stream) -> None:
    """#14 §4 (§8.3, §15.18): even store before any frame byte, odd store after all of them."""
    seq, stride = 11, 4096
    index = seq & 7
    hoff = SUPERBLOCK_SIZE + index * HEADER_SLOT_BYTES
    poff = SUPERBLOCK_SIZE + index * stride
    array = np.arange(1000, dtype=np.uint8) + 1
    header_mm, pool_mm = stream.header.mmap, stream.pools[0].mmap

    def snapshot() -> tuple[bytes, bytes]:
        return bytes(header_mm[hoff + 8 : hoff + HEADER_SLOT_BYTES]), bytes(
            pool_mm[poff : poff + array.nbytes]
        )

    before = snapshot()
    writer = stream.writer
    rec = _RecordingWords(writer._words, snapshot)
    writer._words = rec  # type: ignore[assignment]
    assert writer.write(seq, array, timestamp_ns=5) == index
    after = snapshot()
    assert after[1] == array.tobytes() and after[0] != before[0]

    commit_word = hoff >> 3
    stores = [(i, v) for i, v, _, _ in rec.stores]
    assert stores == [(commit_word, seq << 1), (commit_word, (seq << 1) | 1)]
    _, _, header_at_begin, payload_at_begin = rec.stores[0]
    assert (header_at_begin, payload_at_begin) == before, "frame bytes written before begin"
    _, _, header_at_commit, payload_at_commit = rec.stores[1]
    assert payload_at_commit == array.tobytes(), "payload written after the commit"
    assert header_at_commit == after[0], "header written after the commit"
