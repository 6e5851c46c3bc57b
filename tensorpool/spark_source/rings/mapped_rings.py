"""Mapped rings for the Spark source: driver-side scans and executor-side reads into Arrow.

Both sides of Spark map the same SHM files, described by a picklable :class:`RegionSpec` (a
copy of the announce). Mappings are cached per process in a module-level LRU keyed by
``(header path, epoch)``: a Spark Python worker runs many tasks, and re-validating and
re-mapping regions per task would dominate short micro-batches. An epoch is never reused, so a
cached mapping can never describe another producer's regions; the cache only needs bounding.

Driver side: :meth:`MappedStream.scan` uses the ring scan of ``shm/``
(:class:`~tensorpool.shm.ring.HeaderRingView`, the only reader of raw ``seq_commit`` words
besides the seqlock reader) and reports the seq each slot holds: the committed window
``[oldest, head)``, and the committed seqs themselves when they have gaps (a relay stream keeps
its source's seq numbers). A normal producer's committed slots always hold one contiguous run.

Executor side: :func:`read_range` reads ``[first, end)`` -- or exactly the planned seq ``runs``
-- with the seqlock of §8.3 through
:class:`~tensorpool.shm.seqlock.SlotReader` (commit word and descriptor-seq check, header
validation), copies each payload *once* into a preallocated Arrow data buffer, then re-checks
``seq_commit`` (§8.3 final check) and discards the frame if the producer touched the slot
meanwhile. Frames that are gone are data loss: the caller decides whether to fail or skip.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from tensorpool.client.announce import CLOCK_MONOTONIC, AnnouncedPool, StreamLayout
from tensorpool.client.mapping import map_stream
from tensorpool.counters import Reason
from tensorpool.shm.errors import ShmError, TensorLayoutError
from tensorpool.shm.layout import SUPERBLOCK_SIZE, TENSOR_BLOB_READ
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.ring import SLOT_DTYPE, HeaderRingView, RingScan
from tensorpool.shm.seqlock import SlotReader
from tensorpool.shm.tensor import TensorLayout
from tensorpool.spark_source.plan.offsets import REGIONS_GONE, RingState, iter_seq_chunks

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

MAX_CACHED_MAPPINGS: Final = 16
#: Arrow batches aim at this many payload bytes (Spark moves them as one Arrow IPC message).
TARGET_BATCH_BYTES: Final = 32 << 20
MAX_BATCH_ROWS: Final = 8192

#: Slot-read drop reasons that mean "the frame was there but is gone now" (lost to overrun).
OVERRUN_REASONS: Final = frozenset(
    {Reason.NOT_COMMITTED, Reason.SEQ_MISMATCH, Reason.TORN_READ, Reason.SEQ_COMMIT_REGRESSED}
)
REGION_UNAVAILABLE: Final = REGIONS_GONE
_SKIPPABLE: Final = frozenset({Reason.NOT_COMMITTED, Reason.SEQ_MISMATCH})


@dataclass(frozen=True, slots=True)
class RegionSpec:
    """Everything needed to map one epoch of one stream (picklable, from an announce)."""

    stream_id: int
    epoch: int
    layout_version: int
    nslots: int
    header_uri: str
    pools: tuple[tuple[int, int, str], ...]  # (pool_id, stride_bytes, uri)
    clock_domain: int = CLOCK_MONOTONIC

    @classmethod
    def from_layout(cls, layout: StreamLayout) -> RegionSpec:
        return cls(
            stream_id=layout.stream_id,
            epoch=layout.epoch,
            layout_version=layout.layout_version,
            nslots=layout.header_nslots,
            header_uri=layout.header_region_uri,
            pools=tuple((p.pool_id, p.stride_bytes, p.region_uri) for p in layout.pools),
            clock_domain=layout.clock_domain,
        )

    @property
    def max_stride(self) -> int:
        return max(stride for _, stride, _ in self.pools)

    def layout(self) -> StreamLayout:
        """The announce fields :func:`~tensorpool.client.mapping.map_stream` maps and validates
        by (the producer id, slot size and announce time are not needed to map)."""
        return StreamLayout(
            stream_id=self.stream_id,
            producer_id=0,
            epoch=self.epoch,
            layout_version=self.layout_version,
            header_nslots=self.nslots,
            header_slot_bytes=0,
            header_region_uri=self.header_uri,
            pools=tuple(AnnouncedPool(i, self.nslots, st, uri) for i, st, uri in self.pools),
            announce_timestamp_ns=0,
            clock_domain=self.clock_domain,
        )


class MappedStream:
    """One stream's header ring and pools, mapped read-only and validated (§15.1, §15.22)."""

    def __init__(self, spec: RegionSpec, base_dirs: tuple[str, ...]) -> None:
        regions = map_stream(spec.layout(), PathPolicy(base_dirs))
        header = regions[0]
        try:
            self.reader = SlotReader(header, regions[1:])
        except BaseException:
            for r in regions:
                r.close()
            raise
        self.spec = spec
        self.regions = regions
        self._ident = _file_ident(header.path)
        self.mask = spec.nslots - 1
        self.max_stride = spec.max_stride
        self.ring = HeaderRingView(header.mmap, spec.nslots)
        self.slots = self.ring.slots
        self.pool_views = {r.pool_id: memoryview(r.mmap) for r in regions[1:]}
        self.pool_u8 = {r.pool_id: np.frombuffer(r.mmap, np.uint8) for r in regions[1:]}
        self.pool_strides = {r.pool_id: r.stride_bytes for r in regions[1:]}
        self.layouts: dict[bytes, TensorLayout] = {}

    def is_current(self) -> bool:
        """Whether the header ring file at its path is still the one mapped (not removed or
        replaced since): a layout remembered between plans must still describe the files."""
        return self._ident is not None and _file_ident(self.regions[0].path) == self._ident

    def layout_of(self, blob: bytes) -> TensorLayout | None:
        """The validated layout of a TensorHeader's bytes (cached), None if invalid."""
        hit = self.layouts.get(blob)
        if hit is None:
            try:
                hit = TensorLayout.from_blob_fields(TENSOR_BLOB_READ.unpack(blob))
            except TensorLayoutError:
                return None
            if len(self.layouts) >= 256:
                self.layouts.clear()
            self.layouts[blob] = hit
        return hit

    # --- driver side ------------------------------------------------------------------------
    def scan(self) -> RingState:
        """What every slot holds now (an upper bound on what is still readable later)."""
        return ring_state(self.spec.epoch, self.ring.scan())

    def close(self) -> None:
        self.reader.close()
        for v in self.pool_views.values():
            v.release()
        self.pool_views = {}
        self.ring.close()
        self.slots = np.empty(0, SLOT_DTYPE)
        self.pool_u8 = {}
        for r in self.regions:
            r.close()


