"""The consumer agent: maps a producer's regions and reads frames it is told about.

A consumer listens to the control stream for `ShmPoolAnnounce` (which epoch to
map and where), the metadata stream for `DataSourceAnnounce`/`DataSourceMeta`,
and the descriptor stream for `FrameDescriptor`s. Every protocol decision --
which announce to act on, when to remap, how a descriptor's seq counts, the
local rate grid, QoS/hello cadence, lease reactions -- is made by the sans-IO
:class:`~tensorpool.client.consumer_core.ConsumerCore` (its docstring lists the
rules); this module owns the Aeron subscriptions, the mappings and the clock and
executes the core's actions. Per descriptor, after the core said ``READ``, the
slot is read with the seqlock of §8.3 (`SlotReader`): late reasons are
`drops_late`.

Zero-copy contract: `Frame.array` is a read-only view of the producer's slot. It
is valid only inside the handler (until the next poll), and the producer may
overwrite it at any moment (the ring is lossy). After using the view, call
`frame.is_current()` and discard your result if it returns False; or call
`frame.copy()`, which copies and re-validates (None if overwritten). Frames whose
final check fails are counted as `torn_read` (late).

FrameProgress (Wire §10.2.2), opt-in with `progress=ProgressRequest()`: the hello says
`supportsProgress`, accepted progress messages go to `set_progress_handler`'s handler
(`progress_core.ProgressTracker` says which), and `read_prefix(event)` copies the filled
prefix of a frame still being written, validated like any slot read. Neither is a frame:
frames come only from descriptors; prefix refusals count in `stats.progress`.
"""

from __future__ import annotations

import logging
import random
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tensorpool.client import consumer_core as core_mod
from tensorpool.client.announce import StreamLayout
from tensorpool.client.conductor import ClientConductor, Inbox, LaneKey, lane_key
from tensorpool.client.consumer_core import (
    AFTER_HANDLER_ERROR,
    CHECK,
    EPOCH_MISMATCH,
    NOT_MAPPED,
    RATE_LIMITED,
    READ,
    REMAP,
    RESYNC,
    SEQ_REGRESSION,
    SKIP,
    SUPERBLOCK_EPOCH_CHANGED,
    SUPERBLOCK_MAGIC_CHANGED,
    SUPERBLOCK_PID_CHANGED,
    CheckMapping,
    ConsumerCore,
    ConsumerStats,
    DriverSilent,
    MapEpoch,
    SendHello,
    SendQos,
    Unmap,
)
from tensorpool.client.driver_client import DriverClient
from tensorpool.client.lease import ROLE_CONSUMER, LeaseTimings
from tensorpool.client.mapping import map_stream
from tensorpool.client.per_consumer import STALE_PERIODS
from tensorpool.client.progress_core import FrameProgress, ProgressRequest, ProgressTracker
from tensorpool.client.settings import ClientSettings
from tensorpool.counters import Reason
from tensorpool.shm.batch import REASONS as BATCH_REASONS
from tensorpool.shm.batch import BatchReader, SlotBatch, empty_batch
from tensorpool.shm.errors import ShmError
from tensorpool.shm.layout import MAGIC
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.region import ShmRegion
from tensorpool.shm.ring import HeaderRingView
from tensorpool.shm.seqlock import PrefixRead, SlotRead, SlotReader
from tensorpool.shm.superblock import is_fresh
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs import CodecError
from tensorpool.specs.generated import wire
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext
from tensorpool.transport.subscription import Subscriber
from tensorpool.transport.wakeup import DEFAULT_MAX_WAIT_NS, SemaphoreIdleStrategy

if TYPE_CHECKING:
    from tensorpool.gpu.delivery import DeviceBatch, DeviceDelivery

log = logging.getLogger(__name__)

MODE_STREAM = int(wire.Mode.STREAM)
MODE_RATE_LIMITED = int(wire.Mode.RATE_LIMITED)
_decode_desc = wire.FrameDescriptorDecoder.decode_tuple
_SLOT_MISS = frozenset({Reason.SEQ_MISMATCH, Reason.NOT_COMMITTED})
_BATCH_REASONS = BATCH_REASONS
_CODE_SEQ_MISMATCH = BATCH_REASONS.index(Reason.SEQ_MISMATCH)
_CODE_NOT_COMMITTED = BATCH_REASONS.index(Reason.NOT_COMMITTED)
DEFAULT_MAX_OUTSTANDING_SEQ_GAP = core_mod.DEFAULT_MAX_OUTSTANDING_SEQ_GAP
#: A ``FrameDescriptor`` message (8-byte SBE header + 36-byte block): the batch path copies
#: each message's bytes into a row of a buffer and checks the whole batch at once.
_DESC_LEN = 8 + wire.FrameDescriptorDecoder.BLOCK_LENGTH
_SEQ_AT = 8 + wire.FrameDescriptorDecoder.SEQ_OFFSET
_unpack_seq = struct.Struct("<Q").unpack_from
#: A recorded row's first u32 (SBE block length and template id) and its stream id.
_unpack_head = struct.Struct("<I4xI").unpack_from
_DESC_WORD0 = (
    wire.FrameDescriptorDecoder.BLOCK_LENGTH | wire.FrameDescriptorDecoder.TEMPLATE_ID << 16
)
assert _SEQ_AT == 20 and wire.FrameDescriptorDecoder.HEADER_INDEX_OFFSET + 8 == 28

__all__ = [
    "AFTER_HANDLER_ERROR",
    "EPOCH_MISMATCH",
    "MODE_RATE_LIMITED",
    "MODE_STREAM",
    "NOT_MAPPED",
    "RATE_LIMITED",
    "RESYNC",
    "SEQ_REGRESSION",
    "Consumer",
    "ConsumerStats",
    "Frame",
    "FrameBatch",
    "OwnedFrame",
]

#: What :meth:`Consumer.poll_batch` returns (see :class:`tensorpool.shm.batch.SlotBatch`).
FrameBatch = SlotBatch


def _desc_template(stream_id: int, epoch: int, rows: int) -> np.ndarray:
    """Rows of the first eight u32 words of a ``FrameDescriptor``: the five every descriptor
    of the mapped stream and epoch starts with (SBE header: block length, template, schema,
    version; stream id; epoch), then seq and header index, filled per batch."""
    dec = wire.FrameDescriptorDecoder
    head = [
        _DESC_WORD0,
        dec.SCHEMA_ID | dec.SCHEMA_VERSION << 16,
        stream_id,
        epoch & 0xFFFFFFFF,
        epoch >> 32,
        0,
        0,
        0,
    ]
    return np.tile(np.array(head, np.uint32), (rows, 1))


