"""The bridge receiver's core: validate chunks, assemble frames, decide what to publish.

Sans-IO (docs/architecture.md, "Cores and agents"): inputs are raw ``BridgeFrameChunk``
messages, forwarded ``ShmPoolAnnounce`` contents, forwarded ``FrameProgress`` fields and
``now_ns``; outputs are events — :class:`FrameComplete` (header fields, validated layout, the
assembled payload), :class:`Dropped` (a named reason), :class:`OpenDestination` (the agent must
(re)open the local producer), :class:`ProgressOut`. No Aeron, files or clocks. The only
collaborator is a :class:`FrameSink`, which hands out the buffer a frame is assembled into: a
scratch ``bytearray`` here and in tests, the local SHM payload slot in the agent (one copy from
the Aeron log straight into shared memory).

Model, per receiver mapping (keyed by the *source* stream id the chunks carry):

* Until a forwarded ``ShmPoolAnnounce`` arrived, every chunk is dropped (§5.2, §6.2). An
  announce of a higher epoch is a remap boundary (§8): the in-flight frame is dropped and
  the agent reopens the destination, which gives it a new local epoch (§8: independent of
  the source, increasing). Announces of older epochs are ignored.
* A chunk whose epoch is older than the announce is ``stale_epoch`` (§8); newer is
  ``epoch_mismatch`` (§6.3: wait for its announce) and also ends the in-flight frame.
  Only an announce raises the epoch floor: a single corrupt chunk must not be able to
  lock a stream out.
* Chunk checks (§5.2) run before any state is touched: header flag and length, index and
  count, offset 0 for chunk 0, ``payloadBytes`` length equal to ``chunkLength``, the chunk
  bound (effective chunk size / ``max_chunk_bytes``), ``payloadLength`` against
  ``max_payload_bytes``, the largest source stride and the largest local stride, bounds.
  Nothing is allocated from untrusted lengths: the payload is copied into the sink buffer,
  whose size was validated first.
* One frame is in flight per stream (Aeron UDP delivers a publication in order, and the
  local ring has a single writer). Chunks are placed by ``chunkOffset``; a chunk identical
  to one already received (same offset, length and bytes) is ignored; any other overlap,
  or a second chunk with the same index, drops the frame (§5.2). A chunk of a newer
  frame drops the incomplete one (``superseded``: something went missing, §5.3); chunks of
  frames already finished are ``stale_seq``. The assembly timeout runs from the frame's
  first chunk (§5.3a) and is checked on every chunk and every :meth:`tick`.
* Runs (:meth:`ReceiverCore.on_chunk_run`): the agent stages full-size middle chunks and
  hands them over per poll; rows that continue the frame in flight in order are applied in
  bulk, every other row goes through :meth:`ReceiverCore.on_chunk`, so the outcome is
  exactly that of one call per chunk (tests/unit/bridge/test_bridge_chunk_runs.py).
* On the last chunk the header is validated (§6.4-6.6): ``seq_commit >> 1 == seq``,
  ``values_len_bytes == payloadLength``, ``payload_offset == 0``, ``pool_id`` among the
  announced pools and ``payloadLength`` within that pool's stride, a decodable embedded
  ``TensorHeader`` (:meth:`TensorLayout.from_blob_fields`), ``values_len_bytes`` covering
  the tensor extent. Only then is :class:`FrameComplete` returned; every other outcome is
  a counted drop and the sink buffer is released unpublished (§5.3).
"""

from __future__ import annotations

import struct
from bisect import bisect_right, insort
from collections.abc import Buffer, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, Protocol

import numpy as np

from tensorpool.bridge.chunker import HEADER_SLOT_BYTES
from tensorpool.bridge.reasons import ChunkDrop, ControlDrop, FrameDrop
from tensorpool.counters import DropCounters, Reason
from tensorpool.shm.errors import TensorLayoutError
from tensorpool.shm.layout import (
    SLOT_FIELDS_OFFSET,
    SLOT_FIELDS_READ,
    TENSOR_BLOB_END,
    TENSOR_BLOB_OFFSET,
    TENSOR_BLOB_READ,
)
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs.generated.bridge import BridgeFrameChunkDecoder as _Dec

__all__ = [
    "Dropped",
    "FrameComplete",
    "FrameSink",
    "OpenDestination",
    "ProgressOut",
    "ReceiverCore",
    "ReceiverMapping",
    "ScratchSink",
    "SourceAnnounce",
    "StreamStats",
]

_PREFIX: Final = struct.Struct("<HHHHIQQIIIIIBI")  # header + block + headerBytes length
_HEAD57: Final = struct.Struct("<HHHHIQQIIIIIBII")  # ... + payloadBytes length (no header)
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_BLOCK: Final = _Dec.BLOCK_LENGTH
_TEMPLATE: Final = _Dec.TEMPLATE_ID
_SCHEMA: Final = _Dec.SCHEMA_ID
_VERSION: Final = _Dec.SCHEMA_VERSION
MAX_CHUNK_COUNT: Final = _Dec.CHUNK_COUNT_MAX_VALUE
_LAYOUT_CACHE_MAX: Final = 256
_NO_SEQ: Final = -1
RUN_HEAD: Final = _HEAD57.size  # 57: a middle chunk's payload starts here
# on_chunk_run copies each row's 57-byte head into a 64-byte scratch row (bytes 57-63 stay
# zero) read as 8 little-endian u64 words: chunkIndex is the high half of word 3,
# chunkOffset the high half of word 4, chunkLength the low half of word 5.
_RUN_SCRATCH_ROW: Final = 64
_RUN_MIN_ROWS: Final = 3  # shorter segments: numpy's per-call cost exceeds on_chunk's
_LOW32: Final = (1 << 32) - 1


