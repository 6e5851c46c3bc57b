"""Header ring indexing and payload pool selection (§8.1, §9, §15.5).

v1.1 keeps the mapping deliberately simple: ``header_index = seq & (nslots - 1)``, every pool has
the header ring's ``nslots``, and ``payload_slot = header_index``. A frame goes to the pool with
the smallest ``stride_bytes >= values_len_bytes``; if none is large enough the producer drops the
frame (reason ``no_pool_fits``) rather than blocking (§9).

:class:`PoolTable` precomputes the strides in ascending order once; selection is a short linear
scan (deployments have a handful of size classes, where a loop beats ``bisect`` plus indexing).

:class:`HeaderRingView` is the one place outside the seqlock reader that loads ``seq_commit``
words: the vectorized ring scan (§8.3: first load, slot fields, second load) that the consumer
(where the head is at join, §15.4), the Spark readers (which seqs a window holds) and
``tensorpool inspect`` (slot occupancy) share, so no other package reads raw commit words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from tensorpool.counters import Reason
from tensorpool.shm.backend import is_power_of_two
from tensorpool.shm.errors import SuperblockError
from tensorpool.shm.layout import (
    HEADER_SLOT_BYTES,
    SUPERBLOCK_SIZE,
    TENSOR_BLOB_END,
    TENSOR_BLOB_OFFSET,
)
from tensorpool.shm.region import ShmRegion
from tensorpool.specs.generated.wire import SlotHeaderDecoder as _SH

_SEQ_WORD_STEP: Final = HEADER_SLOT_BYTES // 8  # u64 words per header slot
_SEQ_WORD_FIRST: Final = SUPERBLOCK_SIZE // 8
_ONE: Final = np.uint64(1)

#: One header slot as a numpy record (offsets from the generated SlotHeader codec; the
#: TensorHeader bytes as one opaque field). ``seq_commit`` is deliberately not a field: it is
#: loaded only through :meth:`HeaderRingView.seq_words` (whole aligned 8-byte elements).
SLOT_DTYPE: Final = np.dtype(
    {
        "names": [
            "values_len",
            "payload_slot",
            "pool_id",
            "payload_offset",
            "timestamp_ns",
            "meta_version",
            "blob",
        ],
        "formats": [
            "<u4",
            "<u4",
            "<u2",
            "<u4",
            "<u8",
            "<u4",
            f"V{TENSOR_BLOB_END - TENSOR_BLOB_OFFSET}",
        ],
        "offsets": [
            _SH.VALUES_LEN_BYTES_OFFSET,
            _SH.PAYLOAD_SLOT_OFFSET,
            _SH.POOL_ID_OFFSET,
            _SH.PAYLOAD_OFFSET_OFFSET,
            _SH.TIMESTAMP_NS_OFFSET,
            _SH.META_VERSION_OFFSET,
            TENSOR_BLOB_OFFSET,
        ],
        "itemsize": HEADER_SLOT_BYTES,
    }
)


def header_index_for(seq: int, nslots: int) -> int:
    """§15.18 step 1 / §10.2.1: the header slot a logical sequence number lands in."""
    return seq & (nslots - 1)


class PoolTable:
    """Size classes of a stream: ``pool_id -> stride_bytes``, sorted for selection."""

    __slots__ = ("_by_id", "_ordered")

    def __init__(self, strides: Mapping[int, int]) -> None:
        if not strides:
            raise ValueError("a stream needs at least one payload pool")
        self._by_id: dict[int, int] = dict(strides)
        # Ties on stride resolve to the lowest pool_id so selection is deterministic.
        self._ordered: tuple[tuple[int, int], ...] = tuple(
            sorted(((s, pid) for pid, s in self._by_id.items()))
        )

    @classmethod
    def from_regions(cls, pools: Iterable[ShmRegion]) -> PoolTable:
        return cls({p.pool_id: p.stride_bytes for p in pools})

    def select(self, values_len_bytes: int) -> int | None:
        """Pool id of the smallest stride that holds ``values_len_bytes``, or None (no fit)."""
        for stride, pool_id in self._ordered:
            if stride >= values_len_bytes:
                return pool_id
        return None

    def stride_of(self, pool_id: int) -> int | None:
        return self._by_id.get(pool_id)

    @property
    def pool_ids(self) -> tuple[int, ...]:
        return tuple(pid for _, pid in self._ordered)

    @property
    def max_stride(self) -> int:
        return self._ordered[-1][0]

    def __len__(self) -> int:
        return len(self._by_id)


def check_ring_shape(header: ShmRegion, pools: Iterable[ShmRegion]) -> None:
    """§15.5: every pool has the header ring's ``nslots``; the ring size is a power of two."""
    if not header.is_header_ring:
        raise SuperblockError(Reason.SUPERBLOCK_REGION_TYPE_MISMATCH, f"{header!r} is not a ring")
    if not is_power_of_two(header.nslots):
        raise SuperblockError(Reason.SUPERBLOCK_NSLOTS_NOT_POWER_OF_TWO, str(header.nslots))
    for pool in pools:
        if pool.is_header_ring:
            raise SuperblockError(Reason.SUPERBLOCK_REGION_TYPE_MISMATCH, f"{pool!r} not a pool")
        if pool.nslots != header.nslots:
            raise SuperblockError(
                Reason.SUPERBLOCK_NSLOTS_MISMATCH,
                f"pool {pool.pool_id} has {pool.nslots} slots, header ring {header.nslots}",
            )