def ring_state(epoch: int, scan: RingScan) -> RingState:
    """A header ring scan as the planners' :class:`RingState` (here and in ``serve``).

    A slot the producer rewrote during the scan holds its newer seq (``newest_seq``): its
    old frame is overwritten, and the plan must count it lost, not lose track of it."""
    return RingState.from_slots(
        epoch,
        scan.newest_seq,
        scan.committed,
        np.ascontiguousarray(scan.fields["values_len"]),
        np.ascontiguousarray(scan.fields["timestamp_ns"]),
    )


_CACHE: OrderedDict[tuple[str, int], MappedStream] = OrderedDict()
#: a shared announce probe's keeper thread validates new layouts here while a task may read
_CACHE_LOCK = threading.Lock()


def mapped(
    spec: RegionSpec, base_dirs: tuple[str, ...], *, revalidate: bool = False
) -> MappedStream:
    """The process-wide mapping of ``spec`` (mapped on first use, LRU-bounded).

    ``revalidate``: map anew when the cached mapping's header file was removed or replaced (a
    producer directory wiped and recreated starts its epochs again; an announce validated
    against the old files would be wrong). The old mapping is dropped, not closed: a reader
    may still hold it, and it closes with its last reference."""
    key = (spec.header_uri, spec.epoch)
    with _CACHE_LOCK:
        m = _CACHE.get(key)
        if m is not None and m.spec == spec and not (revalidate and not m.is_current()):
            _CACHE.move_to_end(key)
            return m
        m = MappedStream(spec, base_dirs)
        _CACHE[key] = m
        while len(_CACHE) > MAX_CACHED_MAPPINGS:
            _, old = _CACHE.popitem(last=False)
            old.close()
        return m


def _file_ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def still_mapped(spec: RegionSpec) -> bool:
    """Whether this process holds a mapping of ``spec`` whose header ring file is still there."""
    with _CACHE_LOCK:
        m = _CACHE.get((spec.header_uri, spec.epoch))
    return m is not None and m.spec == spec and m.is_current()


