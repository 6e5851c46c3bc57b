"""The consumer: maps a producer's regions and reads frames it is told about.

A consumer listens to the control stream for `ShmPoolAnnounce` (which epoch to
map and where), the metadata stream for `DataSourceAnnounce`/`DataSourceMeta`,
and the descriptor stream for `FrameDescriptor`s. Each descriptor is checked in
this order, every refusal counted under a stable reason (§10.2.1, §15.21):

1. other stream -> ignored (shared Aeron streams carry many tensorpool streams);
2. not mapped / epoch differs from the mapping -> `not_mapped` / `epoch_mismatch`
   (in-flight frames of an old epoch are dropped, §15.21);
3. sequence: gaps are `drops_gap`; a regression forces a remap (§15.2); being more
   than `max_outstanding_seq_gap` behind the producer resyncs (§15.4);
4. RATE_LIMITED mode: frames above `max_rate_hz` are dropped locally (§11);
5. seqlock read of the slot (§8.3, `SlotReader`): late reasons are `drops_late`.

Zero-copy contract: `Frame.array` is a read-only view of the producer's slot. It
is valid only inside the handler (until the next poll), and the producer may
overwrite it at any moment (the ring is lossy). After using the view, call
`frame.is_current()` and discard your result if it returns False; or call
`frame.copy()`, which copies and re-validates (None if overwritten). Frames whose
final check fails are counted as `torn_read` (late).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from tensorpool.client.announce import AnnounceTracker, StreamLayout, Verdict
from tensorpool.client.driver_client import (
    ROLE_CONSUMER,
    Attached,
    DriverClient,
    LeaseLost,
    LeaseState,
    LeaseTimings,
    ProducerRevoked,
)
from tensorpool.client.mapping import map_stream
from tensorpool.client.sequence import DEFAULT_MAX_OUTSTANDING_SEQ_GAP, SeqTracker, SeqVerdict
from tensorpool.client.settings import ClientSettings
from tensorpool.counters import LATE_REASONS, DropCounters, Reason
from tensorpool.shm.errors import ShmError
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.region import ShmRegion
from tensorpool.shm.seqlock import SlotRead, SlotReader
from tensorpool.shm.superblock import is_fresh
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs import CodecError, decode_any, peek_header
from tensorpool.specs.generated import bridge as bridge_schema
from tensorpool.specs.generated import driver as driver_schema
from tensorpool.specs.generated import wire
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext

log = logging.getLogger(__name__)

MODE_STREAM = int(wire.Mode.STREAM)
MODE_RATE_LIMITED = int(wire.Mode.RATE_LIMITED)
_WIRE_SCHEMA = wire.FrameDescriptorDecoder.SCHEMA_ID
_OTHER_TENSORPOOL_SCHEMAS = frozenset({driver_schema.SCHEMA_ID, bridge_schema.SCHEMA_ID})
_decode_desc = wire.FrameDescriptorDecoder.decode_tuple

# reasons the consumer itself adds on top of the slot reader's
NOT_MAPPED = "not_mapped"
EPOCH_MISMATCH = "epoch_mismatch"
SEQ_REGRESSION = "seq_regression"
RESYNC = "resync"
RATE_LIMITED = "rate_limited"
AFTER_HANDLER_ERROR = "after_handler_error"


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


@dataclass(slots=True)
class ConsumerStats:
    frames: int = 0
    bytes: int = 0
    drops_gap: int = 0
    drops_late: int = 0
    remaps: int = 0
    drops: DropCounters = field(default_factory=DropCounters)
    control: DropCounters = field(default_factory=DropCounters)


class Consumer:
    """Reads one stream. Poll from one thread."""

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
    ) -> None:
        if mode not in (MODE_STREAM, MODE_RATE_LIMITED):
            raise ValueError(f"mode must be STREAM or RATE_LIMITED, got {mode}")
        if max_rate_hz < 0:
            raise ValueError("max_rate_hz must be >= 0")
        self.settings = settings or ClientSettings()
        self.stream_id = stream_id
        self.consumer_id = consumer_id if consumer_id is not None else random.getrandbits(31) + 1
        self.mode = mode
        self.max_rate_hz = max_rate_hz
        self._min_interval_ns = (
            1_000_000_000 // max_rate_hz if mode == MODE_RATE_LIMITED and max_rate_hz else 0
        )
        # Frames a little early for their slot still count (jitter), a quarter period at most.
        self._rate_tolerance_ns = self._min_interval_ns // 4
        self._next_allowed_ns = 0
        self._clock = clock
        self.stats = ConsumerStats()
        self._seq = SeqTracker(max_outstanding_seq_gap)
        self._max_gap_cfg = max_outstanding_seq_gap
        self._next_duty_ns = 0
        self._tracker = AnnounceTracker(stream_id, self.settings.freshness_ns)
        self._policy = PathPolicy(self.settings.base_dirs)
        self.layout: StreamLayout | None = None
        self._regions: list[ShmRegion] = []
        self._reader: SlotReader | None = None
        self._epoch = -1
        self._frame = Frame(self)
        self._handler: Callable[[Frame], object] | None = None
        self._handler_error: BaseException | None = None
        self._delivered = 0
        self._budget = 0
        self.metadata: dict[str, tuple[str, bytes]] = {}
        self.meta_version: int | None = None
        self.source_name = ""
        self.config_declined: bool | None = None
        self._next_qos_ns = 0
        self._hello_due = True
        self._buf = bytearray(4096)

        self._ctx = ctx
        ch = self.settings.channels
        self._sub_control = ctx.add_subscription(
            ch.control_channel, ch.control_stream_id, self._on_control, fragment_limit=64
        )
        self._sub_meta = ctx.add_subscription(
            ch.metadata_channel, ch.metadata_stream_id, self._on_metadata, fragment_limit=64
        )
        self._sub_desc = ctx.add_subscription(
            ch.descriptor_channel,
            ch.descriptor_stream_id,
            self._on_descriptor,
            fragment_limit=fragment_limit,
            guard=False,  # _on_descriptor traps handler errors itself (and re-raises them)
        )
        self._pub_control = ctx.add_publication(ch.control_channel, ch.control_stream_id)
        self._pub_qos = ctx.add_publication(ch.qos_channel, ch.qos_stream_id)
        # Driver mode (Driver Model §2.3): the lease is the licence to map; announces only
        # refresh or move an attached consumer to the epoch the driver bumped.
        self._driver: DriverClient | None = None
        if driver:
            self._driver = DriverClient(
                ctx,
                self.settings,
                stream_id,
                ROLE_CONSUMER,
                client_id=client_id,
                timings=lease_timings,
                clock=clock,
            )

    @property
    def lease_state(self) -> LeaseState | None:
        """The driver lease state (None in standalone mode)."""
        return None if self._driver is None else self._driver.state

    # --- public API ---------------------------------------------------------------------------
    @property
    def epoch(self) -> int | None:
        return self._epoch if self._reader is not None else None

    @property
    def is_mapped(self) -> bool:
        return self._reader is not None

    def poll(self, handler: Callable[[Frame], object], limit: int = 64) -> int:
        """Process control traffic and deliver up to `limit` frames; return frames delivered.

        The frame passed to `handler` (and its `array`) is only valid during the call.
        """
        now = self._clock()
        if now >= self._next_duty_ns:  # control plane at most every 100 us: cheap empty polls
            self._next_duty_ns = now + 100_000
            # Drain control traffic (bounded) so announces are never read stale after a pause.
            for _ in range(8):
                if self._sub_control.poll() < 64:
                    break
            self._sub_meta.poll()
            self._duties(now)
        if self._reader is None:
            return 0
        self._handler = handler
        self._delivered = 0
        self._budget = limit
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
        if reader is None or epoch != self._epoch:
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
        return self._seq.drops_gap

    @property
    def drops_late(self) -> int:
        return self.stats.drops.sum_of(LATE_REASONS)

    # --- descriptors (hot path) ---------------------------------------------------------------
    def _on_descriptor(self, buffer: object, header: object) -> None:
        try:
            stream_id, epoch, seq, index, _ts, _mv = _decode_desc(buffer)
        except CodecError as exc:
            self.stats.control.increment("descriptor_" + exc.reason)
            return
        if stream_id != self.stream_id:
            return
        drops = self.stats.drops
        if self._handler_error is not None:
            # Aeron already took this descriptor out of the log; it is lost to this consumer.
            drops.increment(AFTER_HANDLER_ERROR)
            return
        reader = self._reader
        if reader is None:
            drops.increment(NOT_MAPPED)
            return
        if epoch != self._epoch:
            drops.increment(EPOCH_MISMATCH)
            return
        verdict = self._seq.on_descriptor(seq)
        if verdict:
            if verdict is SeqVerdict.RESYNC_SKIP:
                drops.increment(RESYNC)
            else:
                drops.increment(SEQ_REGRESSION)
                self._unmap("seq_regression")
            return
        if self._min_interval_ns:
            now = self._clock()
            slot = self._next_allowed_ns
            if now < slot - self._rate_tolerance_ns:
                drops.increment(RATE_LIMITED)
                return
            # Slots on a fixed grid (no drift); re-anchor only after falling a period behind.
            interval = self._min_interval_ns
            self._next_allowed_ns = (slot if now - slot <= interval else now) + interval
        result = reader.read(index, seq)
        if result is None:
            if reader.last_drop_reason == Reason.SEQ_MISMATCH:
                self._seq.observe_head(reader.slot_seq(index))
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

    def _confirm(self, result: SlotRead) -> bool:
        reader = self._reader
        return reader is not None and reader.is_current(result)

    # --- control plane ------------------------------------------------------------------------
    def _on_control(self, buffer: object, header: object) -> None:
        try:
            schema_id = peek_header(buffer)[2]
        except CodecError as exc:
            self._count_control(exc.reason)
            return
        if schema_id != _WIRE_SCHEMA:
            if schema_id not in _OTHER_TENSORPOOL_SCHEMAS:
                self._count_control("unknown_schema_id")
            return  # driver / bridge traffic on a shared control stream is not ours
        try:
            dec = decode_any(buffer)
        except CodecError as exc:
            self._count_control(exc.reason)
            return
        if isinstance(dec, wire.ShmPoolAnnounceDecoder):
            self._on_announce(dec, header)
        elif (
            isinstance(dec, wire.ConsumerConfigDecoder)
            and dec.stream_id == self.stream_id
            and dec.consumer_id == self.consumer_id
        ):
            self.config_declined = dec.descriptor_stream_id == 0

    def _count_control(self, reason: str) -> None:
        self.stats.control.increment(reason)
        n = self.stats.control[reason]
        if n & (n - 1) == 0:
            log.warning("control message dropped: %s (%d so far)", reason, n)

    def _on_announce(self, dec: wire.ShmPoolAnnounceDecoder, header: object) -> None:
        now = self._clock()
        try:
            stream_id = dec.stream_id
            if stream_id != self.stream_id:
                return
            if self._driver is not None and self._driver.state is not LeaseState.ATTACHED:
                self.stats.control.increment("announce_without_lease")
                return
            join = self._sub_control.join_time_ns(header.session_id)  # type: ignore[attr-defined]
            decision = self._tracker.on_announce(
                stream_id,
                dec.epoch,
                dec.announce_timestamp_ns,
                dec.announce_clock_domain_raw,
                dec.header_slot_bytes,
                join,
                now,
            )
            if decision.verdict is Verdict.IGNORE:
                self.stats.control.increment(decision.reason)
                return
            layout = StreamLayout.from_announce(dec)
        except CodecError as exc:
            self._count_control(exc.reason)
            return
        if decision.verdict is Verdict.REFRESH:
            if not self._check_truncated():
                self._check_activity(now)
            return
        self._map(layout, now)

    def _check_truncated(self) -> bool:
        """#13.4: on every announce of the mapped epoch, ``fstat`` each mapped file; if one
        shrank below the mapped length (someone truncated it), unmap before anything touches
        it — reading past a file's end is a SIGBUS. A later valid announce maps again."""
        for region in self._regions:
            if region.truncated():
                self._count_control(Reason.REGION_TRUNCATED)
                self._unmap(Reason.REGION_TRUNCATED)
                return True
        return False

    def _map(self, layout: StreamLayout, now: int) -> None:
        if self._reader is not None:
            self._unmap("epoch_change")
        try:
            regions = self._map_regions(layout, now)
        except ShmError as exc:
            self._count_control(exc.reason)
            log.warning("stream %d epoch %d not mapped: %s", self.stream_id, layout.epoch, exc)
            return
        self._regions = regions
        self._reader = SlotReader(regions[0], regions[1:], counters=self.stats.drops)
        self.layout = layout
        self._epoch = layout.epoch
        self._seq.reset()
        # more than nslots-1 behind the head means overwritten for sure: skip without reading
        self._seq.max_gap = max(1, min(self._max_gap_cfg, layout.header_nslots - 1))
        self._tracker.on_mapped(layout.epoch, now)
        self.stats.remaps += 1
        self._hello_due = True
        log.info("stream %d mapped epoch %d", self.stream_id, layout.epoch)

    def _map_regions(self, layout: StreamLayout, now: int) -> list[ShmRegion]:
        return map_stream(
            layout, self._policy, now_ns=now, freshness_window_ns=self.settings.freshness_ns
        )

    def _check_activity(self, now: int) -> None:
        if not self._regions:
            return
        activity = self._regions[0].activity_timestamp_ns()
        if not is_fresh(activity, now, self.settings.freshness_ns):
            self._count_control("superblock_activity_stale")
            self._unmap("activity_stale")

    def _unmap(self, why: str) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        for region in self._regions:
            region.close()
        self._regions = []
        self._tracker.on_unmapped()
        log.info("stream %d unmapped (%s)", self.stream_id, why)

    def _on_metadata(self, buffer: object, header: object) -> None:
        try:
            dec = decode_any(buffer)
        except CodecError as exc:
            self._count_control(exc.reason)
            return
        try:
            if isinstance(dec, wire.DataSourceMetaDecoder) and dec.stream_id == self.stream_id:
                version = dec.meta_version
                if self.meta_version is None or version >= self.meta_version:
                    self.metadata = {a.key: (a.format, bytes(a.value)) for a in dec.attributes}
                    self.meta_version = version
            elif isinstance(dec, wire.DataSourceAnnounceDecoder) and (
                dec.stream_id == self.stream_id
            ):
                self.source_name = dec.name
        except CodecError as exc:
            self._count_control(exc.reason)

    def _duties(self, now: int) -> None:
        if self._driver is not None:
            for ev in self._driver.do_work(now):
                if isinstance(ev, Attached):
                    self._map(ev.layout, now)
                elif isinstance(ev, LeaseLost):
                    self.stats.control.increment("lease_lost")
                    self._unmap(ev.reason)
                elif isinstance(ev, ProducerRevoked):
                    self.stats.control.increment("producer_revoked")
                    self._unmap("producer_revoked")  # remap on the epoch-bumped announce
        decision = self._tracker.tick(now)
        if decision is not None:
            self.stats.control.increment(decision.reason)
            self._unmap(decision.reason)
            if self._driver is not None:  # the driver went quiet: it may have crashed (§10)
                for ev in self._driver.driver_silent(now):
                    if isinstance(ev, LeaseLost):
                        self.stats.control.increment("lease_lost")
        if self._hello_due:
            self._send_hello()
        if now >= self._next_qos_ns:
            self._next_qos_ns = now + self.settings.qos_period_ns
            self._send_qos()

    def _send_hello(self) -> None:
        n = wire.ConsumerHelloEncoder.encode(
            self._buf,
            0,
            stream_id=self.stream_id,
            consumer_id=self.consumer_id,
            supports_shm=int(wire.Bool.TRUE),
            supports_progress=int(wire.Bool.FALSE),
            mode=self.mode,
            max_rate_hz=self.max_rate_hz,
            expected_layout_version=0,
            descriptor_stream_id=0,
            control_stream_id=0,
            descriptor_channel="",
            control_channel="",
        )
        if self._pub_control.offer(self._buf, 0, n):
            self._hello_due = False

    def _send_qos(self) -> None:
        n = wire.QosConsumerEncoder.encode(
            self._buf,
            0,
            stream_id=self.stream_id,
            consumer_id=self.consumer_id,
            epoch=max(self._epoch, 0),
            last_seq_seen=max(self._seq.last_seq, 0),
            drops_gap=self._seq.drops_gap,
            drops_late=self.drops_late,
            mode=self.mode,
        )
        self._pub_qos.offer(self._buf, 0, n)

    def close(self) -> None:
        """Unmap, detach (driver mode) and release the Aeron resources: an abandoned
        subscription would hold back the publishers' logs for everyone else."""
        self._unmap("close")
        if self._driver is not None:
            self._driver.close()
        for res in (
            self._sub_control,
            self._sub_meta,
            self._sub_desc,
            self._pub_control,
            self._pub_qos,
        ):
            self._ctx.release(res)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
