"""The producer: writes frames into its SHM ring and tells consumers about them.

Standalone mode (this module; the Driver Model adds a lease-based mode): the
producer owns its regions. On start it picks an epoch higher than any it left on
disk (a restart is a new epoch, Wire Spec §15.2), creates the header ring and
pools under `<shm_base_dir>/<namespace>/<instance>/epoch-<E>/` with private modes
(§15.21a.3, §15.21a.6), and from then on:

- per frame: seqlock write (§8.3) then `FrameDescriptor` (§10.2.1), never before
  the commit; frames larger than every pool are dropped and counted (§9), and a
  descriptor that Aeron cannot take (no consumer, back-pressure) is counted too —
  the producer never waits for consumers (§15.4);
- periodically (`do_work`): `ShmPoolAnnounce` (MONOTONIC clock), superblock
  activity refresh, `DataSourceAnnounce`, `DataSourceMeta`, `QosProducer`;
- on `ConsumerHello`: an immediate announce (so a new consumer maps without
  waiting a period) and a `ConsumerConfig` (§10.1.3). By default it declines per-consumer
  streams: consumers stay on the shared stream and rate-limit locally (§11). With
  ``per_consumer=True`` a consumer asking for one (``RATE_LIMITED``, or a named stream) gets
  its own descriptor stream, to which only the frames its ``max_rate_hz`` admits go
  (client/per_consumer.py; ids from ``per_consumer_ids`` standalone, from the driver's
  ``descriptor_stream_id_range`` in driver mode);
- on `QosConsumer` of its stream (the conductor's QoS lane): the consumer is alive; its own
  stream and its progress interest end 5 QoS periods after its last hello or QoS (§10.1.3).

Two write APIs: `offer(array)` copies a numpy array in; `claim(shape, dtype)`
hands back a writable view of the slot for in-place filling, then `commit()`.
With `progress=ProgressSettings()` a claimed frame can report how far it is filled
(`progress(claim, bytes_written)`, Wire §10.2.2): `FrameProgress` STARTED at the claim,
throttled PROGRESS, COMPLETE after the commit, on the control stream; the policy is
`progress_core.ProgressThrottle`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from tensorpool.client.announce import StreamLayout
from tensorpool.client.conductor import ClientConductor
from tensorpool.client.driver_client import DriverClient
from tensorpool.client.lease import ROLE_PRODUCER, LeaseTimings
from tensorpool.client.mapping import map_stream
from tensorpool.client.per_consumer import (
    STALE_PERIODS,
    ConsumerStreams,
    StreamIdPool,
    check_per_consumer_ids,
)
from tensorpool.client.producer_core import (
    AttachWait,
    CloseConsumerStream,
    ConfirmLease,
    MapLease,
    OpenConsumerStream,
    OpenEpoch,
    ProducerAction,
    ProducerCore,
    PublishAnnounce,
    PublishMetadata,
    PublishQos,
    ReportDriverSilent,
    RetryStreamLock,
    SendConsumerConfig,
    Unmap,
)
from tensorpool.client.progress_core import ProgressSettings, ProgressThrottle
from tensorpool.client.rate_gate import RateGate
from tensorpool.client.settings import ClientSettings
from tensorpool.client.stream_lock import StreamBusy, StreamLock, stream_lock_path
from tensorpool.config_util import IdRange
from tensorpool.counters import DropCounters, Reason
from tensorpool.fsafety import missing_dirs
from tensorpool.shm.batch import BatchClaim, BatchWriter
from tensorpool.shm.epochs import gc_epoch_dirs, next_epoch, record_last_epoch
from tensorpool.shm.errors import ShmError, WireLimitError
from tensorpool.shm.layout import (
    MAX_NSLOTS,
    MAX_STRIDE_BYTES,
    PoolConfig,
    header_region_bytes,
    payload_region_bytes,
)
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.region import (
    PRIVATE_FILE_MODE,
    EpochLayout,
    ShmRegion,
    check_space,
    create_region,
    dir_mode_for,
)
from tensorpool.shm.seqlock import SlotWriter
from tensorpool.shm.superblock import LAYOUT_VERSION, SuperblockFields
from tensorpool.shm.tensor import TensorLayout
from tensorpool.shm.uri import format_shm_uri
from tensorpool.specs.generated import wire
from tensorpool.specs.generated.driver import PublishMode
from tensorpool.stream_ids import consumer_config_fields
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext
from tensorpool.transport.publication import Publisher
from tensorpool.transport.wakeup import WakePoster

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = int(wire.ClockDomain.MONOTONIC)
_STARTED = int(wire.FrameProgressState.STARTED)
_PROGRESS = int(wire.FrameProgressState.PROGRESS)
_COMPLETE = int(wire.FrameProgressState.COMPLETE)
_TRUE = int(wire.Bool.TRUE)
NO_LEASE = "no_lease"
#: The largest frame one slot can hold: one stride (#13.4).
MAX_FRAME_BYTES = MAX_STRIDE_BYTES


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """The shape of one stream's SHM: ring depth and payload size classes."""

    stream_id: int
    header_nslots: int = 64
    pools: tuple[PoolConfig, ...] = (PoolConfig(1, 1 << 20),)
    layout_version: int = LAYOUT_VERSION
    name: str = ""
    summary: str = ""

    def __post_init__(self) -> None:
        n = self.header_nslots
        if n <= 0 or n & (n - 1):
            raise ValueError(f"header_nslots must be a power of two, got {n}")
        if not self.pools:
            raise ValueError("a stream needs at least one payload pool")
        ids = [p.pool_id for p in self.pools]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate pool ids {ids}")
        # #13.4: refuse what the wire cannot express here, before any file exists
        if n > MAX_NSLOTS:
            raise WireLimitError(
                Reason.WIRE_LIMIT_EXCEEDED,
                f"header_nslots {n} exceeds the wire limit {MAX_NSLOTS} (u32, power of two)",
            )
        for p in self.pools:
            if p.stride_bytes > MAX_STRIDE_BYTES:
                raise WireLimitError(
                    Reason.WIRE_LIMIT_EXCEEDED,
                    f"pool {p.pool_id} stride_bytes {p.stride_bytes} exceeds the wire limit "
                    f"{MAX_STRIDE_BYTES} (u32, power of two)",
                )

    @classmethod
    def for_frame_bytes(cls, stream_id: int, frame_bytes: int, **kw: object) -> StreamConfig:
        """One pool with the smallest power-of-two, page-multiple stride that fits.

        Raises :class:`WireLimitError` (a ValueError) for frames over ``MAX_FRAME_BYTES``.
        """
        if frame_bytes > MAX_FRAME_BYTES:
            raise WireLimitError(
                Reason.WIRE_LIMIT_EXCEEDED,
                f"a frame of {frame_bytes} bytes exceeds the largest the wire can describe "
                f"({MAX_FRAME_BYTES} bytes: stride_bytes is a u32 power of two)",
            )
        stride = max(os.sysconf("SC_PAGE_SIZE"), 1 << max(frame_bytes - 1, 1).bit_length())
        return cls(stream_id, pools=(PoolConfig(1, stride),), **kw)  # type: ignore[arg-type]

    def region_bytes(self) -> int:
        """Bytes of all region files of one epoch (header ring + every pool)."""
        n = self.header_nslots
        return header_region_bytes(n) + sum(
            payload_region_bytes(n, p.stride_bytes) for p in self.pools
        )