# --------------------------------------------------------------------------- inputs / outputs


@dataclass(frozen=True, slots=True)
class SourceAnnounce:
    """The parts of a forwarded ``ShmPoolAnnounce`` the receiver validates against."""

    stream_id: int
    epoch: int
    layout_version: int
    header_nslots: int
    header_slot_bytes: int
    pools: tuple[tuple[int, int, int], ...]
    """``(pool_id, pool_nslots, stride_bytes)`` per payload pool."""

    @classmethod
    def from_decoder(cls, dec: object) -> SourceAnnounce:
        """Copy out of a ``ShmPoolAnnounceDecoder`` (flyweights are reused per message)."""
        return cls(
            stream_id=int(dec.stream_id),  # type: ignore[attr-defined]
            epoch=int(dec.epoch),  # type: ignore[attr-defined]
            layout_version=int(dec.layout_version),  # type: ignore[attr-defined]
            header_nslots=int(dec.header_nslots),  # type: ignore[attr-defined]
            header_slot_bytes=int(dec.header_slot_bytes),  # type: ignore[attr-defined]
            pools=tuple(
                (int(p.pool_id), int(p.pool_nslots), int(p.stride_bytes))
                for p in dec.payload_pools  # type: ignore[attr-defined]
            ),
        )

    def problem(self) -> str | None:
        """Why this announce cannot describe a stream, or None."""
        n = self.header_nslots
        if self.header_slot_bytes != HEADER_SLOT_BYTES:
            return f"header_slot_bytes {self.header_slot_bytes} != 256"
        if n <= 0 or n & (n - 1):
            return f"header_nslots {n} is not a power of two"
        if not self.pools:
            return "no payload pools"
        ids = [p[0] for p in self.pools]
        if len(set(ids)) != len(ids):
            return "duplicate pool ids"
        for pool_id, nslots, stride in self.pools:
            if nslots != n:
                return f"pool {pool_id} has {nslots} slots, header ring {n}"
            if stride <= 0:
                return f"pool {pool_id} stride {stride}"
        return None


@dataclass(frozen=True, slots=True)
class ReceiverMapping:
    index: int
    source_stream_id: int
    dest_stream_id: int


@dataclass(slots=True)
class FrameComplete:
    """A validated frame: write ``payload`` and the header fields locally, commit, publish.

    ``payload`` is the sink buffer (valid until the next chunk is processed); ``header``
    is the source's 256-byte header slot, kept for tools and tests.
    """

    mapping: int
    source_stream_id: int
    dest_stream_id: int
    epoch: int
    seq: int
    layout: TensorLayout
    values_len_bytes: int
    timestamp_ns: int
    meta_version: int
    source_pool_id: int
    header: bytes
    payload: memoryview


@dataclass(frozen=True, slots=True)
class Dropped:
    """A refused chunk (``frame=False``) or an abandoned frame (``frame=True``)."""

    mapping: int
    stream_id: int
    seq: int
    reason: str
    frame: bool


@dataclass(frozen=True, slots=True)
class OpenDestination:
    """Open (first announce) or reopen (source epoch changed) the local producer."""

    mapping: int
    source_epoch: int
    reopen: bool


@dataclass(frozen=True, slots=True)
class ProgressOut:
    """A forwarded ``FrameProgress`` ready to republish locally (§9)."""

    dest_stream_id: int
    epoch: int
    frame_id: int
    header_index: int
    payload_bytes_filled: int
    state: int


type Event = FrameComplete | Dropped | OpenDestination


class FrameSink(Protocol):
    """Where frames are assembled. ``acquire`` returns a writable byte buffer of exactly
    ``payload_length`` bytes, or a drop reason; ``release`` abandons it unpublished."""

    def acquire(self, mapping: int, seq: int, payload_length: int) -> memoryview | str: ...

    def release(self, mapping: int, seq: int) -> None: ...


class ScratchSink:
    """One reusable ``bytearray`` per mapping (tests, fuzzing, tools).

    It grows to the largest frame seen; the core only asks for sizes it has already
    bounded by the source and local strides and ``max_payload_bytes``.
    """

    __slots__ = ("_bufs", "acquired", "released")

    def __init__(self) -> None:
        self._bufs: dict[int, bytearray] = {}
        self.acquired = 0
        self.released = 0

    def acquire(self, mapping: int, seq: int, payload_length: int) -> memoryview | str:
        buf = self._bufs.get(mapping)
        if buf is None or len(buf) < payload_length:
            buf = self._bufs[mapping] = bytearray(payload_length)
        self.acquired += 1
        return memoryview(buf)[:payload_length]

    def release(self, mapping: int, seq: int) -> None:
        self.released += 1