def layout_still_mapped(layout: StreamLayout) -> bool:
    """:func:`still_mapped` of an announced layout (a shared probe's ``is_current``)."""
    return still_mapped(RegionSpec.from_layout(layout))


# --- executor side -------------------------------------------------------------------------------
_META_CACHE: dict[TensorLayout, tuple[str, list[int], list[int]]] = {}


def _meta(layout: TensorLayout) -> tuple[str, list[int], list[int]]:
    """Column values of a layout, computed once per distinct TensorHeader (bounded)."""
    hit = _META_CACHE.get(layout)
    if hit is None:
        if len(_META_CACHE) >= 4096:
            _META_CACHE.clear()
        hit = (layout.dtype.name.lower(), list(layout.dims), list(layout.strides))
        _META_CACHE[layout] = hit
    return hit


def wall_clock_offset_ns(clock_domain: int) -> int:
    """Add this to a frame's ``timestamp_ns`` to get wall-clock time on this host.

    Frames are stamped with CLOCK_MONOTONIC (Wire Spec §15.x recommends it for latency); that
    clock is host-wide, and executors run on the producer's host, so the shift is exact up to
    NTP slewing between the two samples. REALTIME_SYNCED stamps are wall-clock already.
    """
    if clock_domain != CLOCK_MONOTONIC:
        return 0
    return time.time_ns() - time.monotonic_ns()


#: on_loss(seq, reason) -> None; may raise to fail the task (failOnDataLoss=true)
LossFn = Callable[[int, str], None]


class _BufferPool:
    """Reusable Arrow data buffers (a fresh 32 MiB allocation costs ~10 ms of page faults).

    A buffer is handed out again only when nothing but the pool references it any more: the
    Arrow buffer wrapping it (and so the RecordBatch that used it) holds a reference, which
    ``sys.getrefcount`` sees. Spark writes each yielded batch to the JVM before asking for the
    next, so in practice two buffers alternate; if a consumer keeps batches, new ones are made.
    """

    def __init__(self, keep: int = 3) -> None:
        self._keep = keep
        self._bufs: list[np.ndarray] = []

    def get(self, nbytes: int) -> np.ndarray:
        for buf in self._bufs:
            # 3 = the list's reference + the loop variable + getrefcount's argument
            if buf.nbytes >= nbytes and sys.getrefcount(buf) <= 3:
                return buf
        buf = np.empty(nbytes, np.uint8)
        self._bufs.append(buf)
        if len(self._bufs) > self._keep:
            # forget the smallest idle one (a busy one stays alive through its batch anyway)
            self._bufs.sort(key=lambda b: b.nbytes)
            self._bufs.pop(0)
        return buf


_POOL = _BufferPool()