@dataclass(slots=True)
class ProducerStats:
    frames: int = 0
    bytes: int = 0
    descriptors_not_sent: int = 0
    consumer_descriptors: int = 0
    """Descriptors sent on consumers' own streams (§10.1.3), beside the shared stream's."""
    progress_not_sent: int = 0
    """``FrameProgress`` messages the control publication did not take (back-pressure)."""
    announces: int = 0
    wake_sems_removed: int = 0
    """Dead consumers' wake semaphore files the rescan removed (transport/wakeup.py)."""
    drops: DropCounters = field(default_factory=DropCounters)


@dataclass(slots=True)
class FrameClaim:
    """A slot handed out by `Producer.claim`; fill `array` in place, then commit."""

    seq: int
    header_index: int
    pool_id: int
    layout: TensorLayout
    array: np.ndarray


#: A whole ``FrameDescriptor`` message (SBE header + block) as a numpy record: a batch's
#: descriptors are encoded with one store per field, then offered one message each.
_DESC_ROW = np.dtype(
    {
        "names": [
            "block",
            "template",
            "schema",
            "version",
            "stream_id",
            "epoch",
            "seq",
            "index",
            "timestamp_ns",
            "meta_version",
        ],
        "formats": ["<u2", "<u2", "<u2", "<u2", "<u4", "<u8", "<u8", "<u4", "<u8", "<u4"],
        "offsets": [
            0,
            2,
            4,
            6,
            8 + wire.FrameDescriptorEncoder.STREAM_ID_OFFSET,
            8 + wire.FrameDescriptorEncoder.EPOCH_OFFSET,
            8 + wire.FrameDescriptorEncoder.SEQ_OFFSET,
            8 + wire.FrameDescriptorEncoder.HEADER_INDEX_OFFSET,
            8 + wire.FrameDescriptorEncoder.TIMESTAMP_NS_OFFSET,
            8 + wire.FrameDescriptorEncoder.META_VERSION_OFFSET,
        ],
        "itemsize": 8 + wire.FrameDescriptorEncoder.BLOCK_LENGTH,
    }
)


#: Below this many frames ``offer_batch`` takes the per-frame path (cheaper for one or two).
_SMALL_BATCH = 3


class AttachError(RuntimeError):
    """The driver refused the attach (e.g. REJECTED: the stream already has a producer)."""