# --------------------------------------------------------------------------- state


@dataclass(slots=True)
class StreamStats:
    frames: int = 0
    bytes: int = 0
    chunks: int = 0
    chunk_drops: DropCounters = field(default_factory=DropCounters)
    frame_drops: DropCounters = field(default_factory=DropCounters)
    control_drops: DropCounters = field(default_factory=DropCounters)
    progress: int = 0

    def snapshot(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "bytes": self.bytes,
            "chunks": self.chunks,
            "chunk_drops": self.chunk_drops.snapshot(),
            "frame_drops": self.frame_drops.snapshot(),
            "control_drops": self.control_drops.snapshot(),
            "assembly_timeouts": self.frame_drops[FrameDrop.ASSEMBLY_TIMEOUT],
            "progress": self.progress,
        }


class _Assembly:
    __slots__ = (
        "buf",
        "count",
        "first_ns",
        "header",
        "nrecv",
        "pending",
        "plen",
        "prefix",
        "received",
        "runs",
        "seq",
        "starts",
    )

    def __init__(self, seq: int, count: int, plen: int, now_ns: int, buf: memoryview) -> None:
        self.seq = seq
        self.count = count
        self.plen = plen
        self.first_ns = now_ns
        self.buf = buf
        self.received = bytearray(count)
        self.nrecv = 0
        self.prefix = 0  # bytes [0, prefix) are covered
        self.pending: list[tuple[int, int]] = []  # covered [start, end) beyond the prefix
        self.starts: dict[int, int] = {}  # chunkOffset -> chunkLength of accepted chunks
        # ...and those accepted in bulk (on_chunk_run), one (offset, end, length) per run:
        # a dict entry per chunk cost more than the rest of a bulk chunk's bookkeeping
        self.runs: list[tuple[int, int, int]] = []
        self.header: bytes | None = None

    def start_length(self, off: int) -> int | None:
        """chunkLength of the accepted chunk that starts at ``off``, or None."""
        known = self.starts.get(off)
        if known is None:
            for start, end, clen in self.runs:
                if start <= off < end and (off - start) % clen == 0:
                    return clen
        return known

    def overlaps(self, start: int, end: int) -> bool:
        if start < self.prefix:
            return True
        p = self.pending
        i = bisect_right(p, (start, end))
        if i and p[i - 1][1] > start:
            return True
        return i < len(p) and p[i][0] < end

    def cover(self, start: int, end: int) -> None:
        if start == self.prefix:
            prefix = end
            p = self.pending
            while p and p[0][0] == prefix:
                prefix = p.pop(0)[1]
            self.prefix = prefix
        else:
            insort(self.pending, (start, end))


class _Stream:
    __slots__ = (
        "announce",
        "asm",
        "attaching",
        "dest",
        "dest_ready",
        "epoch",
        "floor",
        "index",
        "local_max_stride",
        "local_nslots",
        "max_plen",
        "max_source_stride",
        "pools",
        "source",
        "stats",
    )

    def __init__(self, mapping: ReceiverMapping) -> None:
        self.index = mapping.index
        self.source = mapping.source_stream_id
        self.dest = mapping.dest_stream_id
        self.announce: SourceAnnounce | None = None
        self.epoch = -1
        self.pools: dict[int, int] = {}
        self.max_source_stride = 0
        self.dest_ready = False
        self.attaching = False  # the agent is attaching the destination (not ready yet)
        self.local_nslots = 0
        self.local_max_stride = 0
        self.max_plen = -1  # min of every payloadLength bound; -1 until ready (fast path off)
        self.floor = _NO_SEQ
        self.asm: _Assembly | None = None
        self.stats = StreamStats()


# --------------------------------------------------------------------------- the core


