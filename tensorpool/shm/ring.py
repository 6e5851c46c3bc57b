"""Header ring indexing and payload pool selection (§8.1, §9, §15.5).

v1.1 keeps the mapping deliberately simple: ``header_index = seq & (nslots - 1)``, every pool has
the header ring's ``nslots``, and ``payload_slot = header_index``. A frame goes to the pool with
the smallest ``stride_bytes >= values_len_bytes``; if none is large enough the producer drops the
frame (reason ``no_pool_fits``) rather than blocking (§9).

:class:`PoolTable` precomputes the strides in ascending order once; selection is a short linear
scan (deployments have a handful of size classes, where a loop beats ``bisect`` plus indexing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tensorpool.counters import Reason
from tensorpool.shm.backend import is_power_of_two
from tensorpool.shm.errors import SuperblockError
from tensorpool.shm.region import ShmRegion


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
