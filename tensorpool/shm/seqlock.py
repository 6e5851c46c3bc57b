"""The ``seq_commit`` seqlock over header slots (§8.3, §15.3, §15.18, §15.21).

Writer (single writer per region)::

    seq_commit = seq << 1            # in progress           (one aligned 8-byte store)
    payload bytes                    # memcpy / DMA / caller fills a writable view
    slot header + embedded TensorHeader, full overwrite
    seq_commit = (seq << 1) | 1      # committed             (one aligned 8-byte store)

Reader, given ``FrameDescriptor(seq, header_index)``::

    w1 = seq_commit                  # one aligned 8-byte load
    drop if w1 is even (not committed) or w1 >> 1 != seq (slot reused: stale or overwritten)
    drop if w1 is below the last word accepted from this slot (§15.3: regression is stale)
    read + validate slot header and embedded TensorHeader, build the payload view
    w2 = seq_commit                  # one aligned 8-byte load
    drop if w2 != w1 (torn: the producer rewrote the slot while we looked)

Memory ordering — what Python actually does, and why it is enough on x86-64
---------------------------------------------------------------------------
Python has no atomics or fences, so correctness rests on (a) each ``seq_commit`` access being a
single aligned 8-byte machine load/store, and (b) the CPU not reordering the surrounding accesses.

(a) Single 8-byte accesses. The obvious tool, ``struct.pack_into("<Q", ...)``, is *not* one: in
CPython 3.12 the little-endian ``Q`` packer calls ``_PyLong_AsByteArray``, which writes the eight
bytes one at a time, and the ``<Q`` unpacker assembles the value from eight byte loads
(disassembly of ``lp_ulonglong``/``lu_ulonglong`` in ``_struct``). A reader could see half an old
and half a new word. We therefore access ``seq_commit`` only through ``memoryview.cast("Q")``:
``pack_single``/``memory_item`` in ``Objects/memoryobject.c`` copy the value with a fixed-size
8-byte ``memcpy``, which the compiler emits as one ``mov`` — verified in the shipped
``libpython3.12.so`` (``mov %r14,(%r12)`` after ``PyLong_AsUnsignedLongLong``;
``mov (%rdi),%rdi`` before ``PyLong_FromUnsignedLongLong``). Every slot starts at
``64 + i * 256`` of a page-aligned mapping, so the word is 8-byte aligned and inside one cache
line; aligned 8-byte accesses are single-copy atomic on x86-64. (Native-order ``struct`` ``"Q"``
and numpy ``uint64`` element assignment also compile to one ``mov``; the memoryview is the
cheapest of the three.)

(b) Ordering. x86-64 is TSO: stores become visible in program order, loads are not reordered
with older loads, and ``rep movs``/vector ``memcpy`` stores are not reordered with the stores
around them (glibc ends its non-temporal large-copy path with ``sfence``). Each Python-level
access is a separate C call through the interpreter, so the compiler cannot move the mmap stores
across one another either. Hence in-progress → payload → header → committed is observed in that
order by any other core, and the reader's second ``seq_commit`` load happens after its header
loads: store-release / load-acquire semantics come for free. That is the supported platform.

aarch64 (and other weakly ordered CPUs) give no such guarantee: stores may become visible out of
order and loads may be satisfied early, and CPython emits no ``dmb``/``stlr``/``ldar`` for these
accesses, so a reader could accept a committed word while still seeing old payload bytes. We do
not paper over that: :class:`SlotWriter` and :class:`SlotReader` raise
:class:`~tensorpool.shm.errors.UnsupportedPlatform` off x86-64 unless constructed with
``allow_weak_memory_order=True`` — an explicit, documented acceptance of possible torn reads
(e.g. for tests or for data where occasional corruption is tolerable). Closing that gap needs a
native fence (a tiny C extension or a future ``atomics`` module); see the compliance notes.

The batch path (``shm/batch.py``): the same order, one numpy operation per step
-------------------------------------------------------------------------------
:class:`~tensorpool.shm.batch.BatchWriter` and :class:`~tensorpool.shm.batch.BatchReader` do
each seqlock step for many slots in one numpy call. Why that is as safe as the per-frame code:

(a) Each ``seq_commit`` access is still one aligned 8-byte load or store. The batch code reads
and writes the words only through a ``uint64`` view whose elements are the slots' aligned
``seq_commit`` fields (stride 256 bytes); numpy copies aligned 8-byte elements with its
``_aligned_strided_to_*_size8`` loops, one ``uint64`` assignment (one ``mov``) per element. A
strided gather or scatter of 8-byte elements cannot be merged into wider accesses (the elements
are 256 bytes apart), and were it ever done with AVX-512 scatter/gather, those access each
element as its own naturally aligned 8-byte load/store.

(b) Ordering per slot is what the protocol needs, and TSO keeps program order across the calls.
The writer issues, for the whole run of slots, all in-progress stores, then all payload stores,
then all header stores, then all committed stores. For any one slot that is exactly §8.3's
order (in progress < payload < header < committed in program order), and x86-64 makes stores
visible in program order, so a reader that sees slot *i*'s committed word also sees its payload
and header. Interleaving *across* slots does not matter: each slot has its own word. The reader
issues all first word loads, then all header loads and the payload gather (or, zero-copy, the
caller's reads of the views), then all second word loads; loads are not reordered with older
loads on x86-64, so each slot's header/payload loads happen between its two word loads. A
slot rewritten in between changes its word (the seq, hence the word, only grows), so the two
loads differ and the row is dropped as ``torn_read``. Every numpy call is an opaque C call from
the interpreter, so no compiler can move one step's accesses across another's.

(c) aarch64: the batch classes are built from a :class:`SlotWriter`/:class:`SlotReader` and so
inherit their platform check: refused off x86-64 unless ``allow_weak_memory_order=True``. A
batch makes the weak-ordering window no smaller, and numpy emits no barriers either (``dmb ish``
between the steps would be needed: a compiled helper, not worth it while x86-64 is the target).

The cross-process stress test covers both paths (``tests/unit/shm/test_shm_seqlock_stress.py``,
``tests/unit/shm/test_shm_batch_stress.py``): zero torn frames accepted, zero-copy and copied.

Zero-copy views and the seqlock
--------------------------------
:meth:`SlotReader.read` validates the *header* under the seqlock and returns a numpy view of the
payload. Bytes the caller reads from that view *after* ``read`` returns are not covered by the
second check: the producer may overwrite the slot at any time (lossy ring, §15.4). Zero-copy
consumers must therefore call :meth:`SlotReader.is_current` after they are done with the view
(copying, reducing, serialising) and discard the result if it returns False — that is the
spec's step "re-read ``seq_commit``" moved to after the payload read. :meth:`SlotReader.read_copy`
does it for you: it copies the payload before the second load.

Prefix reads of a frame still being written (Wire §10.2.2)
----------------------------------------------------------
A consumer that opted in to ``FrameProgress`` may read the first ``payload_bytes_filled`` bytes
of frame ``S`` before its descriptor: :meth:`SlotReader.read_prefix`. The slot is then usually
*in progress* (``seq_commit == S << 1``), which a frame read refuses; a prefix read accepts that
word, or the committed ``(S << 1) | 1``, and nothing else. The rule that makes it safe is the
same as for frames: the word's seq only grows, so if the first and the second load both name
``S``, the slot was not reused in between and the bytes copied between them are frame ``S``'s
(the producer declared them final when it reported them). A second load naming another seq
means the slot was reused while we copied: the prefix read fails as ``prefix_slot_reused``.
The header must be readable during the write, so a tensorpool producer with progress on writes
the whole header at the claim (§8.3 allows any order inside the in-progress window) and again
at the commit. Interop limit: nothing in a slot ties its header to a seq, so a producer that
writes the header only at the commit leaves the previous lap's header there during the write,
and a prefix read of its in-progress frame would take that layout; the C reference sends
progress only after the commit, where the header is the frame's own. The bytes are copied
before the second load (no zero-copy prefix: the producer is writing the rest of the slot),
and only when the layout makes a prefix meaningful: dense with ``payload_offset == 0``, or a
declared ``progress_unit`` (§10.2.2 "prefix safety"). A prefix read is never a frame: it
changes no frame counter and no ``drops_*``; its refusals are returned as reasons for the
caller to count apart (``ConsumerStats.progress``).

Drop accounting (§15.4): ``not_committed``, ``seq_mismatch``, ``seq_commit_regressed`` and
``torn_read`` (a failed ``is_current`` included) are *late* drops — the frame existed but we
lost the race — and belong in QoS ``drops_late`` (:data:`tensorpool.counters.LATE_REASONS`).
``drops_gap`` is counted by the consumer from gaps in descriptor ``seq``. Every other reason is
a malformed or foreign header: counted, never raised, and a good reason to remap.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable, Mapping
from typing import Final, NamedTuple

import numpy as np

from tensorpool.counters import DropCounters, Reason
from tensorpool.shm.errors import TensorLayoutError, UnsupportedPlatform
from tensorpool.shm.layout import (
    HEADER_SLOT_BYTES,
    SLOT_FIELDS,
    SLOT_FIELDS_OFFSET,
    SLOT_FIELDS_READ,
    SUPERBLOCK_SIZE,
    TENSOR_BLOB_END,
    TENSOR_BLOB_OFFSET,
    TENSOR_BLOB_READ,
    MajorOrder,
    ProgressUnit,
)
from tensorpool.shm.region import ShmRegion
from tensorpool.shm.ring import PoolTable, check_ring_shape
from tensorpool.shm.tensor import TensorLayout

#: CPUs whose memory model (TSO) makes plain aligned loads/stores acquire/release.
STRONGLY_ORDERED_MACHINES: Final = frozenset({"x86_64", "amd64", "AMD64", "x64"})
MAX_SEQ: Final = (1 << 63) - 1
_KNOWN_LAYOUTS_MAX: Final = 1024
#: Prefix-read refusals (Wire §10.2.2) beyond the slot reasons; counted by the consumer apart
#: from frame drops, since the frame itself may still arrive with its descriptor.
PREFIX_SLOT_REUSED: Final = "prefix_slot_reused"
PREFIX_EXCEEDS_VALUES_LEN: Final = "prefix_exceeds_values_len"
PREFIX_NOT_LAYOUT_SAFE: Final = "prefix_not_layout_safe"
# Bound once: attribute lookups are a measurable share of a ~2 µs hot path.
_pack_slot_fields = SLOT_FIELDS.pack_into
_unpack_slot_fields = SLOT_FIELDS_READ.unpack_from
_new_tuple = tuple.__new__


def memory_order_supported() -> bool:
    return platform.machine() in STRONGLY_ORDERED_MACHINES and sys.byteorder == "little"


def _check_platform(allow_weak_memory_order: bool) -> None:
    if sys.byteorder != "little":
        raise UnsupportedPlatform("tensorpool SHM layouts are little-endian only (§15.1)")
    if not allow_weak_memory_order and not memory_order_supported():
        raise UnsupportedPlatform(
            f"seqlock correctness relies on x86-64 TSO; {platform.machine()!r} is weakly "
            "ordered and Python cannot emit fences (pass allow_weak_memory_order=True to accept "
            "possible torn reads)"
        )


def _pools_list(pools: Iterable[ShmRegion] | Mapping[int, ShmRegion]) -> list[ShmRegion]:
    return list(pools.values()) if isinstance(pools, Mapping) else list(pools)


class SlotWriter:
    """The single writer of a header ring and its payload pools.

    Two ways to publish a frame:

    * :meth:`write` copies a numpy array in (pool selection, seqlock, header, payload);
    * claim/commit for zero-copy producers: ``i = begin(seq)``, fill ``payload(pool_id, i)`` (or
      ``payload_view(pool_id, i, layout)``), ``write_header(i, ...)``, ``commit(seq)``.

    Publishing the ``FrameDescriptor`` is the caller's job and must happen after the commit.
    """

    __slots__ = (
        "_hmm",
        "_hmv",
        "_last",
        "_layouts",
        "_mask",
        "_nslots",
        "_pool_mm",
        "_pool_stride",
        "_pool_u8",
        "_strides_ordered",
        "_words",
        "counters",
        "last_drop_reason",
        "pools",
    )

    def __init__(
        self,
        header: ShmRegion,
        pools: Iterable[ShmRegion] | Mapping[int, ShmRegion],
        *,
        counters: DropCounters | None = None,
        allow_weak_memory_order: bool = False,
    ) -> None:
        _check_platform(allow_weak_memory_order)
        pool_list = _pools_list(pools)
        check_ring_shape(header, pool_list)
        for region in (header, *pool_list):
            if not region.writable:
                raise PermissionError(f"{region!r} is not mapped writable")
        self.counters = counters if counters is not None else DropCounters()
        self.last_drop_reason: str | None = None
        self.pools = PoolTable.from_regions(pool_list)
        self._nslots = header.nslots
        self._mask = header.nslots - 1
        self._hmm = header.mmap
        self._hmv = memoryview(header.mmap)
        self._words = header.words
        self._pool_mm = {p.pool_id: p.mmap for p in pool_list}
        self._pool_u8 = {p.pool_id: np.frombuffer(p.mmap, np.uint8) for p in pool_list}
        self._pool_stride = {p.pool_id: p.stride_bytes for p in pool_list}
        self._strides_ordered = tuple((self._pool_stride[pid], pid) for pid in self.pools.pool_ids)
        # (shape, dtype, fortran, wire_dtype) -> (layout, packed embedded header)
        self._layouts: dict[tuple[object, ...], tuple[TensorLayout, bytes]] = {}
        # The previous frame's (shape, dtype, fortran, wire_dtype, layout, blob): producers
        # usually repeat a shape, and four comparisons beat building and hashing a key.
        self._last: tuple[object, ...] = (None, None, None, None, None, None)

    @property
    def nslots(self) -> int:
        return self._nslots

    # --- claim / commit ------------------------------------------------------------------------
    def begin(self, seq: int) -> int:
        """Mark slot ``seq & (nslots-1)`` in progress; return that header index (§15.18 1-3)."""
        if seq < 0 or seq > MAX_SEQ:
            raise ValueError(f"seq {seq} outside 0..2**63-1")
        index = seq & self._mask
        self._words[(SUPERBLOCK_SIZE + index * HEADER_SLOT_BYTES) >> 3] = seq << 1
        return index

    def payload(self, pool_id: int, header_index: int) -> np.ndarray:
        """Writable uint8 view of payload slot ``header_index`` in ``pool_id`` (whole stride)."""
        stride = self._pool_stride[pool_id]
        start = SUPERBLOCK_SIZE + header_index * stride
        return self._pool_u8[pool_id][start : start + stride]

    def payload_view(self, pool_id: int, header_index: int, layout: TensorLayout) -> np.ndarray:
        """Writable view shaped like ``layout`` over the payload slot, for in-place filling."""
        stride = self._pool_stride[pool_id]
        if layout.extent_bytes > stride:
            raise TensorLayoutError(
                Reason.VALUES_LEN_EXCEEDS_STRIDE, f"{layout.extent_bytes} > {stride}"
            )
        return layout.view(self._pool_u8[pool_id], SUPERBLOCK_SIZE + header_index * stride)

    def write_header(
        self,
        header_index: int,
        *,
        pool_id: int,
        layout: TensorLayout,
        values_len_bytes: int,
        timestamp_ns: int,
        meta_version: int = 0,
    ) -> None:
        """Overwrite the whole slot header except ``seq_commit`` (§8.3 step 3)."""
        stride = self._pool_stride.get(pool_id)
        if stride is None:
            raise ValueError(f"unknown pool_id {pool_id}")
        # Wire §8.2: 0 (an empty payload, whatever the dims) or at least the extent
        if values_len_bytes and not layout.extent_bytes <= values_len_bytes <= stride:
            raise TensorLayoutError(
                Reason.VALUES_LEN_BELOW_EXTENT
                if values_len_bytes < layout.extent_bytes
                else Reason.VALUES_LEN_EXCEEDS_STRIDE,
                f"values_len_bytes={values_len_bytes}, extent={layout.extent_bytes}, "
                f"stride={stride}",
            )
        if not 0 <= header_index < self._nslots:
            raise ValueError(f"header_index {header_index} out of range")
        off = SUPERBLOCK_SIZE + header_index * HEADER_SLOT_BYTES
        SLOT_FIELDS.pack_into(
            self._hmm,
            off + SLOT_FIELDS_OFFSET,
            values_len_bytes,
            header_index,
            pool_id,
            0,
            timestamp_ns,
            meta_version,
        )
        self._hmv[off + TENSOR_BLOB_OFFSET : off + HEADER_SLOT_BYTES] = layout.blob

    def commit(self, seq: int) -> int:
        """Publish slot ``seq & (nslots-1)`` as committed (§15.18 step 7); return its index."""
        if seq < 0 or seq > MAX_SEQ:
            raise ValueError(f"seq {seq} outside 0..2**63-1")
        index = seq & self._mask
        self._words[(SUPERBLOCK_SIZE + index * HEADER_SLOT_BYTES) >> 3] = (seq << 1) | 1
        return index

    # --- copy-in convenience -------------------------------------------------------------------
    def layout_for(self, array: np.ndarray, wire_dtype: int | None = None) -> TensorLayout:
        """Layout :meth:`write` uses for ``array``: C order unless the array is F-contiguous."""
        flags = array.flags
        fortran = not flags.c_contiguous and flags.f_contiguous
        key = (array.shape, array.dtype, fortran, wire_dtype)
        cached = self._layouts.get(key)
        if cached is not None:
            return cached[0]
        if len(self._layouts) >= 256:
            self._layouts.clear()
        layout = TensorLayout.contiguous(
            array.shape or (1,), array.dtype, order="F" if fortran else "C", wire_dtype=wire_dtype
        )
        self._layouts[key] = (layout, layout.blob)
        return layout

    def write(
        self,
        seq: int,
        array: np.ndarray,
        *,
        timestamp_ns: int,
        meta_version: int = 0,
        wire_dtype: int | None = None,
    ) -> int | None:
        """Copy ``array`` into the ring as frame ``seq``; return the header index.

        Returns None (and counts ``no_pool_fits``) when no pool is large enough (§9). Raises
        :class:`TensorLayoutError` for arrays the wire cannot describe (dtype, ndim > 8), before
        the slot is touched.
        """
        nbytes = array.nbytes
        pool_id = -1
        stride = 0
        for stride, pid in self._strides_ordered:
            if stride >= nbytes:
                pool_id = pid
                break
        if pool_id < 0:
            self.counters.increment(Reason.NO_POOL_FITS)
            self.last_drop_reason = Reason.NO_POOL_FITS
            return None
        if array.ndim == 0:
            array = array.reshape(1)
        flags = array.flags
        c_contig = flags.c_contiguous
        fortran = not c_contig and flags.f_contiguous
        shape = array.shape
        dtype = array.dtype
        last = self._last
        if shape == last[0] and dtype == last[1] and fortran == last[2] and wire_dtype == last[3]:
            layout, blob = last[4], last[5]
        else:
            layout = self.layout_for(array, wire_dtype)
            blob = layout.blob
            self._last = (shape, dtype, fortran, wire_dtype, layout, blob)
        if seq < 0 or seq > MAX_SEQ:
            raise ValueError(f"seq {seq} outside 0..2**63-1")
        index = seq & self._mask
        off = SUPERBLOCK_SIZE + index * HEADER_SLOT_BYTES
        words = self._words
        words[off >> 3] = seq << 1
        start = SUPERBLOCK_SIZE + index * stride
        if not nbytes:
            pass  # §8.2: an empty payload is still committed; there is nothing to copy
        elif c_contig:
            # mmap slice assignment takes any C-contiguous buffer: one memcpy, no views.
            self._pool_mm[pool_id][start : start + nbytes] = array
        elif fortran:
            self._pool_mm[pool_id][start : start + nbytes] = array.T  # same bytes, C order
        else:
            np.copyto(layout.view(self._pool_u8[pool_id], start), array)
        _pack_slot_fields(
            self._hmm,
            off + SLOT_FIELDS_OFFSET,
            nbytes,
            index,
            pool_id,
            0,
            timestamp_ns,
            meta_version,
        )
        self._hmv[off + TENSOR_BLOB_OFFSET : off + HEADER_SLOT_BYTES] = blob
        words[off >> 3] = (seq << 1) | 1
        return index

    def close(self) -> None:
        """Drop the writer's views so the regions can be unmapped."""
        self._pool_mm = {}
        self._pool_u8 = {}
        self._hmv.release()
        self._layouts = {}