class ReceiverCore:
    """Validation and assembly for every receiver mapping of one bridge instance."""

    def __init__(
        self,
        mappings: Iterable[ReceiverMapping],
        *,
        chunk_bound: int,
        max_payload_bytes: int,
        assembly_timeout_ns: int,
        sink: FrameSink | None = None,
    ) -> None:
        if chunk_bound <= 0 or assembly_timeout_ns <= 0 or max_payload_bytes <= 0:
            raise ValueError("chunk_bound, max_payload_bytes, assembly_timeout_ns must be > 0")
        self.chunk_bound = chunk_bound
        self.max_payload_bytes = max_payload_bytes
        self.timeout_ns = assembly_timeout_ns
        self.sink: FrameSink = sink if sink is not None else ScratchSink()
        self._streams: dict[int, _Stream] = {}
        self._by_index: dict[int, _Stream] = {}
        for m in mappings:
            if m.source_stream_id in self._streams:
                raise ValueError(f"source stream {m.source_stream_id} mapped twice")
            st = _Stream(m)
            self._streams[m.source_stream_id] = st
            self._by_index[m.index] = st
        self.chunk_drops = DropCounters()
        """Chunks refused before a mapping was known (malformed, foreign stream)."""
        self._layouts: dict[bytes, TensorLayout] = {}
        self._run_heads = np.zeros((0, _RUN_SCRATCH_ROW), np.uint8)
        self._run_steps = np.zeros(0, np.uint64)  # i << 32: chunkIndex i rows on
        self._run_clen = 0
        self._run_offsets = np.zeros(0, np.uint64)  # (i * clen) << 32: chunkOffset i rows on

    # -- introspection --------------------------------------------------------------------

    def stats(self, mapping: int) -> StreamStats:
        return self._by_index[mapping].stats

    def source_epoch(self, mapping: int) -> int | None:
        st = self._by_index[mapping]
        return None if st.announce is None else st.epoch

    def in_flight(self, mapping: int) -> int | None:
        """Seq of the frame being assembled, if any."""
        asm = self._by_index[mapping].asm
        return None if asm is None else asm.seq

    def destination_state(self, mapping: int) -> str:
        """``open``, ``attaching`` or ``closed``: the destination as the agent reported it."""
        st = self._by_index[mapping]
        return "open" if st.dest_ready else "attaching" if st.attaching else "closed"

    # -- destination lifecycle (reported by the agent) ------------------------------------

    def destination_attaching(self, mapping: int) -> Dropped | None:
        """The agent started attaching the local producer and keeps running meanwhile.

        Why a state of its own: the attach may take up to the attach timeout (a slow,
        restarting or stopped SHM driver) and the receiver must not stall its other streams
        for it, so this stream's chunks keep arriving and are dropped as
        ``destination_attaching`` — not ``dest_not_ready`` — until :meth:`destination_ready`
        (or :meth:`destination_lost`, when the attach fails).
        """
        st = self._by_index[mapping]
        st.dest_ready = False
        st.attaching = True
        self._refresh_bounds(st)
        return self._abandon(st, FrameDrop.DEST_LOST)

    def destination_ready(
        self, mapping: int, *, header_nslots: int, max_stride: int, dest_stream_id: int
    ) -> None:
        """The local producer is attached: its ring depth and largest pool stride."""
        st = self._by_index[mapping]
        st.dest_ready = True
        st.attaching = False
        st.local_nslots = header_nslots
        st.local_max_stride = max_stride
        st.dest = dest_stream_id
        self._refresh_bounds(st)

    def destination_lost(self, mapping: int) -> Dropped | None:
        """The local producer went away (lease lost, closed, attach failed): drop the frame in
        flight."""
        st = self._by_index[mapping]
        st.dest_ready = False
        st.attaching = False
        self._refresh_bounds(st)
        return self._abandon(st, FrameDrop.DEST_LOST)

    # -- announces --------------------------------------------------------------------------

    def on_announce(self, ann: SourceAnnounce, now_ns: int) -> list[Event]:
        """Apply a forwarded ``ShmPoolAnnounce`` (§7.2, §8)."""
        st = self._streams.get(ann.stream_id)
        if st is None:
            self.chunk_drops.increment(ControlDrop.ANNOUNCE_UNKNOWN_STREAM)
            return []
        if ann.problem() is not None:
            st.stats.control_drops.increment(ControlDrop.ANNOUNCE_INVALID)
            return []
        if ann.epoch < st.epoch:
            st.stats.control_drops.increment(ControlDrop.ANNOUNCE_OLD_EPOCH)
            return []
        if ann.epoch == st.epoch:
            return []  # periodic repeat
        events: list[Event] = []
        dropped = self._abandon(st, FrameDrop.EPOCH_CHANGE)
        if dropped is not None:
            events.append(dropped)
        reopen = st.announce is not None
        st.announce = ann
        st.epoch = ann.epoch
        st.pools = {pool_id: stride for pool_id, _n, stride in ann.pools}
        st.max_source_stride = max(st.pools.values())
        st.floor = _NO_SEQ
        st.dest_ready = False  # until the agent reopens the destination for this epoch
        self._refresh_bounds(st)
        events.append(OpenDestination(st.index, ann.epoch, reopen))
        return events

    # -- chunks (hot path) ----------------------------------------------------------------

    def on_chunk(self, buf: Buffer, now_ns: int) -> FrameComplete | Dropped | None:
        """Process one ``BridgeFrameChunk`` message (with its 8-byte SBE header).

        Returns the completed frame, a drop, or None (accepted, frame still incomplete).
        The common case — a well-formed chunk continuing the frame in flight in order — runs
        one ``unpack``, one combined validity test and one copy; anything else takes the
        slow path, which finds and counts the precise reason.
        """
        mv = memoryview(buf)  # type: ignore[arg-type]
        try:
            (bl, tid, sch, ver, sid, epoch, seq, idx, count, off, clen, plen, hinc, hlen, dlen) = (
                _HEAD57.unpack_from(mv, 0)
            )
        except struct.error:
            return self._parse_slow(mv, now_ns)
        if hlen or bl != _BLOCK:
            return self._parse_slow(mv, now_ns)
        st = self._streams.get(sid)
        if (
            st is None
            or tid != _TEMPLATE
            or sch != _SCHEMA
            or ver > _VERSION
            or 57 + dlen > mv.nbytes
            or epoch != st.epoch
            or hinc
            or not 0 < idx < count <= MAX_CHUNK_COUNT
            or clen != dlen
            or clen > self.chunk_bound
            or plen > st.max_plen
            or off + clen > plen
            or not clen
            or count > plen
            or count * self.chunk_bound < plen
        ):
            return self._parse_slow(mv, now_ns)
        asm = st.asm
        if (
            asm is None
            or seq != asm.seq
            or now_ns - asm.first_ns > self.timeout_ns
            or count != asm.count
            or plen != asm.plen
            or off != asm.prefix
            or asm.pending
            or asm.received[idx]
        ):
            return self._accept_slow(st, mv, now_ns, seq, idx, count, off, clen, plen, 0, 57)
        end = off + clen
        asm.buf[off:end] = mv[57 : 57 + clen]
        asm.prefix = end
        asm.starts[off] = clen
        asm.received[idx] = 1
        asm.nrecv += 1
        st.stats.chunks += 1
        if asm.nrecv == count:
            return self._complete(st, asm)
        return None

    def on_chunk_run(
        self, rows: np.ndarray, k: int, now_ns: int
    ) -> Iterator[FrameComplete | Dropped]:
        """Process ``rows[:k]`` — each row one whole message of exactly ``rows.shape[1]``
        bytes, in arrival order — exactly as ``k`` calls of :meth:`on_chunk` would.

        Why: per-chunk Python was the receiver's limit (docs/benchmarks/bridge.md). The agent
        records the common message (a full-size middle chunk) into a staging array and hands
        runs of them here. Consecutive rows that continue one another (same head except
        ``chunkIndex`` + 1 and ``chunkOffset`` + ``chunkLength``: found with a few whole-array
        compares) form segments; a segment whose first row passes the fast path's own
        conditions is applied in bulk — one copy, then the same ``prefix``/``starts``/
        ``received``/``nrecv``/``chunks`` updates that one fast-path call per row makes — as
        far as the frame's bounds and not-yet-received indices allow. Every other row goes
        through :meth:`on_chunk` unchanged, so every drop reason and counter is the scalar one.

        A generator, lazily: the caller must act on each event (publish a FrameComplete, whose
        payload is the sink buffer) before the next row is processed, as with on_chunk.
        """
        if k <= 0:
            return
        stride = int(rows.shape[1])
        if not rows.flags.c_contiguous or rows.dtype != np.uint8 or k > rows.shape[0]:
            raise ValueError("rows must be a C-contiguous uint8 array of at least k rows")
        mv = memoryview(rows[:k]).cast("B")
        on_chunk = self.on_chunk
        if stride < RUN_HEAD:
            for p in range(k):
                r = on_chunk(mv[p * stride : (p + 1) * stride], now_ns)
                if r is not None:
                    yield r
            return
        bounds = [0]
        if k >= _RUN_MIN_ROWS:
            bounds.extend(self._run_breaks(rows, k))
        bounds.append(k)
        for s in range(len(bounds) - 1):
            p, q = bounds[s], bounds[s + 1]
            misses = 0
            while p < q:
                if misses < 2 and q - p >= _RUN_MIN_ROWS:
                    n, r = self._bulk(rows, mv, p, q, stride, now_ns)
                else:
                    n = 0
                if n:
                    p += n
                    misses = 0
                else:  # the scalar path decides (and counts) this row
                    r = on_chunk(mv[p * stride : (p + 1) * stride], now_ns)
                    p += 1
                    misses += 1
                if r is not None:
                    yield r

    def _run_breaks(self, rows: np.ndarray, k: int) -> list[int]:
        """Rows ``i`` of ``rows[:k]`` (``i`` >= 1) that do not continue row ``i - 1``.

        The common run is one segment: with ``chunkIndex`` and ``chunkOffset`` reduced by what
        ``i`` steps from row 0 add, every head equals row 0's — one copy, two subtractions and
        one bytes compare. Otherwise rows are compared pairwise (segments of other streams
        or frames, a duplicate, a corrupt field).
        """
        heads = self._run_heads
        if heads.shape[0] < k:
            heads = self._run_heads = np.zeros((rows.shape[0], _RUN_SCRATCH_ROW), np.uint8)
            self._run_steps = np.arange(rows.shape[0], dtype=np.uint64) << np.uint64(32)
            self._run_clen = 0
        words = heads.view("<u8")
        heads[:k, :RUN_HEAD] = rows[:k, :RUN_HEAD]
        clen = int(words[0, 5]) & _LOW32
        if clen != self._run_clen or self._run_offsets.shape[0] < k:
            self._run_offsets = self._run_steps * np.uint64(clen)
            self._run_clen = clen
        # (u64 wrap-around is harmless: _bulk bounds every offset by payloadLength < 2**32)
        words[:k, 3] -= self._run_steps[:k]
        words[:k, 4] -= self._run_offsets[:k]
        flat = heads[:k].tobytes()
        if flat == flat[:_RUN_SCRATCH_ROW] * k:
            return []
        # pairwise: equal reduced heads continue each other only at row 0's chunkLength
        brk = (words[1:k] != words[: k - 1]).any(axis=1)
        brk |= (words[: k - 1, 5] & np.uint64(_LOW32)) != np.uint64(clen)
        return (np.flatnonzero(brk) + 1).tolist()  # type: ignore[no-any-return]

    def _bulk(
        self, rows: np.ndarray, mv: memoryview, p: int, q: int, stride: int, now_ns: int
    ) -> tuple[int, FrameComplete | Dropped | None]:
        """Apply rows ``[p, p + n)`` of one continuing segment at once; ``n`` = 0 if row ``p``
        would not take on_chunk's fast path (the caller then runs it through on_chunk).

        Rows after ``p`` repeat row ``p``'s head except index and offset, so row ``p``'s
        checks hold for them; what differs per row — index and offset within the frame, the
        index not yet received — is bounded here by trimming ``n``.
        """
        # on_chunk's fast-path conditions, repeated inline on purpose: a shared helper would add
        # a call to on_chunk, the per-chunk path of every chunk that is not in a run
        (bl, tid, sch, ver, sid, epoch, seq, idx, count, off, clen, plen, hinc, hlen, dlen) = (
            _HEAD57.unpack_from(mv, p * stride)
        )
        st = self._streams.get(sid)
        if (
            hlen
            or bl != _BLOCK
            or st is None
            or tid != _TEMPLATE
            or sch != _SCHEMA
            or ver > _VERSION
            or 57 + dlen > stride
            or epoch != st.epoch
            or hinc
            or not 0 < idx < count <= MAX_CHUNK_COUNT
            or clen != dlen
            or clen > self.chunk_bound
            or plen > st.max_plen
            or off + clen > plen
            or not clen
            or count > plen
            or count * self.chunk_bound < plen
        ):
            return 0, None
        asm = st.asm
        if (
            asm is None
            or seq != asm.seq
            or now_ns - asm.first_ns > self.timeout_ns
            or count != asm.count
            or plen != asm.plen
            or off != asm.prefix
            or asm.pending
            or asm.received[idx]
        ):
            return 0, None
        # every row stays inside the frame (index < count, offset + length <= plen) and lands
        # on an index not received yet (so nrecv reaches count on the last row at the latest)
        n = min(q - p, count - idx, (plen - off) // clen)
        received = asm.received
        hit = received.find(1, idx, idx + n)
        if hit >= 0:
            n = hit - idx
        end = off + n * clen
        dst = np.frombuffer(asm.buf, np.uint8, n * clen, off)  # type: ignore[call-overload]
        dst.reshape(n, clen)[...] = rows[p : p + n, 57 : 57 + clen]
        asm.prefix = end
        asm.runs.append((off, end, clen))
        received[idx : idx + n] = b"\x01" * n
        asm.nrecv += n
        st.stats.chunks += n
        if asm.nrecv == count:
            return n, self._complete(st, asm)
        return n, None

    def _parse_slow(self, mv: memoryview, now_ns: int) -> FrameComplete | Dropped | None:
        """Full decode with a named reason for every refusal (§5.2, §6 steps 1-3, §8)."""
        try:
            (bl, tid, sch, ver, sid, epoch, seq, idx, count, off, clen, plen, hinc, hlen) = (
                _PREFIX.unpack_from(mv, 0)
            )
        except struct.error:
            return self._global_drop(ChunkDrop.TRUNCATED)
        if tid != _TEMPLATE or sch != _SCHEMA or ver > _VERSION or bl < _BLOCK:
            return self._global_drop(ChunkDrop.BAD_MESSAGE_HEADER)
        hpos = 8 + bl + 4
        if bl != _BLOCK:  # a longer block (schema extension): the var data moves
            try:
                hlen = _U32.unpack_from(mv, 8 + bl)[0]
            except struct.error:
                return self._global_drop(ChunkDrop.TRUNCATED)
        n = mv.nbytes
        if hlen > HEADER_SLOT_BYTES:  # varDataEncoding256: never more than the slot (§5.2)
            return self._global_drop(ChunkDrop.HEADER_LENGTH_INVALID)
        lpos = hpos + hlen
        if lpos + 4 > n:
            return self._global_drop(ChunkDrop.TRUNCATED)
        dlen = _U32.unpack_from(mv, lpos)[0]
        ppos = lpos + 4
        if ppos + dlen > n:
            return self._global_drop(ChunkDrop.TRUNCATED)

        st = self._streams.get(sid)
        if st is None:
            return self._global_drop(ChunkDrop.UNKNOWN_STREAM, sid, seq)
        if epoch != st.epoch:
            if st.announce is None:
                return self._drop(st, seq, ChunkDrop.NO_ANNOUNCE)
            if epoch < st.epoch:
                return self._drop(st, seq, ChunkDrop.STALE_EPOCH)
            # §8: the source moved on; what is in flight belongs to the old epoch.
            self._abandon(st, FrameDrop.EPOCH_CHANGE)
            return self._drop(st, seq, ChunkDrop.EPOCH_MISMATCH)
        if not st.dest_ready:
            if st.attaching:
                return self._drop(st, seq, ChunkDrop.DESTINATION_ATTACHING)
            return self._drop(st, seq, ChunkDrop.DEST_NOT_READY)
        # §5.2 chunk rules, cheapest first; nothing touched yet.
        if hinc > 1:
            return self._drop(st, seq, ChunkDrop.HEADER_INCLUDED_INVALID)
        if count == 0 or count > MAX_CHUNK_COUNT:
            return self._drop(st, seq, ChunkDrop.CHUNK_COUNT_INVALID)
        if idx >= count:
            return self._drop(st, seq, ChunkDrop.CHUNK_INDEX_OUT_OF_RANGE)
        if (idx == 0) != (hinc == 1):
            return self._drop(st, seq, ChunkDrop.HEADER_FLAG_MISMATCH)
        if hlen != (HEADER_SLOT_BYTES if hinc else 0):
            return self._drop(st, seq, ChunkDrop.HEADER_LENGTH_INVALID)
        if idx == 0 and off != 0:
            return self._drop(st, seq, ChunkDrop.CHUNK_OFFSET_INVALID)
        if clen != dlen:
            return self._drop(st, seq, ChunkDrop.CHUNK_LENGTH_MISMATCH)
        if clen > self.chunk_bound:
            return self._drop(st, seq, ChunkDrop.CHUNK_TOO_LARGE)
        if plen > self.max_payload_bytes:
            return self._drop(st, seq, ChunkDrop.PAYLOAD_TOO_LARGE)
        if plen > st.max_source_stride:
            return self._drop(st, seq, ChunkDrop.PAYLOAD_EXCEEDS_SOURCE_STRIDE)
        if plen > st.local_max_stride:
            return self._drop(st, seq, ChunkDrop.PAYLOAD_EXCEEDS_LOCAL_STRIDE)
        if off + clen > plen:
            return self._drop(st, seq, ChunkDrop.CHUNK_OUT_OF_BOUNDS)
        if plen:
            if clen == 0:
                return self._drop(st, seq, ChunkDrop.CHUNK_EMPTY)
            if count > plen or count * self.chunk_bound < plen:
                return self._drop(st, seq, ChunkDrop.CHUNK_COUNT_INVALID)
        elif count != 1:
            return self._drop(st, seq, ChunkDrop.CHUNK_COUNT_INVALID)
        return self._accept_slow(st, mv, now_ns, seq, idx, count, off, clen, plen, hinc, ppos)

    def _accept_slow(
        self,
        st: _Stream,
        mv: memoryview,
        now_ns: int,
        seq: int,
        idx: int,
        count: int,
        off: int,
        clen: int,
        plen: int,
        hinc: int,
        ppos: int,
    ) -> FrameComplete | Dropped | None:
        """A valid chunk that starts, supersedes, duplicates or lands out of order (§5.2)."""
        stats = st.stats
        asm = st.asm
        if asm is not None:
            if now_ns - asm.first_ns > self.timeout_ns:
                self._abandon(st, FrameDrop.ASSEMBLY_TIMEOUT)
                asm = None
            elif seq != asm.seq:
                if seq < asm.seq:
                    return self._drop(st, seq, ChunkDrop.STALE_SEQ)
                self._abandon(st, FrameDrop.SUPERSEDED)
                asm = None
            elif count != asm.count or plen != asm.plen:
                return self._abandon(st, FrameDrop.CHUNK_INCONSISTENT)
        if asm is None:
            if seq <= st.floor:
                return self._drop(st, seq, ChunkDrop.STALE_SEQ)
            target = self.sink.acquire(st.index, seq, plen)
            if type(target) is str:
                st.floor = seq
                stats.frame_drops.increment(target)
                return Dropped(st.index, st.source, seq, target, True)
            asm = st.asm = _Assembly(seq, count, plen, now_ns, target)  # type: ignore[arg-type]

        end = off + clen
        data = mv[ppos : ppos + clen]
        hpos = ppos - 4 - HEADER_SLOT_BYTES
        if off == asm.prefix and not asm.pending:
            if asm.received[idx]:
                return self._abandon(st, FrameDrop.CHUNK_CONFLICT)
            asm.buf[off:end] = data
            asm.prefix = end
        else:
            known = asm.start_length(off)
            if known is not None:
                if (
                    known == clen
                    and asm.buf[off:end] == data
                    and (not hinc or asm.header is None or asm.header == mv[hpos : ppos - 4])
                ):
                    stats.chunk_drops.increment(ChunkDrop.DUPLICATE)
                    return Dropped(st.index, st.source, seq, ChunkDrop.DUPLICATE, False)
                return self._abandon(st, FrameDrop.CHUNK_CONFLICT)
            if asm.received[idx]:
                return self._abandon(st, FrameDrop.CHUNK_CONFLICT)
            if asm.overlaps(off, end):
                return self._abandon(st, FrameDrop.CHUNK_OVERLAP)
            asm.buf[off:end] = data
            asm.cover(off, end)
        asm.starts[off] = clen
        asm.received[idx] = 1
        asm.nrecv += 1
        stats.chunks += 1
        if hinc:
            asm.header = bytes(mv[hpos : ppos - 4])
        if asm.nrecv == asm.count:
            return self._complete(st, asm)
        return None

    def _complete(self, st: _Stream, asm: _Assembly) -> FrameComplete | Dropped:
        """§6 steps 1-6 on the assembled frame; §5.3 for anything inconsistent."""
        if asm.prefix != asm.plen or asm.pending:
            return self._abandon(st, FrameDrop.COVERAGE_MISMATCH)
        header = asm.header
        assert header is not None  # chunk 0 is one of the `count` distinct indices
        if _U64.unpack_from(header, 0)[0] >> 1 != asm.seq:
            return self._abandon(st, FrameDrop.HEADER_SEQ_MISMATCH)
        values_len, _slot, pool_id, payload_offset, ts, meta_version = SLOT_FIELDS_READ.unpack_from(
            header, SLOT_FIELDS_OFFSET
        )
        if values_len != asm.plen:
            return self._abandon(st, FrameDrop.HEADER_VALUES_LEN_MISMATCH)
        if payload_offset != 0:
            return self._abandon(st, Reason.PAYLOAD_OFFSET_NONZERO)
        stride = st.pools.get(pool_id)
        if stride is None:
            return self._abandon(st, FrameDrop.HEADER_POOL_ID_UNKNOWN)
        if values_len > stride:
            return self._abandon(st, ChunkDrop.PAYLOAD_EXCEEDS_SOURCE_STRIDE)
        blob = header[TENSOR_BLOB_OFFSET:TENSOR_BLOB_END]
        layout = self._layouts.get(blob)
        if layout is None:
            try:
                layout = TensorLayout.from_blob_fields(TENSOR_BLOB_READ.unpack(blob))
            except TensorLayoutError as exc:
                return self._abandon(st, exc.reason)
            if len(self._layouts) >= _LAYOUT_CACHE_MAX:
                self._layouts.clear()
            self._layouts[blob] = layout
        if values_len and values_len < layout.extent_bytes:
            return self._abandon(st, Reason.VALUES_LEN_BELOW_EXTENT)
        st.asm = None
        st.floor = asm.seq
        stats = st.stats
        stats.frames += 1
        stats.bytes += values_len
        return FrameComplete(
            st.index,
            st.source,
            st.dest,
            st.epoch,
            asm.seq,
            layout,
            values_len,
            ts,
            meta_version,
            pool_id,
            header,
            asm.buf,
        )

    # -- timers -----------------------------------------------------------------------------

    def tick(self, now_ns: int) -> list[Dropped]:
        """Expire frames whose first chunk is older than the assembly timeout (§5.3a)."""
        out: list[Dropped] = []
        for st in self._by_index.values():
            asm = st.asm
            if asm is not None and now_ns - asm.first_ns > self.timeout_ns:
                dropped = self._abandon(st, FrameDrop.ASSEMBLY_TIMEOUT)
                if dropped is not None:
                    out.append(dropped)
        return out

    # -- progress (§9) ----------------------------------------------------------------------

    def on_progress(
        self,
        stream_id: int,
        epoch: int,
        frame_id: int,
        payload_bytes_filled: int,
        state: int,
    ) -> ProgressOut | str:
        """Remap a forwarded ``FrameProgress`` to the local stream and header index.

        The local producer writes frame ``seq`` to slot ``seq & (nslots - 1)`` of the
        destination ring, so the mapping is known whenever the destination is open for the
        progress's source epoch. Progress for frames already finished here is expired.
        Returns the message to republish, or a drop reason.
        """
        st = self._streams.get(stream_id)
        if st is None:
            self.chunk_drops.increment(ControlDrop.PROGRESS_UNKNOWN_STREAM)
            return ControlDrop.PROGRESS_UNKNOWN_STREAM
        drops = st.stats.control_drops
        if st.announce is None or epoch != st.epoch:
            drops.increment(ControlDrop.PROGRESS_EPOCH_MISMATCH)
            return ControlDrop.PROGRESS_EPOCH_MISMATCH
        if not st.dest_ready or st.local_nslots <= 0:
            drops.increment(ControlDrop.PROGRESS_NO_DESTINATION)
            return ControlDrop.PROGRESS_NO_DESTINATION
        if frame_id <= st.floor:
            drops.increment(ControlDrop.PROGRESS_EXPIRED)
            return ControlDrop.PROGRESS_EXPIRED
        st.stats.progress += 1
        return ProgressOut(
            st.dest,
            epoch,
            frame_id,
            frame_id & (st.local_nslots - 1),
            payload_bytes_filled,
            state,
        )

    # -- helpers ----------------------------------------------------------------------------

    def _refresh_bounds(self, st: _Stream) -> None:
        """The fast path's single payloadLength bound; -1 (nothing passes) until ready."""
        if st.dest_ready and st.announce is not None:
            st.max_plen = min(self.max_payload_bytes, st.max_source_stride, st.local_max_stride)
        else:
            st.max_plen = -1

    def _global_drop(self, reason: str, stream_id: int = 0, seq: int = 0) -> Dropped:
        self.chunk_drops.increment(reason)
        return Dropped(-1, stream_id, seq, reason, False)

    def _drop(self, st: _Stream, seq: int, reason: str) -> Dropped:
        st.stats.chunk_drops.increment(reason)
        return Dropped(st.index, st.source, seq, reason, False)

    def _abandon(self, st: _Stream, reason: str) -> Dropped | None:
        """Drop the frame in flight (if any): count it, release its buffer, raise the floor."""
        asm = st.asm
        if asm is None:
            return None
        st.asm = None
        if asm.seq > st.floor:
            st.floor = asm.seq
        st.stats.frame_drops.increment(reason)
        self.sink.release(st.index, asm.seq)
        return Dropped(st.index, st.source, asm.seq, reason, True)