class Frame:
    """One accepted frame; reused between calls — copy out what must outlive the handler."""

    __slots__ = ("_consumer", "_read", "_verdict", "epoch", "stream_id")

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._read: SlotRead | None = None
        self._verdict: bool | None = None
        self.stream_id = consumer.stream_id
        self.epoch = 0

    @property
    def seq(self) -> int:
        return self._r.seq

    @property
    def timestamp_ns(self) -> int:
        return self._r.timestamp_ns

    @property
    def meta_version(self) -> int:
        return self._r.meta_version

    @property
    def header_index(self) -> int:
        return self._r.header_index

    @property
    def pool_id(self) -> int:
        return self._r.pool_id

    @property
    def values_len_bytes(self) -> int:
        return self._r.values_len_bytes

    @property
    def array(self) -> np.ndarray:
        """Zero-copy read-only view (empty array for an empty payload)."""
        arr = self._r.array
        if arr is None:
            return np.empty(0, np.uint8)
        return arr

    @property
    def dtype(self) -> np.dtype:
        return self._r.layout.dtype

    @property
    def layout(self) -> TensorLayout:
        """The validated tensor layout of the slot (a relay re-materializes it unchanged)."""
        return self._r.layout

    @property
    def shape(self) -> tuple[int, ...]:
        return self._r.layout.shape

    @property
    def _r(self) -> SlotRead:
        r = self._read
        if r is None:
            raise RuntimeError("frame used outside its handler")
        return r

    def is_current(self) -> bool:
        """True if the slot still holds this frame: the view's bytes were not overwritten.

        Once False, always False for this frame (it is counted as torn once).
        """
        if self._verdict is False:
            return False
        ok = self._consumer._confirm(self._r)
        self._verdict = ok
        return ok

    def raw_views(self) -> tuple[memoryview, memoryview]:
        """Zero-copy bytes of this frame's 256-byte header slot and payload
        ``[0, values_len_bytes)`` (see ``SlotReader.raw_views``), for relays such as the
        UDP bridge; valid only inside the handler, confirm with `is_current()` after use."""
        reader = self._consumer._reader
        if reader is None:
            raise RuntimeError("frame used outside its handler")
        return reader.raw_views(self._r)

    def copy(self) -> np.ndarray | None:
        """An owned copy of the tensor, or None if the slot was overwritten meanwhile."""
        out = self.array.copy(order="K")  # keep the producer's memory layout
        return out if self.is_current() else None


@dataclass(frozen=True, slots=True)
class OwnedFrame:
    """A validated copy of a frame, safe to keep."""

    stream_id: int
    epoch: int
    seq: int
    timestamp_ns: int
    meta_version: int
    array: np.ndarray