def rows_per_batch(max_stride: int) -> int:
    return max(1, min(MAX_BATCH_ROWS, TARGET_BATCH_BYTES // max(1, max_stride)))


def read_range(
    spec: RegionSpec,
    base_dirs: tuple[str, ...],
    first: int,
    end: int,
    *,
    include_meta: bool,
    on_loss: LossFn,
    schema: pa.Schema,
    runs: np.ndarray | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield Arrow batches of frames ``[first, end)``; report every frame not delivered.

    With ``runs`` (``(k, 2)`` seq runs ``[a, b)`` inside ``[first, end)``, what the plan found
    committed) exactly those seqs are read and each one missing is loss. Without, every seq of
    the range is tried and one whose slot holds an older seq (or none) is taken as never
    published (relay streams have gaps), not as loss.
    """
    lost_seqs: Iterable[int] = (
        range(first, end) if runs is None else (s for a, b in runs.tolist() for s in range(a, b))
    )
    try:
        m = mapped(spec, base_dirs)
    except (ShmError, OSError) as exc:
        log.warning(
            "stream %d epoch %d: regions unavailable (%s); frames %d..%d are lost",
            spec.stream_id,
            spec.epoch,
            exc,
            first,
            end - 1,
        )
        for seq in lost_seqs:
            on_loss(seq, REGION_UNAVAILABLE)
        return
    step = rows_per_batch(m.max_stride)
    shift = wall_clock_offset_ns(spec.clock_domain)
    chunks: Iterator[np.ndarray]
    if runs is not None:
        chunks = iter_seq_chunks(runs, step)
    else:
        chunks = (
            np.arange(at, min(end, at + step), dtype=np.int64) for at in range(first, end, step)
        )
    explicit = runs is not None
    for seqs in chunks:
        batch = _read_chunk_fast(m, seqs, include_meta, shift, schema)
        if batch is None:  # anything unusual: the per-frame path sorts it out and counts it
            batch = _read_chunk(m, seqs, include_meta, on_loss, shift, schema, explicit)
        if batch is not None:
            yield batch


def _read_chunk_fast(
    m: MappedStream,
    seqs: np.ndarray,
    include_meta: bool,
    shift: int,
    schema: pa.Schema,
) -> pa.RecordBatch | None:
    """The seqlock of §8.3 over a whole chunk at once, for the common case.

    Per frame the order of the checks is the spec's: ``seq_commit`` (committed and equal to
    ``seq << 1 | 1``) is loaded before the slot header and the payload, and loaded again after
    them; only frames whose two loads agree are kept. Done with numpy gathers over the chunk
    (each ``seq_commit`` element is one aligned 8-byte load), which turns ~6 µs per frame into
    a few numpy calls per chunk. Returns None -- and the per-frame path takes over -- unless
    every frame is present and intact and all share one pool and one TensorHeader. ``seqs``
    ascending; consecutive seqs (a normal stream) are copied as slot runs, others slot by slot.
    """
    import pyarrow as pa

    n = len(seqs)
    idx = seqs & m.mask
    expect = (seqs.astype(np.uint64) << np.uint64(1)) | np.uint64(1)
    w1 = m.ring.seq_words(idx)
    if not np.array_equal(w1, expect):
        return None
    hdr = m.slots[idx]
    pool_ids = hdr["pool_id"]
    pool_id = int(pool_ids[0])
    stride = m.pool_strides.get(pool_id)
    if (
        stride is None
        or not (pool_ids == pool_id).all()
        or hdr["payload_offset"].any()
        or not np.array_equal(hdr["payload_slot"], idx)
    ):
        return None
    blobs = hdr["blob"]
    if not (blobs == blobs[0]).all():
        return None
    layout = m.layout_of(blobs[0].tobytes())
    if layout is None:
        return None
    lens = hdr["values_len"].astype(np.int64)
    if (lens > stride).any() or ((lens < layout.extent_bytes) & (lens != 0)).any():
        return None
    total = int(lens.sum())
    if total >= 2**31:
        return None  # binary offsets are int32
    data = _POOL.get(max(total, 1))
    _copy_payloads(m, seqs, idx, lens, pool_id, stride, data)
    if not np.array_equal(m.ring.seq_words(idx), w1):
        return None  # torn: the producer overtook us during the copy
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lens, out=offsets[1:])
    meta: list[pa.Array] | None = None
    if include_meta:
        dt, dims, st = _meta(layout)
        nd = len(dims)
        offs = pa.array(np.arange(0, (n + 1) * nd, nd, dtype=np.int32))
        meta = [
            pa.array(hdr["meta_version"].view(np.int32)),
            pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [dt]).cast(pa.string()),
            pa.ListArray.from_arrays(offs, pa.array(np.tile(np.asarray(dims, np.int32), n))),
            pa.ListArray.from_arrays(offs, pa.array(np.tile(np.asarray(st, np.int32), n))),
        ]
    stamps = hdr["timestamp_ns"].astype(np.int64)
    return _frames_batch(m, seqs, stamps, shift, meta, offsets, data[:total], schema)


def _copy_payloads(
    m: MappedStream,
    seqs: np.ndarray,
    idx: np.ndarray,
    lens: np.ndarray,
    pool_id: int,
    stride: int,
    data: np.ndarray,
) -> None:
    """Copy the frames' payloads (one pool) back to back into ``data``: consecutive seqs of
    one length as slot runs, others slot by slot."""
    n = len(seqs)
    src = m.pool_u8[pool_id]
    vl = int(lens[0])
    if (lens == vl).all() and int(seqs[-1]) - int(seqs[0]) == n - 1:
        # consecutive seqs sit in consecutive slots: one 2-D copy per run (two if it wraps)
        out = data[: n * vl].reshape(n, vl)
        at = 0
        while at < n:
            i0 = int(idx[at])
            k = min(n - at, m.spec.nslots - i0)
            base = SUPERBLOCK_SIZE + i0 * stride
            if vl == stride:  # back-to-back payloads: one flat memcpy
                data[at * vl : (at + k) * vl] = src[base : base + k * stride]
            else:
                np.copyto(
                    out[at : at + k], src[base : base + k * stride].reshape(k, stride)[:, :vl]
                )
            at += k
    else:
        dst = memoryview(data)
        view = m.pool_views[pool_id]
        pos = 0
        for i, length in zip(idx.tolist(), lens.tolist(), strict=True):
            base = SUPERBLOCK_SIZE + i * stride
            dst[pos : pos + length] = view[base : base + length]
            pos += length


def _frames_batch(
    m: MappedStream,
    seqs: np.ndarray,
    stamps: np.ndarray,
    shift: int,
    meta: list[pa.Array] | None,
    offsets: np.ndarray,
    payload: np.ndarray,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """The frames as one batch in the source's schema (``meta``: the tensor columns)."""
    import pyarrow as pa

    n = len(seqs)
    cols: list[pa.Array] = [
        pa.array(np.full(n, m.spec.stream_id, np.int32)),
        pa.array(np.full(n, m.spec.epoch, np.int64)),
        pa.array(seqs),
        pa.array((stamps + shift) // 1000, pa.timestamp("us", tz="UTC")),
        pa.array(stamps),
    ]
    if meta is not None:
        cols += meta
    cols.append(
        pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(payload)])
    )
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _read_chunk(
    m: MappedStream,
    chunk: np.ndarray,
    include_meta: bool,
    on_loss: LossFn,
    shift: int,
    schema: pa.Schema,
    explicit: bool = False,
) -> pa.RecordBatch | None:
    """Frame by frame through :class:`SlotReader`; every planned frame not delivered is loss.

    ``explicit``: the seqs were found committed at planning, so any that fails is loss. A range
    read (not explicit) skips a seq whose slot holds an older frame or none (never published).
    """
    import pyarrow as pa

    n_max = len(chunk)
    data = _POOL.get(n_max * m.max_stride)
    dst = memoryview(data)
    offsets = np.zeros(n_max + 1, np.int32)
    seqs = np.empty(n_max, np.int64)
    stamps = np.empty(n_max, np.int64)
    metas = np.empty(n_max, np.int64)
    dtypes: list[str] = []
    shape_vals: list[int] = []
    stride_vals: list[int] = []
    shape_offs = [0]
    reader = m.reader
    read = reader.read
    is_current = reader.is_current
    mask = m.mask
    views = m.pool_views
    strides = m.pool_strides
    pos = 0
    n = 0
    slot_seq = reader.slot_seq
    for seq in chunk.tolist():
        index = seq & mask
        r = read(index, seq)
        if r is None:
            # A slot only ever moves forward in seq. If it holds an older frame (or none),
            # `seq` was never published: a relay (rate limiter, bridge) keeps its source's
            # numbering, so its seqs have gaps. Not data loss. A newer seq is ambiguous in a
            # range read; planned reads pass the exact seqs (explicit) and never guess.
            reason = reader.last_drop_reason
            if not explicit and reason in _SKIPPABLE and slot_seq(index) < seq:
                continue
            on_loss(seq, reason or Reason.TORN_READ)
            continue
        vl = r.values_len_bytes
        if vl:
            src = SUPERBLOCK_SIZE + index * strides[r.pool_id]
            dst[pos : pos + vl] = views[r.pool_id][src : src + vl]
        if not is_current(r):  # §8.3: the producer rewrote the slot while we copied
            on_loss(seq, Reason.TORN_READ)
            continue
        pos += vl
        offsets[n + 1] = pos
        seqs[n] = seq
        stamps[n] = r.timestamp_ns
        metas[n] = r.meta_version
        if include_meta:
            dt, dims, st = _meta(r.layout)
            dtypes.append(dt)
            shape_vals += dims
            stride_vals += st
            shape_offs.append(len(shape_vals))
        n += 1
    if n == 0:
        return None
    meta: list[pa.Array] | None = None
    if include_meta:
        offs = pa.array(np.asarray(shape_offs, np.int32))
        meta = [
            pa.array(metas[:n].astype(np.uint32).view(np.int32)),
            pa.array(dtypes, pa.string()),
            pa.ListArray.from_arrays(offs, pa.array(np.asarray(shape_vals, np.int32))),
            pa.ListArray.from_arrays(offs, pa.array(np.asarray(stride_vals, np.int32))),
        ]
    return _frames_batch(m, seqs[:n], stamps[:n], shift, meta, offsets[: n + 1], data[:pos], schema)


__all__ = [
    "OVERRUN_REASONS",
    "REGION_UNAVAILABLE",
    "MappedStream",
    "RegionSpec",
    "layout_still_mapped",
    "mapped",
    "read_range",
    "ring_state",
    "rows_per_batch",
    "still_mapped",
    "wall_clock_offset_ns",
]