@dataclass(frozen=True, slots=True)
class RingScan:
    """What every scanned slot held, seqlock-checked as a whole (§8.3).

    ``word1``/``word2`` are the two ``seq_commit`` loads around the copy of ``fields`` (the
    slot records); a slot counts as :attr:`committed` only when its commit bit is set and both
    loads agree, i.e. the fields copied in between belong to that commit.
    """

    index: np.ndarray  # slot indices scanned (intp)
    word1: np.ndarray  # first seq_commit load (uint64)
    word2: np.ndarray  # second seq_commit load (uint64)
    fields: np.ndarray  # SLOT_DTYPE records copied between the two loads

    @property
    def seq(self) -> np.ndarray:
        """The logical seq each slot held at the first load (int64; -1: never written)."""
        seq = (self.word1 >> _ONE).astype(np.int64)
        seq[self.word1 == 0] = -1
        return seq

    @property
    def newest_seq(self) -> np.ndarray:
        """The newest seq each slot is known to have held (int64; -1: never written): the
        second load's where the producer rewrote the slot during the scan, else :attr:`seq`.

        A loss count needs this one: a slot rewritten between the loads is not committed, and
        by :attr:`seq` it would still hold its old frame -- a frame then neither readable nor
        overwritten, which an exact count (the Spark source's ``lost``) silently misses.
        Slots only move forward, so the larger word is the later one.
        """
        w = np.maximum(self.word1, self.word2)
        seq = (w >> _ONE).astype(np.int64)
        seq[w == 0] = -1
        return seq

    @property
    def empty(self) -> np.ndarray:
        return self.word1 == 0

    @property
    def committed(self) -> np.ndarray:
        """Commit bit set and unchanged across the scan (fields are that frame's)."""
        return ((self.word1 & _ONE) == _ONE) & (self.word1 == self.word2)

    @property
    def in_progress(self) -> np.ndarray:
        """Being written at the first load, or rewritten during the scan."""
        return (self.word1 != 0) & ~self.committed

    def misplaced(self, nslots: int) -> np.ndarray:
        """Committed slots whose seq does not belong at their index (§15.18: ``seq & mask``;
        computed as ``seq % nslots`` so a corrupt, non-power-of-two ring is judged too)."""
        seq = (self.word1 >> _ONE).astype(np.int64)
        return self.committed & ((seq % nslots) != self.index)

    def head_seq(self) -> int:
        """The newest committed seq in the scan, -1 if none."""
        ok = self.committed
        if not ok.any():
            return -1
        return int((self.word1[ok] >> _ONE).max())


class HeaderRingView:
    """Vectorized read-only view of a header ring's slots (superblock included in ``buf``).

    ``buf`` must hold at least ``nslots`` complete slots. Each ``seq_commit`` element of
    :meth:`seq_words` is one aligned 8-byte load (racy across slots, each value whole), the
    same guarantee :class:`~tensorpool.shm.seqlock.SlotReader` relies on.
    """

    __slots__ = ("_lens", "_words", "mask", "nslots", "slots")

    def __init__(self, buf: Any, nslots: int) -> None:
        size = SUPERBLOCK_SIZE + nslots * HEADER_SLOT_BYTES
        self.nslots = nslots
        self.mask = nslots - 1
        self._words = np.frombuffer(buf, np.uint64, size // 8)[_SEQ_WORD_FIRST::_SEQ_WORD_STEP]
        self._lens = np.frombuffer(buf, np.uint32, size // 4)[
            (SUPERBLOCK_SIZE + _SH.VALUES_LEN_BYTES_OFFSET) // 4 :: HEADER_SLOT_BYTES // 4
        ]
        self.slots = np.frombuffer(buf, SLOT_DTYPE, nslots, SUPERBLOCK_SIZE)

    def seq_words(self, idx: np.ndarray | None = None) -> np.ndarray:
        """``seq_commit`` of the slots ``idx`` (all slots if None): a fresh array of loads."""
        return self._words.copy() if idx is None else self._words[idx]

    def values_len(self, idx: np.ndarray | None = None) -> np.ndarray:
        return self._lens.copy() if idx is None else self._lens[idx]

    def scan(self, idx: np.ndarray | None = None) -> RingScan:
        """The seqlock scan: ``seq_commit`` loads, slot records, ``seq_commit`` loads again."""
        if idx is None:
            idx = np.arange(self.nslots, dtype=np.intp)
        w1 = self._words[idx]
        fields = self.slots[idx]
        w2 = self._words[idx]
        return RingScan(idx, w1, w2, fields)

    def head_seq(self) -> int:
        """The newest committed seq in the ring now (-1 if none): where a joining consumer
        starts counting (frames before it were queued before the join)."""
        w = self._words
        committed = (w & _ONE) == _ONE
        if not committed.any():
            return -1
        return int((w[committed] >> _ONE).max())

    def sizes(self, first: int, count: int, missing: int) -> list[int]:
        """``values_len_bytes`` of frames ``[first, first+count)``; ``missing`` for a frame
        whose slot no longer holds it committed."""
        if count <= 0:
            return []
        seqs = np.arange(first, first + count, dtype=np.uint64)
        idx = (seqs & np.uint64(self.mask)).astype(np.intp)
        ok = self._words[idx] == ((seqs << _ONE) | _ONE)
        return np.where(ok, self._lens[idx].astype(np.int64), missing).tolist()

    def close(self) -> None:
        """Drop the numpy views so the mapping can be closed."""
        self._words = np.empty(0, np.uint64)
        self._lens = np.empty(0, np.uint32)
        self.slots = np.empty(0, SLOT_DTYPE)