class Consumer:
    """Reads one stream. Poll from one thread (the agent around a :class:`ConsumerCore`)."""

    def __init__(
        self,
        ctx: AeronContext,
        stream_id: int,
        settings: ClientSettings | None = None,
        *,
        consumer_id: int | None = None,
        mode: int = MODE_STREAM,
        max_rate_hz: int = 0,
        max_outstanding_seq_gap: int = DEFAULT_MAX_OUTSTANDING_SEQ_GAP,
        clock: NanoClock = now_ns,
        fragment_limit: int = 64,
        driver: bool = False,
        client_id: int | None = None,
        lease_timings: LeaseTimings | None = None,
        progress: ProgressRequest | None = None,
    ) -> None:
        self.settings = settings or ClientSettings()
        self.stream_id = stream_id
        self.core = ConsumerCore(
            stream_id,
            consumer_id if consumer_id is not None else random.getrandbits(31) + 1,
            freshness_ns=self.settings.freshness_ns,
            qos_period_ns=self.settings.qos_period_ns,
            mode=mode,
            max_rate_hz=max_rate_hz,
            max_outstanding_seq_gap=max_outstanding_seq_gap,
            driver_mode=driver,
            realtime_clock=time.time_ns,
        )
        self.consumer_id = self.core.consumer_id
        self.mode = mode
        self.max_rate_hz = max_rate_hz
        self._rate_limited = mode == MODE_RATE_LIMITED and max_rate_hz > 0
        self._clock = clock
        self.stats = self.core.stats
        self.progress_request = progress
        self._progress = ProgressTracker(self.stats.progress) if progress is not None else None
        self._progress_handler: Callable[[FrameProgress], object] | None = None
        self.last_prefix_drop_reason: str | None = None
        self._next_duty_ns = 0
        self._policy = PathPolicy(self.settings.base_dirs)
        self._regions: list[ShmRegion] = []
        self._reader: SlotReader | None = None
        self._pid = 0  # the header superblock's pid when mapped (§15.14)
        self._frame = Frame(self)
        self._handler: Callable[[Frame], object] | None = None
        self._handler_error: BaseException | None = None
        self._delivered = 0
        self.metadata: dict[str, tuple[str, bytes]] = {}
        self.source_name = ""
        self.config_declined: bool | None = None
        """The last ``ConsumerConfig`` for us declined a stream of our own (None: none yet)."""
        self._fragment_limit = fragment_limit
        # an assigned stream is read from once its publisher is there (until then the shared
        # one still is): (target, subscription, since); and an assignment nobody published on
        self._pending_desc: tuple[tuple[str, int], Subscriber, int] | None = None
        self._unconnected: tuple[str, int] | None = None  # until the next mapping
        self.control_stream: tuple[str, int] | None = None
        """Our own control stream (§10.1.3), where our ``FrameProgress`` comes from while it
        has a publisher; None: the shared control stream."""
        self._own_ctl: tuple[LaneKey, Inbox] | None = None
        # as long as a producer takes to release a stale consumer's stream (§10.1.3)
        self._assign_grace_ns = max(
            self.settings.freshness_ns, STALE_PERIODS * self.settings.qos_period_ns
        )
        self._buf = bytearray(4096)
        self._wake_strategies: list[SemaphoreIdleStrategy] = []
        # batch path (poll_batch): raw descriptor rows recorded by a minimal fragment handler
        self._batch_reader: BatchReader | None = None
        self._pending: SlotBatch | None = None
        self._carry = 0
        self._rec_buf = bytearray(_DESC_LEN * 64)
        self._rec_odd: dict[int, bytes] = {}
        self._record = self._make_recorder()
        self._desc_tmpl = _desc_template(stream_id, 0, 64)
        self._run_steps = np.arange(64, dtype=np.uint64)
        # device delivery (issue #20): made by to_device() or the first poll_batch(device=...)
        self._gpu: DeviceDelivery | None = None

        self._ctx = ctx
        ch = self.settings.channels
        # the control plane is the process's conductor's (#28.1): the control and metadata
        # streams are polled and decoded once for all clients; this stream's share arrives here
        self._conductor = conductor = ClientConductor.acquire(ctx, ch)
        self._inbox = conductor.register_consumer(stream_id)
        self._pub_control = conductor.control_pub
        self._pub_qos = conductor.qos_pub
        self._shared_desc = (ch.descriptor_channel, ch.descriptor_stream_id)
        self.descriptor_stream = self._shared_desc
        """Where descriptors come from: the shared stream, or our own (§10.1.3)."""
        self._sub_desc = self._subscribe_descriptors(*self._shared_desc)
        # Driver mode (Driver Model §2.3): the lease is the licence to map; announces only
        # refresh or move an attached consumer to the epoch the driver bumped.
        self._driver: DriverClient | None = None
        if driver:
            self._driver = DriverClient(
                conductor,
                stream_id,
                ROLE_CONSUMER,
                # the driver matches a ConsumerHello to the consumer's lease by this id
                # (Driver Model §11: it assigns per-consumer streams to lease holders)
                client_id=client_id if client_id is not None else self.consumer_id,
                timings=lease_timings,
                clock=clock,
            )

    # --- public API ---------------------------------------------------------------------------
    @property
    def epoch(self) -> int | None:
        return self.core.epoch if self._reader is not None else None

    @property
    def is_mapped(self) -> bool:
        return self._reader is not None

    @property
    def layout(self) -> StreamLayout | None:
        """The announce of the mapped (or last mapped) epoch."""
        return self.core.layout

    @property
    def meta_version(self) -> int | None:
        return self.core.meta_version

    def poll(self, handler: Callable[[Frame], object], limit: int = 64) -> int:
        """Process control traffic and deliver up to `limit` frames; return frames delivered.

        The frame passed to `handler` (and its `array`) is only valid during the call.
        """
        if self._pending is not None:
            self._settle()
        now = self._clock()
        if now >= self._next_duty_ns:
            self._control_duties(now)
        if self._reader is None:
            return 0
        self._handler = handler
        self._delivered = 0
        sub = self._sub_desc
        while self._delivered < limit and sub.poll(limit - self._delivered):
            if self._handler_error is not None:
                break
        self._handler = None
        error = self._handler_error
        if error is not None:
            self._handler_error = None
            raise error
        return self._delivered

    def poll_batch(
        self,
        max_frames: int = 64,
        *,
        copy: bool = False,
        device: str | int | None = None,
        stream: object = None,
        wait: bool = True,
    ) -> FrameBatch | DeviceBatch:
        """Process control traffic, then take up to ``max_frames`` descriptors and read their
        frames as one batch (the fast path for many small frames; see ``shm/batch.py``).

        The fragment handler only records each descriptor's bytes; the descriptors are then
        decoded, checked by the core (a consecutive run in one call) and their slots
        validated with a few numpy operations per batch. Drop reasons and counters are the
        per-frame path's. ``batch.array`` is one ``(n, *shape)`` array when the frames share
        a layout (``batch.arrays`` otherwise); ``batch.valid`` masks the rows accepted.

        Zero-copy (default): the array views the producer's slots and is valid until the
        next poll; call ``batch.confirm()`` after using it (it re-checks the commit words,
        drops and counts torn rows from ``valid``; the next poll does it otherwise).
        ``copy=True``: the payloads are copied before the second check, already confirmed.
        Returns an empty batch (``len(batch) == 0``) when nothing arrived.

        ``device="cuda:0"`` (needs ``tensorpool[gpu]``): the frames are copied into GPU memory
        on ``stream`` and re-checked after the copy; returns a
        :class:`~tensorpool.gpu.delivery.DeviceBatch` (``wait=False``: call its ``confirm()``
        before trusting ``valid``). See :meth:`to_device` and docs/gpu.md.
        """
        if device is not None:
            return self._poll_device(max_frames, device, stream, wait)
        if self._pending is not None:
            self._settle()
        now = self._clock()
        if now >= self._next_duty_ns:
            self._control_duties(now)
        if self._batch_reader is None:
            return empty_batch()
        n = carried = self._carry  # descriptors recorded last time beyond the ring's wrap
        if max_frames * _DESC_LEN > len(self._rec_buf):
            old = self._rec_buf
            self._rec_buf = bytearray(max_frames * _DESC_LEN)
            self._rec_buf[: n * _DESC_LEN] = old[: n * _DESC_LEN]
            self._record = self._make_recorder()
        state = self._rec_state
        state[0] = n * _DESC_LEN
        sub = self._sub_desc
        record = self._record
        while n < max_frames and sub.poll_with(record, max_frames - n):
            n = state[0] // _DESC_LEN
        self.stats.descriptors += n - carried + state[1]
        state[1] = 0
        if n == 0:
            return empty_batch()
        self._carry = 0
        if n == 1:  # a paced stream: one descriptor, nothing to split or carry
            batch = self._read_one_recorded(copy)
            if self._rec_odd:
                self._rec_odd.clear()
            return batch
        if not self._rec_odd:
            # a batch stops at the ring's wrap (one view, no gather): the rest of the
            # descriptors stay recorded for the next call, which the caller makes at once
            first = _unpack_seq(self._rec_buf, _SEQ_AT)[0]
            room = self.core.mask + 1 - (first & self.core.mask)
            if room < n:
                self._carry = n - room
                n = room
        batch = self._read_recorded(n, copy)
        if self._carry:
            buf = self._rec_buf
            buf[: self._carry * _DESC_LEN] = buf[n * _DESC_LEN : (n + self._carry) * _DESC_LEN]
        self._rec_odd.clear()
        return batch

    def to_device(
        self, device: str | int = "cuda:0", *, stream: object = None,
        on_register_failure: str = "error",
    ) -> DeviceDelivery:  # fmt: skip
        """Set up device delivery for :meth:`poll_batch` (``tensorpool[gpu]``): each mapped
        payload pool is pinned once (read-only where supported); ``on_register_failure``:
        ``error`` raises, ``staging`` copies through a pinned buffer. Raises ``ValueError``
        for a bad option and ``GpuUnavailable`` (one line) without CuPy or a GPU."""
        from tensorpool.gpu.delivery import DeviceDelivery

        old = self._gpu
        gpu = DeviceDelivery(device, stream=stream, policy=on_register_failure)  # type: ignore[arg-type]
        if old is not None:
            old.release(self._regions[1:])
            old.close()
        self._gpu = gpu
        return gpu

    def _poll_device(
        self, max_frames: int, device: str | int, stream: object, wait: bool
    ) -> DeviceBatch:
        gpu = self._gpu
        if gpu is None or not gpu.serves(device, stream):
            gpu = self.to_device(device, stream=stream)
        gpu.finish()  # a wait=False batch still open is confirmed after its copy, not before
        batch = self.poll_batch(max_frames)
        gpu.sync(self._regions, self._regions[1:])  # a new mapping's pools: pinned once
        return gpu.deliver(batch, wait=wait)  # type: ignore[arg-type]

    def _make_recorder(self) -> Callable[[object, object], None]:
        """:meth:`poll_batch`'s fragment handler: each descriptor of this stream into a row.

        Another stream's descriptor (a shared descriptor stream) is passed over, not recorded,
        so ``max_frames`` bounds this consumer's frames and a poll drains the other producers'
        traffic. Recorded, they filled the batch: the rate limiter, which sleeps to its next
        slot after a poll that brought none of its frames, took 256 fragments per slot from a
        stream carrying ~7,000 a second, fell a publication window behind, and IPC flow control
        then held back every producer on the stream (the soak at load ~34: 42 % of a 5 kHz
        stream's descriptors not sent, 11 % with this; docs/reliability.md)."""
        buf = self._rec_buf
        mv = memoryview(buf)
        odd = self._rec_odd
        own = self.stream_id
        state = [0, 0]  # bytes recorded; other streams' descriptors passed over
        self._rec_state = state
        self._rec_row0 = mv[:_DESC_LEN]  # the first recorded descriptor, decoded in place

        def record(buffer: object, header: object) -> None:
            k = state[0]
            try:
                mv[k : k + _DESC_LEN] = buffer  # type: ignore[assignment]
            except (ValueError, TypeError):  # not a plain 44-byte descriptor: decoded alone
                odd[k] = bytes(buffer)  # type: ignore[call-overload]
                mv[k : k + 2] = b"\0\0"
            else:
                word0, stream_id = _unpack_head(buf, k)
                if stream_id != own and word0 == _DESC_WORD0:
                    state[1] += 1
                    return
            state[0] = k + _DESC_LEN

        return record

    def _read_recorded(self, n: int, copy: bool) -> FrameBatch:
        core = self.core
        breader = self._batch_reader
        assert breader is not None
        first = _unpack_seq(self._rec_buf, _SEQ_AT)[0]
        batch: FrameBatch | None = None
        if not self._rec_odd and self._clean_run(n, first):
            # one stream, the mapped epoch, consecutive seqs in their own slots: the core
            # takes the run in one call (after deciding its first descriptor alone if needed)
            skipped = core.accept_run(first, n, breader.lapped_head(first))
            if skipped >= 0:
                batch = breader.read_run(first + skipped, n - skipped, copy)
            else:
                want_seq, want_idx = [], []
                batch = self._decide_rows(0, 1, want_seq, want_idx, copy)
                rest = -1 if batch is not None or n == 1 else core.accept_run(first + 1, n - 1)
                if rest >= 0:
                    if want_seq and rest == 0:
                        batch = breader.read_run(first, n, copy)
                    elif not want_seq:
                        batch = breader.read_run(first + 1 + rest, n - 1 - rest, copy)
                    else:
                        want_seq += range(first + 1 + rest, first + n)
                        want_idx += [q & core.mask for q in range(first + 1 + rest, first + n)]
                        batch = self._batch_of(want_seq, want_idx, copy)
                elif batch is None:
                    batch = self._decide_rows(1, n, want_seq, want_idx, copy)
                    if batch is None:
                        batch = self._batch_of(want_seq, want_idx, copy)
        else:
            want_seq, want_idx = [], []
            batch = self._decide_rows(0, n, want_seq, want_idx, copy)
            if batch is None:
                batch = self._batch_of(want_seq, want_idx, copy)
        if len(batch) and not batch.valid.all():
            self._read_misses(batch)
        batch.stream_id = self.stream_id
        batch.epoch = core.epoch
        if batch.confirmed:
            self._count_batch(batch)  # once: a later confirm() by the caller counts nothing
        else:
            batch.on_confirm = self._count_batch
            self._pending = batch
        return batch

    def _read_one_recorded(self, copy: bool) -> FrameBatch:
        """One recorded descriptor (a paced stream): :meth:`poll`'s decision and slot read in
        plain ints, as a one-row batch, so a paced batch consumer gets per-frame latency."""
        raw = self._rec_odd.get(0)
        try:
            stream_id, epoch, seq, index, _ts, _mv = _decode_desc(
                raw if raw is not None else self._rec_row0
            )
        except CodecError as exc:
            self.stats.control.increment("descriptor_" + exc.reason)
            return empty_batch()
        core = self.core
        verdict = core.on_descriptor(
            stream_id, epoch, seq, self._clock() if self._rate_limited else 0
        )
        if verdict:
            verdict = self._slot_verdict(verdict, seq)
            if verdict != READ:
                if verdict == REMAP:
                    self._close_mapping(SEQ_REGRESSION)
                return empty_batch()
        breader = self._batch_reader
        if breader is None:
            return empty_batch()
        batch = breader.read_one(seq, index, copy)
        if batch._one is None:  # refused (a RowBatch is an accepted row)
            self._read_misses(batch)
        batch.stream_id = self.stream_id
        batch.epoch = core.epoch
        if batch.confirmed:
            self._count_batch(batch)
        else:
            batch.on_confirm = self._count_batch
            self._pending = batch
        return batch

    def _read_misses(self, batch: FrameBatch) -> None:
        """``on_read_miss`` for the rows whose slot no longer (or never) held their frame. A
        lapped consumer has many: rows whose slot is ahead only teach the head (one call with
        the newest), the rare rows whose slot is behind (forged) are re-counted one by one."""
        reader = self._reader
        breader = self._batch_reader
        if reader is None or breader is None:
            return
        codes = batch.codes
        miss = (codes == _CODE_SEQ_MISMATCH) | (codes == _CODE_NOT_COMMITTED)
        if not miss.any():
            return
        rows = np.flatnonzero(miss)
        seqs = batch.seqs[rows]
        slot_seqs = breader.slot_seqs(batch.header_index[rows])
        core = self.core
        ahead = slot_seqs >= seqs
        if ahead.any():
            k = int(np.argmax(np.where(ahead, slot_seqs, -1)))
            core.on_read_miss(int(seqs[k]), int(slot_seqs[k]), _BATCH_REASONS[int(codes[rows[k]])])
        for k in np.flatnonzero(~ahead).tolist():
            reason = _BATCH_REASONS[int(codes[rows[k]])]
            core.on_read_miss(int(seqs[k]), int(slot_seqs[k]), reason)

    def _clean_run(self, n: int, first: int) -> bool:
        """Whether the recorded descriptors are plain ``FrameDescriptor``s of this stream and
        the mapped epoch for ``first .. first+n-1``, each naming its own slot: the first eight
        u32 words of every row against a template, one compare for the whole batch."""
        tmpl = self._desc_tmpl
        if len(tmpl) < n:
            tmpl = np.tile(tmpl[:1], (max(n, 2 * len(tmpl)), 1))
            self._desc_tmpl = tmpl
            self._run_steps = np.arange(len(tmpl), dtype=np.uint64)
        part = tmpl[:n]
        seqs = self._run_steps[:n] + np.uint64(first)
        seq_col = part[:, 5:7].view(np.uint64)  # the descriptor's u64 seq, two u32 words
        seq_col[:, 0] = seqs
        part[:, 7] = seqs & np.uint64(self.core.mask)
        rows = np.frombuffer(self._rec_buf, np.uint32, n * (_DESC_LEN // 4)).reshape(n, -1)
        return bool((rows[:, :8] == part).all())

    def _decide_rows(
        self, lo: int, hi: int, want_seq: list[int], want_idx: list[int], copy: bool
    ) -> FrameBatch | None:
        """The per-descriptor route of the batch path for recorded rows ``[lo, hi)``: anything
        but a clean consecutive run (gaps, other streams or epochs, odd messages, the rate
        grid) goes through the core one descriptor at a time, exactly as :meth:`poll` would.
        The rows to read are appended to ``want_*``; returns the batch read so far when a
        proven regression closed the mapping (the rest of the rows are then not mapped)."""
        core = self.core
        buf = self._rec_buf
        odd = self._rec_odd
        batch: FrameBatch | None = None
        for k in range(lo, hi):
            off = k * _DESC_LEN
            raw = odd.get(off)
            try:
                stream_id, epoch, seq, index, _ts, _mv = _decode_desc(
                    raw if raw is not None else bytes(buf[off : off + _DESC_LEN])
                )
            except CodecError as exc:
                self.stats.control.increment("descriptor_" + exc.reason)
                continue
            verdict = core.on_descriptor(
                stream_id, epoch, seq, self._clock() if self._rate_limited else 0
            )
            if verdict:
                verdict = self._slot_verdict(verdict, seq)
                if verdict != READ:
                    if verdict == REMAP:
                        # read what was accepted before the regression, then drop the mapping
                        batch = self._batch_of(want_seq, want_idx, copy)
                        want_seq.clear()
                        want_idx.clear()
                        self._close_mapping(SEQ_REGRESSION)
                    continue
            if self._reader is None:
                continue
            want_seq.append(seq)
            want_idx.append(index)
        return batch

    def _batch_of(self, seqs: list[int], idx: list[int], copy: bool) -> FrameBatch:
        breader = self._batch_reader
        if breader is None or not seqs:
            return empty_batch()
        return breader.read(np.array(seqs, np.int64), np.array(idx, np.int64), copy)

    def _count_batch(self, batch: FrameBatch) -> None:
        """Stats for a batch's accepted rows (after its final seqlock check)."""
        if self._pending is batch:
            self._pending = None
        one = batch._one
        if one is not None:  # one accepted row (RowBatch): plain ints
            self.stats.frames += 1
            self.stats.bytes += one[2]
            return
        valid = batch.valid
        if len(valid) == 1:  # plain ints for a single row
            if valid[0]:
                self.stats.frames += 1
                self.stats.bytes += int(batch.values_len[0])
            return
        n = int(np.count_nonzero(valid))
        if n < len(valid):
            self.core.note_batch(True)  # rows lost: the lapped prediction of accept_run
        if n:
            stats = self.stats
            stats.frames += n
            stats.bytes += int(batch.values_len[valid].sum())

    def _settle(self) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            pending.confirm()

    def _control_duties(self, now: int) -> None:
        # control plane at most every 100 us: cheap empty polls
        self._next_duty_ns = now + 100_000
        self._conductor.poll(now)  # drains the shared streams (bounded) for every client
        self._take_inbox()
        self._duties(now)
        self._check_own_stream(now)

    def frames(
        self, idle: Callable[[], None] | None = None, *, max_idle_polls: int | None = None
    ) -> Iterator[OwnedFrame]:
        """Iterate validated, owned copies of frames (break out to stop).

        `idle()` runs after a poll that delivered nothing; with `max_idle_polls` the
        iterator ends after that many consecutive empty polls. Use `poll` for zero copy.
        """
        box: list[OwnedFrame] = []

        def take(frame: Frame) -> None:
            array = frame.copy()
            if array is not None:
                box.append(
                    OwnedFrame(
                        frame.stream_id,
                        frame.epoch,
                        frame.seq,
                        frame.timestamp_ns,
                        frame.meta_version,
                        array,
                    )
                )

        empty = 0
        while True:
            self.poll(take, 16)
            if box:
                empty = 0
                yield from box
                box.clear()
                continue
            empty += 1
            if max_idle_polls is not None and empty >= max_idle_polls:
                return
            if idle is not None:
                idle()

    def wake_idle_strategy(self, max_wait_ns: int = DEFAULT_MAX_WAIT_NS) -> SemaphoreIdleStrategy:
        """An idle strategy that blocks until this stream's producer posts (see
        :mod:`tensorpool.transport.wakeup`): ``idle.idle(consumer.poll(handler))`` in the loop.

        Owned by this consumer: :meth:`close` closes it (unlinking its semaphore), so a loop
        that forgets to cannot leave ``/dev/shm/sem.tensorpool-wake-*`` behind. It blocks for
        at most ``max_wait_ns`` per empty poll, so the consumer's duties still run that often.
        """
        strategy = SemaphoreIdleStrategy(
            self.settings.namespace, self.stream_id, max_wait_ns, self.consumer_id
        )
        self._wake_strategies.append(strategy)
        self.stats.wake_sems_removed += strategy.removed
        return strategy

    # --- FrameProgress (§10.2.2) --------------------------------------------------------------
    def set_progress_handler(self, handler: Callable[[FrameProgress], object] | None) -> None:
        """Call ``handler`` (from ``poll``/``poll_batch``) with each progress message accepted
        for this stream; needs ``progress=`` at construction (the hello's opt-in)."""
        if self._progress is None:
            raise ValueError("set_progress_handler needs Consumer(progress=ProgressRequest())")
        self._progress_handler = handler

    def read_prefix(self, event: FrameProgress, max_bytes: int | None = None) -> PrefixRead | None:
        """Copy the bytes ``event`` says are filled (at most ``max_bytes``: e.g. only the
        first row), from a frame possibly still being written.

        Seqlock-validated (shm/seqlock.py, "Prefix reads"): None, with the reason counted in
        ``stats.progress`` and kept in ``last_prefix_drop_reason``, when the slot was reused,
        the layout makes no prefix safe, or the epoch is no longer mapped. Not a frame.
        """
        reader = self._reader
        if reader is None or event.epoch != self.core.epoch:
            reason: str = EPOCH_MISMATCH if reader is not None else NOT_MAPPED
        else:
            got = reader.read_prefix(
                event.header_index, event.frame_id, event.bytes_filled, max_bytes
            )
            if not isinstance(got, str):
                return got
            reason = got
        self.stats.progress.increment(reason)
        self.last_prefix_drop_reason = reason
        return None

    def _on_progress(self, dec: wire.FrameProgressDecoder) -> None:
        tracker = self._progress
        if tracker is None:
            return  # §10.2.2: a consumer that did not opt in ignores progress
        if self._reader is None:
            self.stats.progress.increment(NOT_MAPPED)
            return
        core = self.core
        try:
            event = tracker.on_progress(
                dec.stream_id,
                dec.epoch,
                dec.frame_id,
                dec.header_index,
                dec.payload_bytes_filled,
                dec.state_raw,
                mapped_epoch=core.epoch,
                mask=core.mask,
                last_seq=core.last_seq,
            )
        except CodecError as exc:
            self.stats.progress.increment(exc.reason)
            return
        if event is not None and self._progress_handler is not None:
            self._progress_handler(event)

    # --- relay hooks (rate limiter, bridge) ------------------------------------------------------
    def reread(self, epoch: int, seq: int, header_index: int) -> SlotRead | None:
        """Read frame ``seq`` again from its slot, from the fields of a descriptor seen earlier.

        For relays that keep a descriptor and copy the payload later (the rate limiter holds
        the newest frame until its rate slot opens). Returns None when ``epoch`` is no longer
        the mapped epoch or the slot no longer holds that frame (counted like any slot-read
        drop; ``last_read_drop_reason`` says which). The view is zero-copy: call
        :meth:`confirm` after using it.
        """
        reader = self._reader
        if reader is None or epoch != self.core.epoch:
            return None
        return reader.read(header_index, seq)

    def confirm(self, result: SlotRead) -> bool:
        """True if the slot still holds ``result``'s frame (a False answer counts as torn)."""
        return self._confirm(result)

    @property
    def last_read_drop_reason(self) -> str | None:
        """Why the most recent slot read was refused (None before any refusal)."""
        reader = self._reader
        return None if reader is None else reader.last_drop_reason

    @property
    def drops_gap(self) -> int:
        return self.core.stats.drops_gap

    @property
    def drops_late(self) -> int:
        return self.core.drops_late

    # --- descriptors (hot path) ---------------------------------------------------------------
    def _on_descriptor(self, buffer: object, header: object) -> None:
        self.stats.descriptors += 1
        try:
            stream_id, epoch, seq, index, _ts, _mv = _decode_desc(buffer)
        except CodecError as exc:
            self.stats.control.increment("descriptor_" + exc.reason)
            return
        if self._handler_error is not None:
            if stream_id == self.stream_id:
                # Aeron already took this descriptor out of the log; it is lost to us.
                self.stats.drops.increment(AFTER_HANDLER_ERROR)
            return
        core = self.core
        verdict = core.on_descriptor(
            stream_id, epoch, seq, self._clock() if self._rate_limited else 0
        )
        if verdict:  # not READ outright: the slot check (no extra call on the common path)
            verdict = self._slot_verdict(verdict, seq)
            if verdict != READ:
                if verdict == REMAP:
                    self._close_mapping(SEQ_REGRESSION)
                return
        reader = self._reader
        if reader is None:
            return
        result = reader.read(index, seq)
        if result is None:
            reason = reader.last_drop_reason
            if reason in _SLOT_MISS and 0 <= index <= core.mask:
                core.on_read_miss(seq, reader.slot_seq(index), reason)  # type: ignore[arg-type]
            return
        frame = self._frame
        frame._read = result
        frame._verdict = None
        frame.epoch = epoch
        try:
            self._handler(frame)  # type: ignore[misc]
        except BaseException as exc:
            self._handler_error = exc  # re-raised by poll() once Aeron's poll returns
            return
        finally:
            frame._read = None
        verdict = frame._verdict
        if verdict is None:  # the handler did not check: check now, after it used the view
            verdict = reader.is_current(result)
        if verdict:
            stats = self.stats
            stats.frames += 1
            stats.bytes += result.values_len_bytes
            self._delivered += 1

    def _slot_verdict(self, verdict: int, seq: int) -> int:
        """Finish the core's decision on a descriptor it did not ``READ`` outright (the one
        rule :meth:`poll` and :meth:`poll_batch` share): ``CHECK`` asks the slots how far the
        producer is (§15.4); anything else, or no mapping, is ``SKIP``. Returns ``READ``,
        ``SKIP`` or ``REMAP`` (the caller closes the mapping, after reading what it accepted
        before the regression)."""
        reader = self._reader
        if verdict != CHECK or reader is None:
            return SKIP
        core = self.core
        mask = core.mask
        last = core.last_seq
        return core.on_slot_check(
            seq,
            reader.slot_seq(seq & mask),
            reader.slot_seq(last & mask) if last >= 0 else -1,
            self._clock() if self._rate_limited else 0,
        )

    def _confirm(self, result: SlotRead) -> bool:
        reader = self._reader
        return reader is not None and reader.is_current(result)

    # --- control plane ------------------------------------------------------------------------
    def _take_inbox(self) -> None:
        """What the conductor decoded for this stream (control and metadata), in order."""
        for dec, join in self._inbox.drain():
            if isinstance(dec, str):  # a message of the shared streams that did not decode
                self._count_control(dec)
            elif isinstance(dec, wire.ShmPoolAnnounceDecoder):
                # we saw nothing before we registered: the join time is at least that (§10.1.1)
                self._on_announce(dec, max(join or 0, self._inbox.registered_ns))
            elif isinstance(dec, wire.ConsumerConfigDecoder):
                if dec.consumer_id == self.consumer_id:
                    self._on_config(
                        dec.descriptor_channel,
                        dec.descriptor_stream_id,
                        (dec.control_channel, dec.control_stream_id),
                    )
            elif isinstance(dec, wire.FrameProgressDecoder):
                if self._own_ctl is not None and self._conductor.hub.connected(self._own_ctl[0]):
                    # ours comes on our own control stream (§10.1.3): this is someone else's
                    self.stats.control.increment("progress_shared_ignored")
                else:
                    self._on_progress(dec)
            else:
                self._on_metadata(dec)
        if self._own_ctl is not None:
            for dec, _ in self._own_ctl[1].drain():
                if isinstance(dec, wire.FrameProgressDecoder):
                    self.stats.progress_own += 1
                    self._on_progress(dec)
                else:  # §10.1.3: producers MUST NOT send anything else there
                    self._count_control(
                        dec if isinstance(dec, str) else "control_stream_unexpected_message"
                    )

    def _set_own_control(self, target: tuple[str, int] | None) -> None:
        """Take our ``FrameProgress`` from ``target`` (through the process's conductor), or
        from the shared control stream again (None)."""
        if target == self.control_stream:
            return
        if self._own_ctl is not None:
            self._conductor.unregister(self._own_ctl[1])
            self._own_ctl = None
        self.control_stream = target
        if target is not None:
            inbox = self._conductor.register_own_control(*target, self.stream_id)
            self._own_ctl = (lane_key(*target), inbox)

    def _subscribe_descriptors(self, channel: str, stream_id: int) -> Subscriber:
        return self._ctx.add_subscription(
            channel,
            stream_id,
            self._on_descriptor,
            fragment_limit=self._fragment_limit,
            guard=False,  # _on_descriptor traps handler errors itself (and re-raises them)
        )

    def _on_config(self, channel: str, stream_id: int, control: tuple[str, int]) -> None:
        """Follow a ``ConsumerConfig`` (§10.1.3, §11): read descriptors from the stream it
        assigns once a publisher is there, or from the shared one when it declines (empty
        channel, id 0; or names our shared stream); and progress from the control stream it
        assigns with it (only with a descriptor stream of our own: stream_ids.grant)."""
        target = (channel, stream_id)
        assigned = bool(channel and stream_id) and target != self._shared_desc
        if not assigned:
            target = self._shared_desc
        elif target == self._unconnected:
            return  # tried: no publisher came (see _check_own_stream); stay on the shared one
        self._unconnected = None
        self.config_declined = not assigned
        wants_progress = self._progress is not None
        own_ctl = assigned and wants_progress and bool(control[0] and control[1])
        self._set_own_control(control if own_ctl else None)
        pending = self._pending_desc
        if pending is not None:
            if pending[0] == target:
                return  # on the way
            self._pending_desc = None
            self._ctx.release(pending[1])
        if target == self.descriptor_stream:
            return  # already there
        if assigned:
            try:
                sub = self._subscribe_descriptors(*target)
            except Exception as exc:  # pyaeron.AeronError: a channel Aeron refuses
                self._unconnected = target
                self.config_declined = True
                self._set_own_control(None)
                self._count_control("descriptor_stream_invalid")
                log.warning("stream %d: cannot read %s#%d: %s", self.stream_id, *target, exc)
                return
            self._pending_desc = (target, sub, self._clock())
        else:
            self._switch_descriptors(self._subscribe_descriptors(*target), target, "declined")

    def _switch_descriptors(self, sub: Subscriber, target: tuple[str, int], why: str) -> None:
        old = self._sub_desc
        self._sub_desc = sub
        self._ctx.release(old)
        self.descriptor_stream = target
        if target == self._shared_desc:  # our streams go (and are declined) together
            self._set_own_control(None)
        self.core.on_consumer_config(target != self._shared_desc)
        self.stats.control.increment(f"descriptor_stream_{why}")
        log.info("stream %d: descriptors from %s#%d (%s)", self.stream_id, *target, why)

    def _check_own_stream(self, now: int) -> None:
        """Move to an assigned stream once its publisher is there; give it up (until the next
        mapping) after a grace without one (the producer does not offer them); go
        back to the shared stream when our own loses its publisher (released, §10.1.3)."""
        pending = self._pending_desc
        if pending is not None:
            target, sub, since = pending
            if sub.is_connected:
                self._pending_desc = None
                self._switch_descriptors(sub, target, "assigned")
            elif now - since > self._assign_grace_ns:
                self._pending_desc = None
                self._ctx.release(sub)
                self._unconnected = target
                self.config_declined = True
                self._set_own_control(None)
                self.stats.control.increment("descriptor_stream_unconnected")
        elif self.descriptor_stream != self._shared_desc and not self._sub_desc.is_connected:
            sub = self._subscribe_descriptors(*self._shared_desc)
            self._switch_descriptors(sub, self._shared_desc, "released")

    def _count_control(self, reason: str) -> None:
        self.stats.control.increment(reason)
        n = self.stats.control[reason]
        if n & (n - 1) == 0:
            log.warning("control message dropped: %s (%d so far)", reason, n)

    def _on_announce(self, dec: wire.ShmPoolAnnounceDecoder, join: int) -> None:
        now = self._clock()
        try:
            driver = self._driver
            action = self.core.on_announce(
                dec, join, now, lease_held=driver is None or driver.holds_lease
            )
        except CodecError as exc:
            self._count_control(exc.reason)
            return
        if action is not None:
            self._execute(action, now)

    def _execute(self, action: object, now: int) -> None:
        """Carry out one core action (see consumer_core's action classes)."""
        if isinstance(action, MapEpoch):
            self._map(action.layout, now)
        elif isinstance(action, CheckMapping):
            unmap = self.core.on_mapping_checked(self._check_mapping(now))
            if unmap is not None:
                self._execute(unmap, now)
        elif isinstance(action, Unmap):
            self._close_mapping(action.reason)
        elif isinstance(action, SendHello):
            if self._send_hello(action):
                self.core.hello_sent()
        elif isinstance(action, SendQos):
            n = wire.QosConsumerEncoder.encode(
                self._buf,
                0,
                stream_id=action.stream_id,
                consumer_id=action.consumer_id,
                epoch=action.epoch,
                last_seq_seen=action.last_seq_seen,
                drops_gap=action.drops_gap,
                drops_late=action.drops_late,
                mode=action.mode,
            )
            self._pub_qos.offer(self._buf, 0, n)
        elif isinstance(action, DriverSilent) and self._driver is not None:
            for ev in self._driver.driver_silent(now):
                self.core.on_lease_event(ev)

    def _check_mapping(self, now: int) -> str | None:
        """Re-validate the live mapping after a same-epoch announce; the problem, or None.

        #13.4 first: ``fstat`` every mapped file (reading past a truncated file's end is a
        SIGBUS). Then the header superblock: ``magic`` and ``epoch`` (§15.1: on every
        announce, not only at map time; a change is a recreation, §15.14), ``pid`` (§15.14:
        the single writer changed -- unmap and wait for a new epoch), activity freshness.
        """
        regions = self._regions
        if not regions:
            return None
        for region in regions:
            if region.truncated():
                log.warning("stream %d: %s was truncated; unmapping", self.stream_id, region.path)
                return Reason.REGION_TRUNCATED
        header = regions[0]
        sb = header.current_superblock()
        if sb.magic != MAGIC:
            return SUPERBLOCK_MAGIC_CHANGED
        if sb.epoch != self.core.epoch:
            return SUPERBLOCK_EPOCH_CHANGED
        if sb.pid != self._pid:
            return SUPERBLOCK_PID_CHANGED
        if not is_fresh(sb.activity_timestamp_ns, now, self.settings.freshness_ns):
            return core_mod.ACTIVITY_STALE
        return None

    def _map(self, layout: StreamLayout, now: int) -> None:
        """Map the new epoch beside the current mapping; swap only once it is proven."""
        try:
            regions = map_stream(
                layout, self._policy, now_ns=now, freshness_window_ns=self.settings.freshness_ns
            )
        except ShmError as exc:
            self.core.on_map_failed(exc.reason)
            n = self.stats.control[exc.reason]
            if n & (n - 1) == 0:
                log.warning(
                    "stream %d epoch %d not mapped (%s); %s",
                    self.stream_id,
                    layout.epoch,
                    exc,
                    "keeping the current mapping" if self._reader is not None else "unmapped",
                )
            return
        header = regions[0]
        ring = HeaderRingView(header.mmap, layout.header_nslots)
        head = ring.head_seq()  # where this consumer joins (frames before it: before_join)
        ring.close()
        self._release(self._reader, self._regions)
        self._regions = regions
        self._pid = header.superblock.pid
        self._reader = SlotReader(header, regions[1:], counters=self.stats.drops)
        self._batch_reader = BatchReader(self._reader)
        self.core.on_mapped(layout, head, now)
        self._unconnected = None  # a new epoch may be a producer that offers own streams
        if self._progress is not None:
            self._progress.forget()
        self._desc_tmpl = _desc_template(self.stream_id, self.core.epoch, 64)
        log.info("stream %d mapped epoch %d", self.stream_id, layout.epoch)

    def _release(self, reader: SlotReader | None, regions: list[ShmRegion]) -> None:
        if self._gpu is not None:  # copies in flight finish, pools are unpinned before unmap
            self._gpu.release(regions[1:])
        self._settle()  # a zero-copy batch still open is checked against the old mapping
        if self._batch_reader is not None:
            self._batch_reader.close()
            self._batch_reader = None
        if reader is not None:
            reader.close()
        for region in regions:
            region.close()

    def _close_mapping(self, why: str) -> None:
        """Execute an unmap the core already decided (or the agent's own, e.g. close)."""
        self.core.unmapped(why)
        if self._reader is None and not self._regions:
            return
        self._release(self._reader, self._regions)
        self._reader = None
        self._regions = []
        log.info("stream %d unmapped (%s)", self.stream_id, why)

    def _on_metadata(self, dec: object) -> None:
        try:
            if isinstance(dec, wire.DataSourceMetaDecoder) and dec.stream_id == self.stream_id:
                if self.core.accept_meta_version(dec.meta_version):
                    self.metadata = {a.key: (a.format, bytes(a.value)) for a in dec.attributes}
            elif isinstance(dec, wire.DataSourceAnnounceDecoder) and (
                dec.stream_id == self.stream_id
            ):
                self.source_name = dec.name
        except CodecError as exc:
            self._count_control(exc.reason)

    def _duties(self, now: int) -> None:
        core = self.core
        if self._driver is not None:
            for ev in self._driver.do_work(now):
                action = core.on_lease_event(ev)
                if action is not None:
                    self._execute(action, now)
        for action in core.tick(now):
            self._execute(action, now)

    def _send_hello(self, hello: SendHello) -> bool:
        want = self.progress_request
        n = wire.ConsumerHelloEncoder.encode(
            self._buf,
            0,
            stream_id=hello.stream_id,
            consumer_id=hello.consumer_id,
            supports_shm=int(wire.Bool.TRUE),
            supports_progress=int(wire.Bool.TRUE if want is not None else wire.Bool.FALSE),
            mode=hello.mode,
            max_rate_hz=hello.max_rate_hz,
            expected_layout_version=0,
            progress_interval_us=None if want is None else want.interval_us,
            progress_bytes_delta=None if want is None else want.bytes_delta,
            descriptor_stream_id=0,
            control_stream_id=0,
            descriptor_channel="",
            control_channel="",
        )
        return bool(self._pub_control.offer(self._buf, 0, n))

    def close(self) -> None:
        """Unmap, detach (driver mode) and release the Aeron resources: an abandoned
        subscription would hold back the publishers' logs for everyone else."""
        strategies, self._wake_strategies = self._wake_strategies, []
        for strategy in strategies:  # first: producers stop posting at their next rescan
            strategy.close()
        self._close_mapping("close")
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
        if self._driver is not None:
            self._driver.close()
        if self._pending_desc is not None:
            self._ctx.release(self._pending_desc[1])
            self._pending_desc = None
        self._ctx.release(self._sub_desc)
        self._set_own_control(None)
        self._conductor.unregister(self._inbox)
        self._conductor.release()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