class SlotRead(NamedTuple):
    """A frame accepted by :class:`SlotReader` (immutable).

    ``array`` is a zero-copy view of the payload (read-only for read-only mappings), or None
    when ``values_len_bytes == 0`` (§8.2: do not read payload bytes). Check
    :meth:`SlotReader.is_current` after consuming it (see the module notes).
    """

    seq: int
    header_index: int
    commit_word: int
    timestamp_ns: int
    meta_version: int
    values_len_bytes: int
    pool_id: int
    layout: TensorLayout
    array: np.ndarray | None


class PrefixRead(NamedTuple):
    """The filled prefix of a frame still being written (:meth:`SlotReader.read_prefix`).

    ``data`` is a copy of payload bytes ``[0, bytes_filled)`` (``bytes_filled`` is what was
    copied: the producer's count, or less when the reader asked for less); ``layout`` is the frame's
    declared layout. Not a frame: the frame is available only with its descriptor.
    """

    frame_id: int
    header_index: int
    bytes_filled: int
    layout: TensorLayout
    data: np.ndarray

    def rows(self) -> np.ndarray | None:
        """The complete major-axis rows in the prefix, shaped ``(k, *dims[1:])`` (ROW-major
        dense layouts only; None otherwise)."""
        lay = self.layout
        if lay.major_order != MajorOrder.ROW or lay.extent_bytes != _dense_bytes(lay):
            return None
        row = lay.strides[0] if lay.ndims > 1 else lay.itemsize
        k = self.bytes_filled // row
        return self.data[: k * row].view(lay.np_dtype).reshape((k, *lay.dims[1:]))