class Producer:
    """Single-writer producer of one stream (use from one thread).

    Standalone (default): creates and owns its regions. Driver mode (`driver=True`):
    attaches through the SHM driver as the stream's exclusive producer, writes into the
    driver's regions, never creates or announces them (Driver Model §2.2, §3), and
    reattaches with a fresh epoch after losing its lease.
    """

    def __init__(
        self,
        ctx: AeronContext,
        stream: StreamConfig | int,
        settings: ClientSettings | None = None,
        *,
        driver: bool = False,
        producer_id: int | None = None,
        instance_id: str | None = None,
        clock: NanoClock = now_ns,
        prefault: bool = False,
        cleanup_on_close: bool = True,
        keep_epochs: int = 1,
        attach_timeout_s: float = 10.0,
        lease_timings: LeaseTimings | None = None,
        wait_for_held_lease: bool = True,
        file_mode: int = PRIVATE_FILE_MODE,
        takeover: bool = False,
        wake_consumers: bool = True,
        per_consumer: bool = False,
        per_consumer_ids: IdRange | None = None,
        progress: ProgressSettings | None = None,
    ) -> None:
        self.settings = settings or ClientSettings()
        if per_consumer_ids is not None and not driver:  # before anything is acquired
            check_per_consumer_ids(per_consumer_ids, self.settings.channels)
        stream_cfg = StreamConfig(stream) if isinstance(stream, int) else stream
        self.stream = stream_cfg
        self.stream_id = stream_cfg.stream_id
        self._clock = clock
        self._attach_timeout_s = attach_timeout_s
        self._wait_for_held_lease = wait_for_held_lease
        self._cleanup = cleanup_on_close and not driver
        self.stats = ProducerStats()
        self.meta_version = 0
        self._meta_attributes: list[tuple[str, str, bytes]] = []
        self._seq = 0
        self._closed = False
        self._regions: list[ShmRegion] = []
        self._writer: SlotWriter | None = None
        self._batch_writer: BatchWriter | None = None
        self._batch_desc: np.ndarray | None = None  # claim_batch's descriptor rows
        self._batch_desc_views: list[memoryview] = []
        self._layout: EpochLayout | None = None
        self._stream_lock: StreamLock | None = None
        self.epoch = 0
        s = self.settings

        self._ctx = ctx
        ch = s.channels
        # the control plane is the process's conductor's (#28.1): its shared publications, and
        # an inbox for the announces and hellos of this stream, decoded once for all clients
        self._conductor = conductor = ClientConductor.acquire(ctx, ch)
        self._inbox = conductor.register_producer(self.stream_id)
        self._pub_control = conductor.control_pub
        self._pub_qos = conductor.qos_pub
        self._pub_meta = conductor.meta_pub
        self._pub_desc = ctx.add_publication(ch.descriptor_channel, ch.descriptor_stream_id)
        self._desc_buf = bytearray(wire.FrameDescriptorEncoder.encoded_length())
        self._encode_desc = wire.FrameDescriptorEncoder.encode
        self._offer_desc = self._pub_desc.offer
        # #14 wakeup: post each SemaphoreIdleStrategy consumer of the stream after a descriptor
        # went out (nothing to post, one /dev/shm listing a second, when none uses it)
        self._wake = WakePoster(s.namespace, self.stream_id) if wake_consumers else None
        # claim() layouts by (shape, dtype, order): building one costs more than the write
        self._claim_layouts: dict[tuple[object, ...], TensorLayout] = {}
        self._ctl_buf = bytearray(64 * 1024)
        # per-consumer descriptor streams (§10.1.3), off by default (the spec's MAY): the
        # publications by consumer id, and (gate, publication) pairs for the frame path
        self._consumer_pubs: dict[int, tuple[RateGate[object], Publisher, int]] = {}
        self._fanout: tuple[tuple[RateGate[object], Publisher, int], ...] = ()
        streams = None
        if per_consumer:
            streams = ConsumerStreams(
                ids=None if driver else StreamIdPool(per_consumer_ids),
                default_channel=ch.descriptor_channel,
                shared=(ch.descriptor_channel, ch.descriptor_stream_id),
                stale_ns=STALE_PERIODS * s.qos_period_ns,
            )
        # FrameProgress (§10.2.2): off unless asked for; the throttle decides, we publish
        self._progress = (
            ProgressThrottle(progress, stale_ns=STALE_PERIODS * s.qos_period_ns)
            if progress is not None
            else None
        )
        self._progress_buf = bytearray(wire.FrameProgressEncoder.encoded_length())
        self._progress_extent = 0  # bytes per frame of the open claim with progress
        self._core = ProducerCore(
            self.stream_id,
            driver_mode=driver,
            announce_period_ns=s.announce_period_ns,
            qos_period_ns=s.qos_period_ns,
            freshness_ns=s.freshness_ns,
            now_ns=clock(),
            per_consumer=streams,
        )

        self._driver: DriverClient | None = None
        if driver:
            self._driver = DriverClient(
                conductor,
                self.stream_id,
                ROLE_PRODUCER,
                client_id=producer_id,
                timings=lease_timings,
                publish_mode=int(PublishMode.EXISTING_OR_CREATE),
                clock=clock,
            )
            self.producer_id = self._driver.client_id
            self.instance_id = instance_id or ""
            # #14.1: construction never blocks. do_work() attaches when the driver answers;
            # until then `attached` is False (offers and claims count `no_lease`).
            # wait_until_attached() is the blocking convenience for scripts and the CLI.
            return

        self.producer_id = producer_id if producer_id is not None else 1
        self.instance_id = instance_id or f"producer-{self.stream_id}"
        # #13.4: files 0600 unless the caller chooses otherwise: whoever may write a region
        # file may truncate it, and a truncated mapping is a SIGBUS in every process mapping it
        self._file_mode = file_mode
        if file_mode & 0o022:
            log.warning(
                "producer stream %d: region files mode %o are group/world-writable: any such "
                "writer can truncate them and crash every process mapping them (SIGBUS)",
                self.stream_id,
                file_mode,
            )
        self._prefault = prefault
        self._keep_epochs = keep_epochs
        try:
            self._lock_stream(takeover)
            self._open_epoch()
            self._core.on_epoch_opened(clock())  # its announce goes out at the first do_work
        except BaseException:
            self._closed = True
            if self._stream_lock is not None:
                self._stream_lock.release()
            self._release_transport()
            raise

    def _release_transport(self) -> None:
        """Close this producer's publications, leave the conductor (the context stays open)."""
        for cid in list(self._consumer_pubs):
            self._close_consumer_stream(cid)
        self._ctx.release(self._pub_desc)
        self._conductor.unregister(self._inbox)
        self._conductor.release()

    def _lock_stream(self, takeover: bool) -> None:
        """Standalone: become the stream's only producer, or refuse (#13.7).

        A live producer holding the stream raises :class:`StreamBusy` unless ``takeover``;
        one that died left no lock (the kernel dropped it). A taking-over producer runs
        without the lock and picks it up once its predecessor is gone (:meth:`do_work`).
        """
        s = self.settings
        path = stream_lock_path(s.shm_base_dir, s.namespace, self.stream_id)
        try:
            self._stream_lock = StreamLock.try_acquire(
                path,
                self.stream_id,
                dir_mode=dir_mode_for(self._file_mode),
                file_mode=self._file_mode,
            )
        except StreamBusy as exc:
            if not takeover:
                raise
            self._core.lock_pending = True
            log.warning(
                "producer stream %d: taking over from a live producer (%s)",
                self.stream_id,
                exc.owner or path,
            )

    def _retry_stream_lock(self) -> None:
        """After a takeover: hold the stream lock as soon as the old producer let go."""
        s = self.settings
        path = stream_lock_path(s.shm_base_dir, s.namespace, self.stream_id)
        with contextlib.suppress(StreamBusy, OSError):
            self._stream_lock = StreamLock.try_acquire(
                path,
                self.stream_id,
                dir_mode=dir_mode_for(self._file_mode),
                file_mode=self._file_mode,
            )
        self._core.on_stream_lock(self._stream_lock is not None)

    def _open_epoch(self) -> None:
        """Standalone: create a fresh epoch's regions and start writing there (§15.2)."""
        s = self.settings
        instance_dir = os.path.join(s.shm_base_dir, s.namespace, self.instance_id)
        epoch = next_epoch(instance_dir)
        self._layout = EpochLayout(s.shm_base_dir, s.namespace, self.instance_id, epoch)
        gc_epoch_dirs(instance_dir, keep=self._keep_epochs)  # our own dead epochs
        regions = self._create_regions(epoch, self._prefault)
        record_last_epoch(instance_dir, epoch)
        self._install(regions, epoch)
        log.info(
            "producer stream=%d epoch=%d regions under %s",
            self.stream_id,
            self.epoch,
            self._layout.directory,
        )

    def _install(self, regions: list[ShmRegion], epoch: int) -> None:
        """Start writing into `regions` as `epoch`, from seq 0 (§15.2)."""
        header, pools = regions[0], regions[1:]
        self._writer = SlotWriter(header, pools, counters=self.stats.drops)
        self._batch_writer = BatchWriter(self._writer)
        self._regions = regions
        self.epoch = epoch
        self._seq = 0
        self._pool_uris = tuple(
            (r.pool_id, r.nslots, r.stride_bytes, format_shm_uri(r.path)) for r in pools
        )
        self._header_uri = format_shm_uri(header.path)

    def _uninstall(self) -> None:
        if self._progress is not None:  # the open claim went with the regions
            self._progress.cancel()
        self._batch_writer = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for region in self._regions:
            region.close()
        self._regions = []

    # --- driver mode ----------------------------------------------------------------------------
    def wait_until_attached(
        self, timeout_s: float | None = None, *, wait_for_held_lease: bool | None = None
    ) -> None:
        """Drive :meth:`do_work` until the driver grants the lease and the regions are mapped.

        The blocking convenience for scripts and the CLI; the constructor never blocks (#14.1).
        Defaults come from the constructor's ``attach_timeout_s`` / ``wait_for_held_lease``.
        A refusal because the stream's producer lease is still held (a crashed predecessor's)
        is waited out until the timeout when ``wait_for_held_lease`` (#13.3); callers with a
        retry loop of their own (the bridge receiver) pass False and get the refusal at once.
        Standalone producers are attached from construction: this returns at once.
        Raises :class:`AttachError`; the producer stays usable (close it, or keep calling
        do_work to let it attach later).
        """
        if self._driver is None:
            return
        timeout = self._attach_timeout_s if timeout_s is None else timeout_s
        wait_held = (
            self._wait_for_held_lease if wait_for_held_lease is None else wait_for_held_lease
        )
        core = self._core
        core.attach_failures.clear()
        wait = AttachWait(
            self.stream_id, int(timeout * 1e9), self._clock(), wait_for_held_lease=wait_held
        )
        while not core.attached:
            error = self.poll_attach(wait)
            if error is not None:
                raise AttachError(error)
            if not core.attached:
                time.sleep(0.001)

    def poll_attach(self, wait: AttachWait, now_ns: int | None = None) -> str | None:
        """One non-blocking step of :meth:`wait_until_attached`: :meth:`do_work` once, then
        the driver's refusals and the deadline judged by ``wait``.

        For agents that attach from their own duty cycle because other work must not stall
        meanwhile (the bridge receiver's other streams). Returns the error that ends the
        attempt, or None (check :attr:`attached`; keep calling while it is False).
        """
        self.do_work(now_ns)
        core = self._core
        now = self._clock() if now_ns is None else now_ns
        failures = core.attach_failures
        for failure in failures:
            fatal, note = wait.on_failure(failure, now)
            if fatal is not None:
                failures.clear()
                return fatal
            if note is not None:
                log.warning("%s", note)
        failures.clear()
        return None if core.attached else wait.expired(now, core.map_error)

    def _map_lease(self, layout: StreamLayout) -> None:
        self._uninstall()
        try:
            regions = map_stream(layout, PathPolicy(self.settings.base_dirs), writable=True)
        except ShmError as exc:
            self.stats.drops.increment(exc.reason)
            self._core.on_map_failed(str(exc))
            log.error("producer stream %d cannot map driver regions: %s", self.stream_id, exc)
            return
        self.stream = StreamConfig(
            self.stream_id,
            header_nslots=layout.header_nslots,
            pools=tuple(PoolConfig(p.pool_id, p.stride_bytes) for p in layout.pools),
            layout_version=layout.layout_version,
            name=self.stream.name,
            summary=self.stream.summary,
        )
        self._install(regions, layout.epoch)
        self._core.on_mapped(layout.epoch, self._clock())
        log.info("producer stream=%d attached, epoch %d", self.stream_id, layout.epoch)

    @property
    def lease_id(self) -> int | None:
        """The driver lease (None standalone, or while not attached)."""
        return None if self._driver is None else self._driver.lease_id

    @property
    def lease_counters(self) -> dict[str, int]:
        """The lease machine's counters (driver mode; empty standalone)."""
        return {} if self._driver is None else dict(self._driver.machine.counters)

    @property
    def attached(self) -> bool:
        """True while the producer holds regions it may write (always, standalone)."""
        return self._writer is not None

    # --- setup --------------------------------------------------------------------------------
    def _create_regions(self, epoch: int, prefault: bool) -> list[ShmRegion]:
        """Create (and fully allocate) the epoch's files, or nothing at all (#13.4).

        The free space is checked first (one line with needed and free bytes); each file is
        then reserved with ``posix_fallocate`` so a full tmpfs is an error here, never a
        SIGBUS at the first write. On any failure exactly the files and directories this call
        created are removed.
        """
        s, st, lay = self.settings, self.stream, self._layout
        assert lay is not None
        check_space(lay.directory, st.region_bytes(), f"stream {st.stream_id} regions")
        policy = PathPolicy(s.base_dirs)
        now = self._clock()
        new_dirs = missing_dirs(os.path.realpath(lay.directory))
        modes = {"dir_mode": dir_mode_for(self._file_mode), "file_mode": self._file_mode}
        regions: list[ShmRegion] = []
        try:
            regions.append(
                create_region(
                    lay.header_path,
                    SuperblockFields.header_ring(
                        epoch=epoch,
                        stream_id=st.stream_id,
                        nslots=st.header_nslots,
                        now_ns=now,
                        layout_version=st.layout_version,
                    ),
                    policy=policy,
                    replace=True,
                    prefault=prefault,
                    **modes,  # type: ignore[arg-type]
                )
            )
            for pc in st.pools:
                regions.append(
                    create_region(
                        lay.pool_path(pc.pool_id),
                        SuperblockFields.payload_pool(
                            epoch=epoch,
                            stream_id=st.stream_id,
                            pool_id=pc.pool_id,
                            nslots=st.header_nslots,
                            stride_bytes=pc.stride_bytes,
                            now_ns=now,
                            layout_version=st.layout_version,
                        ),
                        policy=policy,
                        replace=True,
                        prefault=prefault,
                        **modes,  # type: ignore[arg-type]
                    )
                )
        except BaseException:
            for region in regions:
                region.close()
                with contextlib.suppress(OSError):
                    os.unlink(region.path)
            for d in new_dirs:  # deepest first; rmdir removes only what is still empty
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise
        return regions

    # --- frames -------------------------------------------------------------------------------
    @property
    def next_seq(self) -> int:
        return self._seq

    def offer(
        self,
        array: np.ndarray,
        *,
        timestamp_ns: int | None = None,
        meta_version: int | None = None,
    ) -> int | None:
        """Copy `array` in as the next frame; return its seq, or None if no pool fits it."""
        writer = self._writer
        if writer is None:
            self.stats.drops.increment(NO_LEASE)
            return None
        seq = self._seq
        ts = self._clock() if timestamp_ns is None else timestamp_ns
        mv = self.meta_version if meta_version is None else meta_version
        index = writer.write(seq, array, timestamp_ns=ts, meta_version=mv)
        if index is None:
            return None
        self._seq = seq + 1
        self._publish(seq, index, ts, mv, array.nbytes)
        return seq

    def _layout_for(
        self, shape: Iterable[int], dtype: np.dtype | type | str, order: str
    ) -> TensorLayout:
        """The contiguous layout of a claim, cached: a camera claims one shape for its whole
        life, and building a layout costs more than the claim itself (bounded to 64 keys)."""
        key = (tuple(shape), dtype, order)
        layout = self._claim_layouts.get(key)
        if layout is None:
            layout = TensorLayout.contiguous(key[0], np.dtype(dtype), order=order)
            if len(self._claim_layouts) >= 64:
                self._claim_layouts.clear()
            self._claim_layouts[key] = layout
        return layout

    def claim(
        self,
        shape: Iterable[int] | None = None,
        dtype: np.dtype | type | str | None = None,
        *,
        order: str = "C",
        layout: TensorLayout | None = None,
        seq: int | None = None,
    ) -> FrameClaim | None:
        """Reserve a slot and return a writable view to fill in place, then `commit`.

        Give `shape` + `dtype` (contiguous in `order`), or a ready `layout` (e.g. a source
        frame's, to re-materialize it exactly). `seq` defaults to the next sequence number;
        a relay that preserves its source's numbering (rate limiter, bridge) passes it, and
        it must not go backwards. The slot is marked in-progress now (§8.3 step 1);
        consumers reading it drop until `commit`. Returns None (counted) when no pool fits
        or, in driver mode, while no lease is held.
        """
        writer = self._writer
        if writer is None:
            self.stats.drops.increment(NO_LEASE)
            return None
        if layout is None:
            if shape is None or dtype is None:
                raise TypeError("claim() needs shape and dtype, or layout")
            layout = self._layout_for(shape, dtype, order)
        if seq is None:
            seq = self._seq
        elif seq < self._seq:
            raise ValueError(f"seq {seq} goes backwards (next is {self._seq})")
        pool_id = writer.pools.select(layout.extent_bytes)
        if pool_id is None:
            self.stats.drops.increment(Reason.NO_POOL_FITS)
            return None
        self._seq = seq
        index = writer.begin(seq)
        view = writer.payload_view(pool_id, index, layout)
        throttle = self._progress
        if throttle is not None:
            self._start_progress(throttle, writer, seq, index, pool_id, layout)
        return FrameClaim(seq, index, pool_id, layout, view)

    def _start_progress(
        self,
        throttle: ProgressThrottle,
        writer: SlotWriter,
        seq: int,
        index: int,
        pool_id: int,
        layout: TensorLayout,
    ) -> None:
        """§10.2.2 STARTED, after writing the whole header now: a consumer reading the prefix
        needs the frame's layout while it is written (commit writes it again, §8.3)."""
        now = self._clock()
        if throttle.start(seq, index, layout.extent_bytes, now) is None:
            return
        self._progress_extent = layout.extent_bytes
        writer.write_header(
            index,
            pool_id=pool_id,
            layout=layout,
            values_len_bytes=layout.extent_bytes,
            timestamp_ns=now,
            meta_version=self.meta_version,
        )
        self._publish_progress(seq, index, 0, _STARTED)

    def progress(self, claim: FrameClaim | BatchClaim, bytes_written: int) -> bool:
        """Report the first ``bytes_written`` bytes of ``claim`` final (Wire §10.2.2); return
        whether a ``FrameProgress`` went out (the throttle may hold it back). The count must
        not go backwards nor exceed the claim; without progress settings this does nothing.

        A :class:`BatchClaim` counts bytes over its frames in order (frame ``k`` is bytes
        ``[k * extent, (k + 1) * extent)``); each report names the frame the count is in.
        """
        throttle = self._progress
        if throttle is None or self._writer is None:
            return False
        first = claim.first_seq if isinstance(claim, BatchClaim) else claim.seq
        if first != self._seq:
            raise ValueError(f"claim for seq {first} is not the open claim ({self._seq})")
        filled = throttle.update(first, bytes_written, self._clock())
        if filled is None:
            return False
        return self._publish_cursor(throttle, filled, _PROGRESS)

    def _cursor_frame(self, filled: int) -> int:
        """Which frame of the open claim byte count ``filled`` lies in (0 for a single claim;
        a frame filled exactly to its end is that frame, not the next one, empty)."""
        extent = self._progress_extent
        return (filled - 1) // extent if filled and extent else 0

    def _publish_cursor(self, throttle: ProgressThrottle, filled: int, state: int) -> bool:
        k = self._cursor_frame(filled)
        return self._publish_progress(
            throttle.frame_id + k,
            throttle.header_index + k,
            filled - k * self._progress_extent,
            state,
        )

    def _publish_progress(self, frame_id: int, index: int, filled: int, state: int) -> bool:
        buf = self._progress_buf
        wire.FrameProgressEncoder.encode(
            buf,
            0,
            stream_id=self.stream_id,
            epoch=self.epoch,
            frame_id=frame_id,
            header_index=index,
            payload_bytes_filled=filled,
            state=state,
        )
        if self._pub_control.offer(buf):
            return True
        self.stats.progress_not_sent += 1
        return False

    def commit(
        self,
        claim: FrameClaim,
        *,
        timestamp_ns: int | None = None,
        meta_version: int | None = None,
        values_len_bytes: int | None = None,
    ) -> int | None:
        """Write the header, commit the slot, then publish its descriptor; return the seq.

        ``values_len_bytes`` defaults to the tensor extent; a relay passes its source's value
        (#14.3: 0 for an empty payload, or more than the extent, Wire §8.2) after filling
        the slot from a claim at least that large. Returns None if the lease was lost since
        the claim (the slot is gone with it).
        """
        writer = self._writer
        if writer is None:
            self.stats.drops.increment(NO_LEASE)
            return None
        if claim.seq != self._seq:
            raise ValueError(f"claim for seq {claim.seq} is not the open claim ({self._seq})")
        ts = self._clock() if timestamp_ns is None else timestamp_ns
        mv = self.meta_version if meta_version is None else meta_version
        nbytes = claim.layout.extent_bytes if values_len_bytes is None else values_len_bytes
        writer.write_header(
            claim.header_index,
            pool_id=claim.pool_id,
            layout=claim.layout,
            values_len_bytes=nbytes,
            timestamp_ns=ts,
            meta_version=mv,
        )
        writer.commit(claim.seq)
        self._seq = claim.seq + 1
        self._publish(claim.seq, claim.header_index, ts, mv, nbytes)
        throttle = self._progress
        if throttle is not None and throttle.complete(claim.seq, nbytes) is not None:
            self._publish_progress(claim.seq, claim.header_index, nbytes, _COMPLETE)
        return claim.seq

    # --- batches ------------------------------------------------------------------------------
    def claim_batch(
        self,
        n: int,
        shape: Iterable[int],
        dtype: np.dtype | type | str,
        *,
        order: str = "C",
    ) -> BatchClaim | None:
        """Reserve up to ``n`` consecutive slots for frames of one layout; fill
        ``claim.array`` (``(claim.n, *shape)``, writable views of the slots), then
        :meth:`commit_batch`. All ``claim.n`` slots are marked in progress with one store
        pass (§8.3 step 1). The claim stops at the ring's wrap, so ``claim.n`` may be less
        than ``n``: claim again for the rest. None (counted per frame) when no pool fits or,
        in driver mode, while no lease is held."""
        writer = self._writer
        bw = self._batch_writer
        if writer is None or bw is None:
            self.stats.drops.increment(NO_LEASE, max(n, 1))
            return None
        if n <= 0:
            raise ValueError(f"claim_batch needs n >= 1, got {n}")
        layout = self._layout_for(shape, dtype, order)
        pool_id = writer.pools.select(layout.extent_bytes)
        if pool_id is None:
            self.stats.drops.increment(Reason.NO_POOL_FITS, n)
            return None
        claim = bw.claim(self._seq, n, layout, pool_id)
        throttle = self._progress
        if throttle is not None:
            now = self._clock()
            extent = layout.extent_bytes
            if throttle.start(claim.first_seq, claim.header_index, claim.n * extent, now) == 0:
                self._progress_extent = extent
                bw.write_headers(claim, now, self.meta_version)  # see _start_progress
                self._publish_progress(claim.first_seq, claim.header_index, 0, _STARTED)
        return claim

    def commit_batch(
        self,
        claim: BatchClaim,
        *,
        timestamps_ns: np.ndarray | int | None = None,
        meta_version: int | None = None,
    ) -> int | None:
        """Write the claim's headers and committed words (one vectorized pass each, §8.3
        steps 3-4), then publish one ``FrameDescriptor`` per frame; return the first seq.
        ``timestamps_ns``: one per frame, or one for all (default: the clock, once).
        None if the lease was lost since the claim."""
        bw = self._batch_writer
        if bw is None:
            self.stats.drops.increment(NO_LEASE, claim.n)
            return None
        if claim.first_seq != self._seq:
            raise ValueError(
                f"batch claim for seq {claim.first_seq} is not the open claim ({self._seq})"
            )
        ts = self._clock() if timestamps_ns is None else timestamps_ns
        mv = self.meta_version if meta_version is None else meta_version
        bw.commit(claim, ts, mv)
        first = claim.first_seq
        self._seq = first + claim.n
        self._publish_batch(claim, ts, mv)
        throttle = self._progress
        if throttle is not None:
            k = self._cursor_frame(throttle.filled)  # COMPLETE for the frame last reported on
            extent = claim.layout.extent_bytes
            if throttle.complete(first, claim.n * extent) is not None:
                self._publish_progress(first + k, claim.header_index + k, extent, _COMPLETE)
        return first

    def offer_batch(
        self,
        frames: np.ndarray,
        *,
        timestamps_ns: np.ndarray | int | None = None,
        meta_version: int | None = None,
    ) -> int | None:
        """Copy ``frames`` (``(n, *shape)``: n frames of one layout) in as the next n frames;
        return the first seq, or None if no pool fits a frame (nothing written).

        Per run of consecutive slots (one run, or two at the ring's wrap): in-progress
        marks, one strided payload copy, headers and committed marks, each one vectorized
        operation; then one descriptor per frame. A batch longer than the ring overwrites
        its own first frames (the ring is lossy), so keep ``n`` below ``nslots``.
        """
        n = len(frames)
        if n == 0:
            return None
        ts = self._clock() if timestamps_ns is None else timestamps_ns
        per_frame_ts = isinstance(ts, np.ndarray)
        if n < _SMALL_BATCH:
            # a frame or two (a paced source): the per-frame path is cheaper than a dozen
            # numpy calls, and the wire is the same
            first: int | None = None
            for k in range(n):
                seq = self.offer(
                    frames[k],
                    timestamp_ns=int(ts[k]) if per_frame_ts else ts,  # type: ignore[index,arg-type]
                    meta_version=meta_version,
                )
                if seq is None:
                    return first
                if first is None:
                    first = seq
            return first
        shape = frames.shape[1:] or (1,)
        first = None
        done = 0
        while done < n:
            claim = self.claim_batch(n - done, shape, frames.dtype)
            if claim is None:
                return first
            rows = frames[done : done + claim.n]
            np.copyto(claim.array, rows.reshape(claim.array.shape))
            seq = self.commit_batch(
                claim,
                timestamps_ns=ts[done : done + claim.n] if per_frame_ts else ts,  # type: ignore[index]
                meta_version=meta_version,
            )
            if first is None:
                first = seq
            done += claim.n
        return first

    def _publish_batch(self, claim: BatchClaim, ts: np.ndarray | int, mv: int) -> None:
        n = claim.n
        rows = self._batch_desc
        if rows is None or len(rows) < n:
            rows = self._batch_desc = np.zeros(max(n, 64), _DESC_ROW)
            rows["block"] = wire.FrameDescriptorEncoder.BLOCK_LENGTH
            rows["template"] = wire.FrameDescriptorEncoder.TEMPLATE_ID
            rows["schema"] = wire.FrameDescriptorEncoder.SCHEMA_ID
            rows["version"] = wire.FrameDescriptorEncoder.SCHEMA_VERSION
            raw = memoryview(rows.view(np.uint8).reshape(-1))
            size = _DESC_ROW.itemsize
            self._batch_desc_views = [raw[k * size : (k + 1) * size] for k in range(len(rows))]
        part = rows[:n]
        part["stream_id"] = self.stream_id
        part["epoch"] = self.epoch
        part["seq"] = np.arange(claim.first_seq, claim.first_seq + n, dtype=np.uint64)
        part["index"] = np.arange(claim.header_index, claim.header_index + n, dtype=np.uint32)
        part["timestamp_ns"] = ts
        part["meta_version"] = mv
        stats = self.stats
        stats.frames += n
        stats.bytes += n * claim.layout.extent_bytes
        offer = self._offer_desc
        views = self._batch_desc_views
        sent = 0
        for k in range(n):
            if offer(views[k]):
                sent += 1
        stats.descriptors_not_sent += n - sent
        if self._fanout:  # a slot admits at most one frame: the newest of the batch
            self._fan_out(views[n - 1])
        if sent and self._wake is not None:  # once per batch, after the offers
            self._wake.post()

    def _publish(self, seq: int, index: int, ts: int, mv: int, nbytes: int) -> None:
        buf = self._desc_buf
        self._encode_desc(
            buf,
            0,
            stream_id=self.stream_id,
            epoch=self.epoch,
            seq=seq,
            header_index=index,
            timestamp_ns=ts,
            meta_version=mv,
        )
        stats = self.stats
        stats.frames += 1
        stats.bytes += nbytes
        if not self._offer_desc(buf):
            stats.descriptors_not_sent += 1
        elif self._wake is not None:  # after the offer (no lost wakeup), only if it went out
            self._wake.post()
        if self._fanout:
            self._fan_out(buf)

    def _fan_out(self, desc: bytearray | memoryview) -> None:
        """The descriptor to each consumer's own stream whose rate slot is open (§10.1.3, §11:
        the rate limiter's grid); a slot is used up only by a descriptor that went out."""
        now = self._clock()
        wake = self._wake
        for gate, pub, consumer_id in self._fanout:
            if gate.is_open(now) and pub.offer(desc):
                gate.published(now)
                self.stats.consumer_descriptors += 1
                if wake is not None:  # its semaphore only, after its own descriptor
                    wake.post_consumer(consumer_id)

    # --- metadata -----------------------------------------------------------------------------
    def set_metadata(
        self,
        attributes: Mapping[str, str | bytes | tuple[str, bytes]],
        *,
        meta_version: int | None = None,
    ) -> int:
        """Replace the stream's metadata, publish it, return its `meta_version`.

        The version is bumped by one unless given (a relay forwarding its source's metadata
        preserves the source's version). Values: str (format text/plain), bytes
        (application/octet-stream) or (format, bytes).
        """
        attrs: list[tuple[str, str, bytes]] = []
        for key, value in attributes.items():
            if isinstance(value, tuple):
                fmt, raw = value
            elif isinstance(value, str):
                fmt, raw = "text/plain", value.encode()
            else:
                fmt, raw = "application/octet-stream", bytes(value)
            attrs.append((key, fmt, raw))
        self._meta_attributes = attrs
        self.meta_version = self.meta_version + 1 if meta_version is None else meta_version
        self._send_metadata(self._clock())
        return self.meta_version

    def _send_metadata(self, now: int) -> None:
        buf = self._ctl_buf
        n = wire.DataSourceAnnounceEncoder.encode(
            buf,
            0,
            stream_id=self.stream_id,
            producer_id=self.producer_id,
            epoch=self.epoch,
            meta_version=self.meta_version,
            name=self.stream.name,
            summary=self.stream.summary,
        )
        self._pub_meta.offer(buf, 0, n)
        if not self._meta_attributes:
            return
        n = wire.DataSourceMetaEncoder.encode(
            buf,
            0,
            stream_id=self.stream_id,
            meta_version=self.meta_version,
            timestamp_ns=now,
            attributes=[{"key": k, "format": f, "value": v} for k, f, v in self._meta_attributes],
        )
        self._pub_meta.offer(buf, 0, n)

    # --- periodic duties ----------------------------------------------------------------------
    def _take_inbox(self) -> int:
        """The announces, hellos and consumers' QoS of this stream the conductor decoded for us."""
        items = self._inbox.drain()
        for dec, _ in items:
            if isinstance(dec, wire.QosConsumerDecoder):  # the consumer is alive (§10.1.3)
                now = self._clock()
                self._core.on_consumer_qos(dec.stream_id, dec.consumer_id, now)
                if self._progress is not None and dec.stream_id == self.stream_id:
                    self._progress.on_qos(dec.consumer_id, now)
            elif isinstance(dec, wire.ShmPoolAnnounceDecoder):
                now = self._clock()
                self._execute(self._core.on_driver_announce(dec.stream_id, dec.epoch, now), now)
            elif isinstance(dec, wire.ConsumerHelloDecoder):
                self._core.on_consumer_hello(
                    dec.stream_id,
                    dec.consumer_id,
                    dec.mode_raw,
                    self._clock(),
                    max_rate_hz=dec.max_rate_hz,
                    descriptor_channel=dec.descriptor_channel,
                    descriptor_stream_id=dec.descriptor_stream_id,
                )
                if self._progress is not None and dec.stream_id == self.stream_id:
                    self._progress.on_hello(
                        dec.consumer_id,
                        dec.supports_progress_raw == _TRUE,
                        dec.progress_interval_us,
                        dec.progress_bytes_delta,
                        self._clock(),
                    )
            elif isinstance(dec, wire.ConsumerConfigDecoder):
                self._core.on_consumer_config(
                    dec.stream_id,
                    dec.consumer_id,
                    dec.descriptor_channel,
                    dec.descriptor_stream_id,
                    self._clock(),
                )
        return len(items)

    def do_work(self, now_ns: int | None = None) -> int:
        """Poll the control stream, the lease, and run the core's due duties; return work done."""
        if self._closed:  # inert after close: offers and claims count `no_lease`
            return 0
        now = self._clock() if now_ns is None else now_ns
        core = self._core
        work = self._conductor.poll(now) + self._take_inbox()
        if self._wake is not None:
            self.stats.wake_sems_removed += self._wake.maybe_rescan(now)
        throttle = self._progress
        if throttle is not None:  # the latest count the interval held back (§10.2.2)
            throttle.forget_stale(now)
            filled = throttle.flush(now)
            if filled is not None:
                self._publish_cursor(throttle, filled, _PROGRESS)
                work += 1
        if self._driver is not None:
            events = self._driver.do_work(now)
            if events:
                work += self._execute(core.on_lease_events(events, now), now)
        truncated = (
            not core.driver_mode
            and core.announce_due(now)
            and any(r.truncated() for r in self._regions)
        )
        return work + self._execute(core.tick(now, regions_truncated=truncated), now)

    def _execute(self, actions: list[ProducerAction], now: int) -> int:
        """Carry out the core's actions in order (producer_core's execution contract)."""
        for action in actions:
            if isinstance(action, PublishAnnounce):
                self._announce(action.now_ns)
            elif isinstance(action, PublishMetadata):
                self._send_metadata(action.now_ns)
            elif isinstance(action, PublishQos):
                self._send_qos()
            elif isinstance(action, SendConsumerConfig):
                self._send_consumer_config(action)
            elif isinstance(action, OpenConsumerStream):
                self._open_consumer_stream(action)
            elif isinstance(action, CloseConsumerStream):
                self._close_consumer_stream(action.consumer_id)
            elif isinstance(action, OpenEpoch):
                self._execute(self._replace_epoch(action.reason, now), now)
            elif isinstance(action, RetryStreamLock):
                self._retry_stream_lock()
            elif isinstance(action, MapLease):
                self._map_lease(action.layout)
            elif isinstance(action, Unmap):
                log.warning("producer stream %d lost its lease: %s", self.stream_id, action.reason)
                self._uninstall()
            elif isinstance(action, ReportDriverSilent) and self._driver is not None:
                log.warning("producer stream %d: driver silent, reattaching", self.stream_id)
                lost = self._driver.driver_silent(now)
                self._execute(self._core.on_lease_events(lost, now), now)
            elif isinstance(action, ConfirmLease) and self._driver is not None:
                log.warning(
                    "producer stream %d: the driver announces epoch %d, ours is %d; "
                    "asking it whether our lease still holds",
                    self.stream_id,
                    action.announced_epoch,
                    self.epoch,
                )
                self._driver.confirm_lease("superseded_epoch", now)
        return len(actions)

    def _send_qos(self) -> None:
        n = wire.QosProducerEncoder.encode(
            self._ctl_buf,
            0,
            stream_id=self.stream_id,
            producer_id=self.producer_id,
            epoch=self.epoch,
            current_seq=self._seq,
        )
        self._pub_qos.offer(self._ctl_buf, 0, n)

    def _announce(self, now: int) -> None:
        """Refresh the superblocks' activity stamp, then announce the regions (§10.1)."""
        for region in self._regions:
            region.refresh_activity(now)
        n = wire.ShmPoolAnnounceEncoder.encode(
            self._ctl_buf,
            0,
            stream_id=self.stream_id,
            producer_id=self.producer_id,
            epoch=self.epoch,
            announce_timestamp_ns=now,
            announce_clock_domain=_CLOCK_MONOTONIC,
            layout_version=self.stream.layout_version,
            header_nslots=self.stream.header_nslots,
            header_slot_bytes=256,
            payload_pools=self._pool_uris,
            header_region_uri=self._header_uri,
        )
        if self._pub_control.offer(self._ctl_buf, 0, n):
            self.stats.announces += 1

    def _replace_epoch(self, reason: str, now: int) -> list[ProducerAction]:
        """#13.4: a region file shrank under us (someone truncated it); touching it would be a
        SIGBUS. Leave that epoch and start a fresh one; consumers follow the new announce.
        A new epoch that cannot be created is retried at the next announce."""
        if self._regions:
            if reason == "region_truncated":
                self.stats.drops.increment(Reason.REGION_TRUNCATED)
                log.error(
                    "producer stream %d epoch %d: a region file was truncated by someone "
                    "else; moving to a new epoch",
                    self.stream_id,
                    self.epoch,
                )
            self._uninstall()
        try:
            self._open_epoch()
        except (OSError, ShmError) as exc:
            log.error("producer stream %d: cannot create a new epoch: %s", self.stream_id, exc)
            return self._core.on_epoch_failed(now)
        return self._core.on_epoch_opened(now)

    def _send_consumer_config(self, a: SendConsumerConfig) -> None:
        """§10.1.3: the assigned descriptor stream, or a decline."""
        if a.stream_id and a.consumer_id not in self._consumer_pubs:
            a = SendConsumerConfig(a.consumer_id, a.mode)  # its publication failed: decline
        fields = consumer_config_fields(
            self.stream_id, a.consumer_id, a.mode, a.channel, a.stream_id
        )
        n = wire.ConsumerConfigEncoder.encode(self._ctl_buf, 0, **fields)
        self._pub_control.offer(self._ctl_buf, 0, n)

    def _open_consumer_stream(self, a: OpenConsumerStream) -> None:
        streams = self._core.per_consumer
        if streams is None:  # pragma: no cover - the core opens none then
            return
        self._close_consumer_stream(a.consumer_id)
        try:
            pub = self._ctx.add_publication(a.channel, a.stream_id)
        except Exception as exc:  # pyaeron.AeronError (the client does not import pyaeron)
            log.warning(
                "producer stream %d: cannot publish consumer %d's stream %s#%d: %s",
                self.stream_id,
                a.consumer_id,
                a.channel,
                a.stream_id,
                exc,
            )
            streams.on_open_failed(a.consumer_id)
            return
        self._consumer_pubs[a.consumer_id] = (
            streams.streams[a.consumer_id].gate,
            pub,
            a.consumer_id,
        )
        self._set_fanout()
        log.info(
            "producer stream %d: consumer %d gets descriptor stream %s#%d",
            self.stream_id,
            a.consumer_id,
            a.channel,
            a.stream_id,
        )

    def _close_consumer_stream(self, consumer_id: int) -> None:
        entry = self._consumer_pubs.pop(consumer_id, None)
        if entry is None:
            return
        self._set_fanout()
        self._ctx.release(entry[1])

    def _set_fanout(self) -> None:
        self._fanout = tuple(self._consumer_pubs.values())
        if self._wake is not None:  # consumers on their own stream: woken by its descriptors
            self._wake.set_own_streams(frozenset(self._consumer_pubs))

    @property
    def progress_throttle(self) -> ProgressThrottle | None:
        """The FrameProgress policy in force (None: progress off)."""
        return self._progress

    @property
    def has_consumers(self) -> bool:
        return self._pub_desc.is_connected

    @property
    def epoch_directory(self) -> str | None:
        return None if self._layout is None else self._layout.directory

    @property
    def header_region_path(self) -> str:
        return self._regions[0].path

    def payload_capacity(self) -> int:
        """Largest frame (bytes) any pool accepts."""
        return max(p.stride_bytes for p in self.stream.pools)

    def close(self, *, detach_timeout_ns: int | None = None) -> None:
        """Stop producing; with `cleanup_on_close`, remove this epoch's files (§15.21a.7).

        Driver mode waits up to ``detach_timeout_ns`` (default 1 s) for the detach response;
        0 sends the detach and returns at once (a relay that must not block, #14.3).
        """
        if self._closed:
            return
        self._closed = True
        self._core.closed()
        self._uninstall()
        if self._wake is not None:
            self._wake.close()
        if self._driver is not None:
            if detach_timeout_ns is None:
                self._driver.close()
            else:
                self._driver.close(timeout_ns=detach_timeout_ns)
        self._release_transport()
        if self._cleanup and self._layout is not None:
            shutil.rmtree(self._layout.directory, ignore_errors=True)
        if self._stream_lock is not None:  # last: the stream is free once the files are gone
            self._stream_lock.release()
            self._stream_lock = None

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "AttachError",
    "FrameClaim",
    "PoolConfig",
    "Producer",
    "ProducerStats",
    "StreamBusy",
    "StreamConfig",
    "next_epoch",
]