def _dense_bytes(layout: TensorLayout) -> int:
    n = layout.itemsize
    for d in layout.dims:
        n *= d
    return n


def prefix_safe(layout: TensorLayout) -> bool:
    """§10.2.2 prefix safety: a dense layout (what "strides inferred contiguous" describes), or
    one that declares a ``progress_unit`` with its stride (validated when the layout was built)."""
    return layout.progress_unit != ProgressUnit.NONE or layout.extent_bytes == _dense_bytes(layout)


class SlotReader:
    """Validating reader of one stream's header ring and payload pools (consumer side).

    ``read`` never raises on bad slot contents: it returns None, increments
    ``counters[reason]`` and sets ``last_drop_reason``. Validated layouts and base views are
    cached per slot and reused while the slot's TensorHeader bytes stay the same, so the steady
    state costs two word loads, two small ``unpack``/slice operations and a cheap ``view()``.
    """

    __slots__ = (
        "_hmm",
        "_keys",
        "_known",
        "_last_commit",
        "_layouts",
        "_nslots",
        "_pool_mm",
        "_pool_stride",
        "_view_pool",
        "_views",
        "_words",
        "counters",
        "last_drop_reason",
    )

    def __init__(
        self,
        header: ShmRegion,
        pools: Iterable[ShmRegion] | Mapping[int, ShmRegion],
        *,
        counters: DropCounters | None = None,
        allow_weak_memory_order: bool = False,
    ) -> None:
        _check_platform(allow_weak_memory_order)
        pool_list = _pools_list(pools)
        check_ring_shape(header, pool_list)
        self.counters = counters if counters is not None else DropCounters()
        self.last_drop_reason: str | None = None
        n = header.nslots
        self._nslots = n
        self._hmm = header.mmap
        self._words = header.words
        self._pool_mm = {p.pool_id: p.mmap for p in pool_list}
        self._pool_stride = {p.pool_id: p.stride_bytes for p in pool_list}
        self._keys: list[bytes | None] = [None] * n
        # Layouts already validated in any slot, by header bytes: a layout is a pure function of
        # those bytes, so a hit needs no re-validation (bounded; cleared when full).
        self._known: dict[bytes, TensorLayout] = {}
        self._layouts: list[TensorLayout | None] = [None] * n
        self._views: list[np.ndarray | None] = [None] * n
        self._view_pool: list[int] = [-1] * n
        # Highest commit word accepted per slot: a lower one later is a regression (§15.3).
        self._last_commit: list[int] = [0] * n

    @property
    def nslots(self) -> int:
        return self._nslots

    def _drop(self, reason: str) -> None:
        self.counters.increment(reason)
        self.last_drop_reason = reason

    def _drop_invalid(self, qi: int, w1: int, reason: str) -> None:
        # A header that fails validation while the producer is rewriting it is a torn read,
        # not a malformed frame: only blame the header if the slot was stable throughout.
        self._drop(Reason.TORN_READ if self._words[qi] != w1 else reason)

    def read_copy(self, header_index: int, seq: int) -> SlotRead | None:
        """Like :meth:`read`, but the payload is copied *before* the second ``seq_commit`` load,
        so an accepted result is guaranteed untorn without calling :meth:`is_current`."""
        return self.read(header_index, seq, True)

    def slot_seq(self, header_index: int) -> int:
        """The logical seq the slot holds right now (committed or in progress).

        Consumers use it to learn how far ahead the producer is when a read finds the slot
        already reused (§15.4 resync); it is a hint, not a validated read.
        """
        return self._words[(SUPERBLOCK_SIZE + header_index * HEADER_SLOT_BYTES) >> 3] >> 1

    def raw_views(self, result: SlotRead) -> tuple[memoryview, memoryview]:
        """Zero-copy byte views of ``result``'s whole 256-byte header slot and of its payload
        bytes ``[0, values_len_bytes)``, for relays that forward a frame verbatim (the UDP
        bridge chunks exactly these bytes). Same contract as ``result.array``: the producer
        may overwrite them at any time, so call :meth:`is_current` after copying them out.
        """
        off = SUPERBLOCK_SIZE + result.header_index * HEADER_SLOT_BYTES
        header = memoryview(self._hmm)[off : off + HEADER_SLOT_BYTES]
        start = SUPERBLOCK_SIZE + result.header_index * self._pool_stride[result.pool_id]
        payload = memoryview(self._pool_mm[result.pool_id])[start : start + result.values_len_bytes]
        return header, payload

    def is_current(self, result: SlotRead) -> bool:
        """True if the slot still holds ``result``'s frame (call after consuming a view).

        A False answer means the payload may have been overwritten while it was being read;
        it is counted as ``torn_read`` (a late drop).
        """
        if self._words[(SUPERBLOCK_SIZE + result.header_index * HEADER_SLOT_BYTES) >> 3] == (
            result.commit_word
        ):
            return True
        self._drop(Reason.TORN_READ)
        return False

    def read_prefix(
        self, header_index: int, frame_id: int, bytes_filled: int, max_bytes: int | None = None
    ) -> PrefixRead | str:
        """Copy the first ``bytes_filled`` payload bytes of frame ``frame_id`` (at most
        ``max_bytes`` of them), written or still being written (see the module notes); the
        reason instead when refused. Counts nothing: the caller keeps prefix refusals apart
        from frame drops."""
        if not 0 <= header_index < self._nslots:
            return Reason.HEADER_INDEX_OUT_OF_RANGE
        off = SUPERBLOCK_SIZE + header_index * HEADER_SLOT_BYTES
        qi = off >> 3
        words = self._words
        w1 = words[qi]
        if w1 >> 1 != frame_id:
            return PREFIX_SLOT_REUSED if w1 >> 1 > frame_id else Reason.SEQ_MISMATCH
        hmm = self._hmm
        try:
            layout = TensorLayout.from_blob_fields(
                TENSOR_BLOB_READ.unpack(hmm[off + TENSOR_BLOB_OFFSET : off + TENSOR_BLOB_END])
            )
        except TensorLayoutError as exc:
            return Reason.TORN_READ if words[qi] >> 1 != frame_id else exc.reason
        values_len, payload_slot, pool_id, payload_offset, _ts, _mv = _unpack_slot_fields(
            hmm, off + SLOT_FIELDS_OFFSET
        )
        stride = self._pool_stride.get(pool_id)
        reason = None
        if payload_offset != 0:
            reason = Reason.PAYLOAD_OFFSET_NONZERO
        elif payload_slot != header_index:
            reason = Reason.PAYLOAD_SLOT_MISMATCH
        elif stride is None:
            reason = Reason.UNKNOWN_POOL_ID
        elif values_len > stride:
            reason = Reason.VALUES_LEN_EXCEEDS_STRIDE
        elif not 0 <= bytes_filled <= values_len:
            reason = PREFIX_EXCEEDS_VALUES_LEN  # §10.2.2: filled <= values_len_bytes
        elif not prefix_safe(layout):
            reason = PREFIX_NOT_LAYOUT_SAFE
        if reason is not None:
            return Reason.TORN_READ if words[qi] >> 1 != frame_id else reason
        start = SUPERBLOCK_SIZE + header_index * stride  # type: ignore[operator]
        if max_bytes is not None:
            bytes_filled = min(bytes_filled, max_bytes)
        data = np.frombuffer(self._pool_mm[pool_id], np.uint8, bytes_filled, start).copy()
        if words[qi] >> 1 != frame_id:
            return PREFIX_SLOT_REUSED  # the producer moved on to a newer frame while we copied
        return PrefixRead(frame_id, header_index, bytes_filled, layout, data)

    def read(self, header_index: int, seq: int, copy: bool = False) -> SlotRead | None:
        """Seqlock-validated read of frame ``seq`` from ``header_index`` (a descriptor's fields).

        Zero-copy by default; ``copy=True`` is :meth:`read_copy`.
        """
        if not 0 <= header_index < self._nslots:
            self._drop(Reason.HEADER_INDEX_OUT_OF_RANGE)
            return None
        off = SUPERBLOCK_SIZE + header_index * HEADER_SLOT_BYTES
        qi = off >> 3
        words = self._words
        w1 = words[qi]
        if not w1 & 1:
            self._drop(Reason.NOT_COMMITTED)
            return None
        if w1 >> 1 != seq:
            self._drop(Reason.SEQ_MISMATCH)
            return None
        if w1 < self._last_commit[header_index]:
            # §15.3: the slot went backwards (a stale producer or replayed descriptor).
            self._drop(Reason.SEQ_COMMIT_REGRESSED)
            return None
        hmm = self._hmm
        key = hmm[off + TENSOR_BLOB_OFFSET : off + TENSOR_BLOB_END]
        if key == self._keys[header_index]:
            layout = self._layouts[header_index]
        else:
            layout = self._known.get(key)
            if layout is None:
                try:
                    layout = TensorLayout.from_blob_fields(TENSOR_BLOB_READ.unpack(key))
                except TensorLayoutError as exc:
                    self._drop_invalid(qi, w1, exc.reason)
                    return None
                if len(self._known) >= _KNOWN_LAYOUTS_MAX:
                    self._known.clear()
                self._known[key] = layout
            self._keys[header_index] = key
            self._layouts[header_index] = layout
            self._views[header_index] = None
        values_len, payload_slot, pool_id, payload_offset, timestamp_ns, meta_version = (
            _unpack_slot_fields(hmm, off + SLOT_FIELDS_OFFSET)
        )
        if payload_offset != 0:
            self._drop_invalid(qi, w1, Reason.PAYLOAD_OFFSET_NONZERO)
            return None
        if payload_slot != header_index:
            self._drop_invalid(
                qi,
                w1,
                Reason.PAYLOAD_SLOT_OUT_OF_RANGE
                if payload_slot >= self._nslots
                else Reason.PAYLOAD_SLOT_MISMATCH,
            )
            return None
        stride = self._pool_stride.get(pool_id)
        if stride is None:
            self._drop_invalid(qi, w1, Reason.UNKNOWN_POOL_ID)
            return None
        if values_len > stride:
            self._drop_invalid(qi, w1, Reason.VALUES_LEN_EXCEEDS_STRIDE)
            return None
        if values_len == 0:
            array = None
        else:
            if values_len < layout.extent_bytes:  # type: ignore[union-attr]
                self._drop_invalid(qi, w1, Reason.VALUES_LEN_BELOW_EXTENT)
                return None
            base = self._views[header_index]
            if base is None or self._view_pool[header_index] != pool_id:
                base = layout.view(  # type: ignore[union-attr]
                    self._pool_mm[pool_id], SUPERBLOCK_SIZE + header_index * stride
                )
                self._views[header_index] = base
                self._view_pool[header_index] = pool_id
            array = base.copy(order="K") if copy else base.view()
        if words[qi] != w1:
            self._drop(Reason.TORN_READ)
            return None
        self._last_commit[header_index] = w1
        return _new_tuple(
            SlotRead,
            (seq, header_index, w1, timestamp_ns, meta_version, values_len, pool_id, layout, array),
        )

    def close(self) -> None:
        """Drop cached views so the regions can be unmapped."""
        n = self._nslots
        self._views = [None] * n
        self._keys = [None] * n
        self._layouts = [None] * n
        self._known = {}
