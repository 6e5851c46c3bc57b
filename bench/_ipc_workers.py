"""Producer and consumer worker processes for ``bench.bench_ipc``.

Model: the orchestrator spawns two long-lived workers (one producer, one consumer) and drives
them over a ``multiprocessing`` pipe, one *scenario* at a time. A scenario is one transport
(tensorpool ``offer``, tensorpool ``claim``/``commit``, pyaeron inline payload, or
``shared_memory`` + ``multiprocessing.Queue``), one frame size, and one mode (flat-out
throughput, or paced latency). Every scenario gets a fresh Aeron client (``AeronContext``) and
fresh Aeron stream ids on the shared standalone media driver, so nothing left by a previous
scenario (a lingering image, an unpolled subscription) can back-pressure the next one.

Both workers read ``CLOCK_MONOTONIC`` (``time.monotonic_ns``), which is system-wide, so the
orchestrator hands them one absolute time window: the producer publishes from ``start_ns`` to
``end_ns``; both sides snapshot their counters when their loop first crosses ``measure_ns``
(after a warm-up) and ``end_ns``, and rates use the actual crossing times. Latency is
``consumer clock at acceptance - producer clock at publish start`` for every frame published
inside the measured window.

Per-scenario protocol (orchestrator <-> worker, tuples over the pipe)::

    -> P ("setup", scenario)        <- P ("setup_ok", info)
    -> C ("setup", scenario, info)  <- C ("ready",)          (C mapped / connected)
    -> P, C ("window", Window)      <- P ("done", ProducerResult), C ("done", ConsumerResult)

The workers keep their duty cycles running while they wait for the next message, so the
tensorpool producer answers the consumer's hello and keeps announcing.
"""

from __future__ import annotations

import contextlib
import cProfile
import mmap
import os
import queue as queue_mod
import struct
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.queues import Queue
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Final

import numpy as np

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import IPC_CONTROL, IPC_DESCRIPTORS, ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.idle import BackoffIdleStrategy, BusySpinIdleStrategy, IdleStrategy

PAGE: Final = 4096
MIB: Final = 1024 * 1024
NSLOTS: Final = 64
MPQ_DEPTH: Final = NSLOTS - 2
"""Queue bound for baseline (b): the producer can run at most this far ahead, which keeps it
(usually) off the slot the consumer is reading; nothing *guarantees* that — no seqlock."""

_mono = time.monotonic_ns
_cpu = time.process_time
_i64 = struct.Struct("<q")

# transports
TP: Final = "tp"  # tensorpool Producer.offer (copies the frame in)
TP_CLAIM: Final = "tp_claim"  # tensorpool claim/commit, stamps 8 bytes (Julia like-for-like)
INLINE: Final = "inline"  # baseline (a): payload inline over Aeron IPC
MPQ: Final = "mpq"  # baseline (b): shared_memory + multiprocessing.Queue of slot indexes
TP_BATCH: Final = "tp_batch"  # tensorpool batch path: offer_batch / poll_batch (issue 15)
IOX: Final = "iox2"  # baseline (c): iceoryx2 publish-subscribe, loaned slices
BATCH_PUBLISH: Final = 16
"""Frames per ``offer_batch`` in the batch path's throughput runs (a camera's burst); the
consumer takes up to ``BATCH_POLL`` per ``poll_batch``. Paced runs publish one frame per call."""
BATCH_POLL: Final = 64


@dataclass(frozen=True, slots=True)
class Scenario:
    key: int
    """Unique per run: picks the tensorpool stream id and the Aeron stream ids."""
    transport: str
    size: int
    mode: str
    """"tput": publish flat out; "lat": paced slowly (empty queues), latency recorded;
    "paced": paced at a high target rate, throughput and latency recorded."""
    idle: str
    """Consumer idle strategy: "spin", "backoff" or "block" (mp.Queue.get)."""
    touch: bool = True
    """Consumer sums one byte per 4 KiB page of every payload."""
    rate_hz: float = 0.0
    inline_channel: str = ""
    """Baseline (a)'s channel; empty = `inline_channel_for(size)`."""
    nslots: int = NSLOTS
    """tensorpool ring depth (the comparison uses 64; §15.6 sizing is shown separately)."""
    seq_gap: int | None = None
    """tensorpool consumer's ``max_outstanding_seq_gap`` (None: the library default)."""
    profile_path: str | None = None


@dataclass(frozen=True, slots=True)
class Window:
    start_ns: int
    measure_ns: int
    end_ns: int
    grace_ns: int = 300_000_000


@dataclass(slots=True)
class ProducerResult:
    frames: int = 0
    seconds: float = 0.0
    not_sent: int = 0
    """tensorpool: descriptors Aeron refused; inline: back-pressured offers (retried)."""
    total_frames: int = 0
    cpu_s: float = 0.0
    """CPU time of the whole process (all threads) during the measured window."""
    error: str | None = None


@dataclass(slots=True)
class ConsumerResult:
    frames: int = 0
    seconds: float = 0.0
    drops: dict[str, int] = field(default_factory=dict)
    latencies_ns: list[int] = field(default_factory=list)
    total_frames: int = 0
    cpu_s: float = 0.0
    """CPU time of the whole process (all threads) during the measured window."""
    error: str | None = None


def settings_for(sc: Scenario, shm_base_dir: str, aeron_dir: str) -> ClientSettings:
    base = 20_000 + 10 * sc.key
    channels = Endpoints(
        control_channel=IPC_CONTROL,
        control_stream_id=base,
        descriptor_channel=IPC_DESCRIPTORS,
        descriptor_stream_id=base + 1,
        qos_channel=IPC_CONTROL,
        qos_stream_id=base + 2,
        metadata_channel=IPC_CONTROL,
        metadata_stream_id=base + 3,
    )
    return ClientSettings(
        transport=TransportConfig(aeron_dir=aeron_dir),
        channels=channels,
        shm_base_dir=shm_base_dir,
    )


def inline_channel_for(size: int) -> str:
    """Baseline (a) gets a fair configuration: a term that holds >= 8 messages (Aeron's
    maximum message is term/8), the largest IPC MTU so a frame is few fragments, and
    pre-touched log buffers (like the tensorpool producer's prefaulted pools)."""
    term = 16 * MIB
    while term // 8 < size:
        term *= 2
    return f"aeron:ipc?term-length={term}|mtu=65504"


def tp_stream_id(sc: Scenario) -> int:
    return 100 + sc.key


def inline_stream_id(sc: Scenario) -> int:
    return 30_000 + sc.key


def make_touch(size: int) -> Callable[[np.ndarray], int]:
    """Sum one byte per 4 KiB page (the same function for every transport).

    For a few pages a Python ``sum`` over ``tolist()`` is cheaper than numpy's reduction
    (~0.4 vs ~1.9 us here); both read exactly one byte per page.
    """
    if size <= 16 * PAGE:
        return lambda u8: sum(u8[::PAGE].tolist())
    return lambda u8: int(u8[::PAGE].sum())


IOX_PREFIX: Final = "tpbench_"
"""iceoryx2 file-name prefix of the bench's shared memory (with the orchestrator's pid), so
``bench_ipc`` removes exactly its own segments afterwards; its node and service files go to a
private root directory under the bench's temp dir."""


def iox_prefix(owner_pid: int) -> str:
    return f"{IOX_PREFIX}{owner_pid}_"


class IoxEndpoint:
    """Baseline (c): one iceoryx2 node and publish-subscribe service (``Slice[c_uint8]``) per
    scenario, like tensorpool's ring: a subscriber buffer of ``nslots`` samples and safe
    overflow (lossy: the oldest unread sample is replaced, the publisher never blocks)."""

    def __init__(self, sc: Scenario) -> None:
        import ctypes

        import iceoryx2 as iox2

        iox2.set_log_level_from_env_or(iox2.LogLevel.Warn)
        cfg = iox2.config.default()
        g = cfg.global_cfg
        g.prefix = iox2.FileName.new(iox_prefix(os.getppid()))
        g.root_path = iox2.Path.new(os.environ["TP_BENCH_IOX_ROOT"])
        self.node = iox2.NodeBuilder.new().config(cfg).create(iox2.ServiceType.Ipc)
        self.service = (
            self.node.service_builder(iox2.ServiceName.new(f"tpbench/{sc.key}"))
            .publish_subscribe(iox2.Slice[ctypes.c_uint8])
            .enable_safe_overflow(True)
            .subscriber_max_buffer_size(sc.nslots)
            .history_size(0)
            .max_publishers(1)
            .max_subscribers(1)
            .open_or_create()
        )
        self.ports: list[Any] = []

    def close(self) -> None:
        for port in self.ports:
            port.delete()
        self.ports.clear()
        self.service = None  # service and node are released with their last reference
        self.node = None


def make_idle(name: str) -> IdleStrategy:
    return BackoffIdleStrategy() if name == "backoff" else BusySpinIdleStrategy()


def mpq_name(owner_pid: int, key: int) -> str:
    return f"tpbench-ipc-{owner_pid}-{key}"


# ------------------------------------------------------------------------------------------------
# producer side
# ------------------------------------------------------------------------------------------------


class _ProducerRun:
    """Publishes with one transport; `publish()` sends one frame, `idle_work()` runs duties."""

    publish: Callable[[], None]
    not_sent: Callable[[], int]

    def __init__(self, sc: Scenario, shm_base_dir: str, aeron_dir: str, mpq: Queue) -> None:
        self.sc = sc
        self.ctx: AeronContext | None = None
        self.producer: Producer | None = None
        self.shm: SharedMemory | None = None
        self.mpq = mpq
        self.info: dict[str, Any] = {}
        self.src = np.full(sc.size, 7, np.uint8)
        self.idle_work: Callable[[], object] = _nothing
        self.ran = False
        self.per_publish = 1
        self.iox: Any = None
        try:
            if sc.transport in (TP, TP_CLAIM, TP_BATCH):
                self._setup_tp(shm_base_dir, aeron_dir)
            elif sc.transport == IOX:
                self._setup_iox()
            elif sc.transport == INLINE:
                self._setup_inline(aeron_dir)
            elif sc.transport == MPQ:
                self._setup_mpq()
            else:
                raise ValueError(f"unknown transport {sc.transport!r}")
        except BaseException:
            self.close()
            raise

    def _setup_tp(self, shm_base_dir: str, aeron_dir: str) -> None:
        sc = self.sc
        settings = settings_for(sc, shm_base_dir, aeron_dir)
        self.ctx = AeronContext(settings.transport).start()
        stream = StreamConfig.for_frame_bytes(tp_stream_id(sc), sc.size, header_nslots=sc.nslots)
        p = Producer(self.ctx, stream, settings, prefault=True)
        self.producer = p
        self.idle_work = p.do_work
        self.not_sent = lambda: p.stats.descriptors_not_sent
        if sc.transport == TP:
            offer = p.offer
            src = self.src

            def publish() -> None:
                offer(src)

        elif sc.transport == TP_BATCH:
            # a quarter of the ring at most: a batch as deep as the ring laps its own reader
            per = min(BATCH_PUBLISH, max(1, sc.nslots // 4)) if sc.mode == "tput" else 1
            self.per_publish = per
            offer_batch = p.offer_batch
            frames = np.full((per, sc.size), 7, np.uint8)

            def publish() -> None:
                offer_batch(frames)

        else:
            claim = p.claim
            commit = p.commit
            shape = (sc.size,)
            u8 = np.uint8
            stamp = np.arange(8, dtype=np.uint8)

            def publish() -> None:
                c = claim(shape, u8)
                c.array[:8] = stamp  # a few bytes, as a camera would stamp a frame counter
                commit(c)

        self.publish = publish

    def _setup_iox(self) -> None:
        sc = self.sc
        self.iox = IoxEndpoint(sc)
        pub = self.iox.service.publisher_builder().initial_max_slice_len(sc.size).create()
        self.iox.ports.append(pub)
        loan = pub.loan_slice_uninit
        size = sc.size
        src = self.src
        frombuffer = np.frombuffer
        copyto = np.copyto
        u8 = np.uint8
        i64 = np.int64
        self.not_sent = lambda: 0
        self.idle_work = pub.update_connections

        def publish() -> None:
            sample = loan(size)  # a slice of iceoryx2's shared memory, written with numpy
            dst = frombuffer(sample.payload().as_memory_view(), u8)
            copyto(dst, src)
            dst[:8].view(i64)[0] = _mono()  # publish time, as tensorpool's descriptor carries
            sample.assume_init().send()

        self.publish = publish

    def _setup_inline(self, aeron_dir: str) -> None:
        sc = self.sc
        self.ctx = AeronContext(
            TransportConfig(aeron_dir=aeron_dir, pre_touch_mapped_memory=True)
        ).start()
        channel = sc.inline_channel or inline_channel_for(sc.size)
        pub = self.ctx.aeron.add_exclusive_publication(channel, inline_stream_id(sc))
        self._pub = pub
        offer = pub.offer
        src = self.src
        ts_view = src[:8].view(np.int64)
        data = memoryview(src)
        bp = [0]
        self.not_sent = lambda: bp[0]

        def publish() -> None:
            ts_view[0] = _mono()  # publish start, as tensorpool stamps before its copy
            while offer(data) is not True:  # reliable transport: a refused frame is retried
                bp[0] += 1

        self.publish = publish

    def _setup_mpq(self) -> None:
        sc = self.sc
        name = mpq_name(os.getppid(), sc.key)
        self.shm = SharedMemory(name=name, create=True, size=NSLOTS * sc.size)
        slots = np.ndarray((NSLOTS, sc.size), np.uint8, buffer=self.shm.buf)
        slots.fill(0)  # fault the pages in, as the tensorpool producer's prefault does
        views = list(slots)
        src = self.src
        put = self.mpq.put
        copyto = np.copyto
        state = [0]
        mask = NSLOTS - 1
        self.not_sent = lambda: 0
        self.info["shm_name"] = name

        def publish() -> None:
            i = state[0]
            ts = _mono()
            copyto(views[i], src)
            put((i, ts))
            state[0] = (i + 1) & mask

        self.publish = publish

    def wait_for_consumer(self) -> None:
        if self.sc.transport == INLINE:
            self._pub.await_connected(timeout=10.0)

    def close(self) -> None:
        if self.sc.transport == MPQ and self.ran:
            self.mpq.put(None)  # end-of-run sentinel: the consumer drains up to it
        if self.iox is not None:
            self.iox.close()
        if self.producer is not None:
            self.producer.close()
        if self.ctx is not None:
            self.ctx.close()
        if self.shm is not None:
            self.shm.close()
            self.shm.unlink()


def _nothing() -> None:
    return None


def _run_producer(run: _ProducerRun, win: Window) -> ProducerResult:
    sc = run.sc
    publish = run.publish
    idle_work = run.idle_work
    res = ProducerResult()
    run.ran = True
    while _mono() < win.start_ns:
        idle_work()
    if sc.mode == "tput":
        n, t0, n0, ns0, t1, n1, ns1, cpu = _producer_flat_out(publish, idle_work, win, run)
    else:
        n, t0, n0, ns0, t1, n1, ns1, cpu = _producer_paced(publish, idle_work, win, run, sc.rate_hz)
    res.cpu_s = cpu
    res.frames = n1 - n0
    res.seconds = (t1 - t0) / 1e9
    res.not_sent = ns1 - ns0
    res.total_frames = n
    return res


def _producer_flat_out(
    publish: Callable[[], None], idle_work: Callable[[], object], win: Window, run: _ProducerRun
) -> tuple[int, int, int, int, int, int, int, float]:
    mono = _mono
    n = 0
    measure_ns, end_ns = win.measure_ns, win.end_ns
    t0 = n0 = ns0 = 0
    per = run.per_publish
    now = mono()
    k = 0
    while now < measure_ns:
        publish()
        n += per
        k += 1
        if not k & 63:
            idle_work()
        now = mono()
    t0, n0, ns0, cpu0 = now, n, run.not_sent(), _cpu()
    while now < end_ns:
        publish()
        n += per
        k += 1
        if not k & 63:
            idle_work()
        now = mono()
    return n, t0, n0, ns0, now, n, run.not_sent(), _cpu() - cpu0


def _producer_paced(
    publish: Callable[[], None],
    idle_work: Callable[[], object],
    win: Window,
    run: _ProducerRun,
    rate_hz: float,
) -> tuple[int, int, int, int, int, int, int, float]:
    """One frame per period on an absolute schedule.

    Long waits sleep (leaving the CPU to the consumer), the last ~150 us spin so high rates
    stay accurate; the timestamp is taken at publish, so pacing jitter never enters the
    latency. After a preemption the producer catches up by at most 16 frames (a camera's
    small buffer), never by a burst that would lap the ring by itself.
    """
    mono = _mono
    sleep = time.sleep
    period = round(1e9 / rate_hz)
    max_lag = 16 * period
    duties_each_frame = period >= 100_000
    n = 0
    t0 = n0 = ns0 = -1
    cpu0 = 0.0
    next_ns = win.start_ns
    now = mono()
    while now < win.end_ns:
        if t0 < 0 and now >= win.measure_ns:
            t0, n0, ns0, cpu0 = now, n, run.not_sent(), _cpu()
        if now >= next_ns:
            publish()
            n += 1
            next_ns += period
            if now - next_ns > max_lag:
                next_ns = now
            if duties_each_frame or not n & 63:
                idle_work()
        elif next_ns - now > 300_000:
            sleep((next_ns - now - 150_000) / 1e9)
        now = mono()
    if t0 < 0:
        t0, n0, ns0, cpu0 = now, n, run.not_sent(), _cpu()
    return n, t0, n0, ns0, now, n, run.not_sent(), _cpu() - cpu0


def _ring_4k_pages(size: int) -> tuple[mmap.mmap, np.ndarray]:
    """64 destinations in anonymous memory refused huge pages (``MADV_NOHUGEPAGE``): numpy's
    own arrays get transparent huge pages here (numpy advises them), tmpfs files do not."""
    mm = mmap.mmap(-1, NSLOTS * size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):
            mm.madvise(advice)
    return mm, np.frombuffer(mm, np.uint8).reshape(NSLOTS, size)


def _ring_in_dir(size: int, directory: str) -> tuple[mmap.mmap, np.ndarray]:
    """64 destinations in a shared file mapping under ``directory``, reserved with
    ``posix_fallocate`` like a tensorpool pool: the ring's own kind of memory."""
    fd, path = tempfile.mkstemp(prefix="tpbench-copyto-", dir=directory)
    try:
        os.posix_fallocate(fd, 0, NSLOTS * size)
        mm = mmap.mmap(fd, NSLOTS * size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
        os.unlink(path)
    return mm, np.frombuffer(mm, np.uint8).reshape(NSLOTS, size)


def copyto_rate(size: int, seconds: float, shm_dir: str | None = None) -> dict[str, float]:
    """numpy.copyto of `size` bytes, copies per second (best of three sub-runs): into 64
    rotating destinations (the ring's memory footprint) and into one destination; with
    ``shm_dir``, also into 64 destinations of 4 KiB pages and into a shared file mapping in
    ``shm_dir`` (tensorpool's pools: a tmpfs without ``huge=`` has 4 KiB pages only), which
    separates the page size's share of the producer's gap to numpy's own memory."""
    src = np.full(size, 7, np.uint8)
    ring = np.zeros((NSLOTS, size), np.uint8)  # zeros() + fill: pages faulted in beforehand
    ring.fill(1)
    copyto = np.copyto
    out: dict[str, float] = {}
    variants: list[tuple[str, list[np.ndarray]]] = [
        ("rotating", list(ring)),
        ("single", [ring[0]] * 16),
    ]
    if shm_dir is not None:
        for name, make in (
            ("rotating_4k", lambda: _ring_4k_pages(size)),
            ("rotating_shm", lambda: _ring_in_dir(size, shm_dir)),
        ):
            _mm, rows = make()  # unmapped when the last row view goes, at return
            rows.fill(1)
            variants.append((name, list(rows)))
    for name, dsts in variants:
        best = 0.0
        for _ in range(3):
            n = 0
            t0 = _mono()
            end = t0 + int(seconds / 3 * 1e9)
            while True:
                for d in dsts:
                    copyto(d, src)
                n += len(dsts)
                now = _mono()
                if now >= end:
                    break
            best = max(best, n / ((now - t0) / 1e9))
        out[name] = best
        # the same loop timed in CPU seconds (robust to other load on a shared host)
        c0 = _cpu()
        n = 0
        end = _mono() + int(seconds / 3 * 1e9)
        while _mono() < end:
            for d in dsts:
                copyto(d, src)
            n += len(dsts)
        out[name + "_per_cpu_s"] = n / max(_cpu() - c0, 1e-9)
    return out


def producer_main(
    conn: Connection, mpq: Queue, shm_base_dir: str, aeron_dir: str
) -> None:  # pragma: no cover - runs in a child process
    """Serve producer scenarios until told to exit."""
    while True:
        msg = conn.recv()
        kind = msg[0]
        if kind == "exit":
            return
        if kind == "copyto":
            conn.send(("copyto", copyto_rate(msg[1], msg[2], shm_base_dir)))
            continue
        sc: Scenario = msg[1]
        try:
            run = _ProducerRun(sc, shm_base_dir, aeron_dir, mpq)
        except Exception:
            conn.send(("setup_failed", traceback.format_exc()))
            continue
        result = ProducerResult()
        try:
            conn.send(("setup_ok", run.info))
            # keep duties running (hello -> announce) until the window (or an abort) arrives
            while not conn.poll(0.0005):
                run.idle_work()
            msg = conn.recv()
            if msg[0] == "window":
                win = msg[1]
                run.wait_for_consumer()
                result = _profiled(sc, "producer", _run_producer, run, win)
            else:
                result.error = "aborted"
        except Exception:
            result.error = traceback.format_exc()
        finally:
            try:
                run.close()
            except Exception:
                result.error = traceback.format_exc()
        conn.send(("done", result))


def _profiled(sc: Scenario, role: str, fn: Callable[..., Any], *args: Any) -> Any:
    if not sc.profile_path:
        return fn(*args)
    prof = cProfile.Profile()
    prof.enable()
    try:
        return fn(*args)
    finally:
        prof.disable()
        prof.dump_stats(f"{sc.profile_path}.{role}.prof")


# ------------------------------------------------------------------------------------------------
# consumer side
# ------------------------------------------------------------------------------------------------


class _Recorder:
    """Per-frame bookkeeping shared by all consumer transports (kept tiny: it is per frame)."""

    __slots__ = ("frames", "lat", "lat_from", "lat_to")

    def __init__(self) -> None:
        self.frames = 0
        self.lat: list[int] = []
        self.lat_from = 1 << 62
        self.lat_to = 0


class _ConsumerRun:
    """One transport's receiving side; `step()` does one poll and returns work done."""

    step: Callable[[], int]
    drops: Callable[[], dict[str, int]]

    def __init__(
        self, sc: Scenario, info: dict[str, Any], shm_base_dir: str, aeron_dir: str, mpq: Queue
    ) -> None:
        self.sc = sc
        self.ctx: AeronContext | None = None
        self.consumer: Consumer | None = None
        self.shm: SharedMemory | None = None
        self.mpq = mpq
        self.rec = _Recorder()
        self.latency = sc.mode != "tput"
        self.sentinel_seen = False
        self.ran = False
        self.iox: Any = None
        try:
            if sc.transport in (TP, TP_CLAIM):
                self._setup_tp(shm_base_dir, aeron_dir)
            elif sc.transport == TP_BATCH:
                self._setup_tp_batch(shm_base_dir, aeron_dir)
            elif sc.transport == IOX:
                self._setup_iox()
            elif sc.transport == INLINE:
                self._setup_inline(aeron_dir)
            else:
                self._setup_mpq(info)
        except BaseException:
            self.close()
            raise

    def _setup_tp(self, shm_base_dir: str, aeron_dir: str) -> None:
        sc = self.sc
        settings = settings_for(sc, shm_base_dir, aeron_dir)
        self.ctx = AeronContext(settings.transport).start()
        kw = {} if sc.seq_gap is None else {"max_outstanding_seq_gap": sc.seq_gap}
        c = Consumer(self.ctx, tp_stream_id(sc), settings, **kw)
        self.consumer = c
        rec = self.rec
        latency = self.latency
        mono = _mono
        touch = make_touch(sc.size)

        if sc.touch:

            def handler(frame: Frame) -> None:
                touch(frame.array)
                if frame.is_current() and latency:
                    ts = frame.timestamp_ns
                    if rec.lat_from <= ts < rec.lat_to:
                        rec.lat.append(mono() - ts)

        else:

            def handler(frame: Frame) -> None:
                if latency and frame.is_current():
                    ts = frame.timestamp_ns
                    if rec.lat_from <= ts < rec.lat_to:
                        rec.lat.append(mono() - ts)

        poll = c.poll
        stats = c.stats

        def step() -> int:
            return poll(handler, 64)

        def drops() -> dict[str, int]:
            d = stats.drops.snapshot()
            d["gap"] = c.drops_gap
            d["frames"] = stats.frames
            return d

        self.step = step
        self.drops = drops

    def _setup_tp_batch(self, shm_base_dir: str, aeron_dir: str) -> None:
        sc = self.sc
        settings = settings_for(sc, shm_base_dir, aeron_dir)
        self.ctx = AeronContext(settings.transport).start()
        kw = {} if sc.seq_gap is None else {"max_outstanding_seq_gap": sc.seq_gap}
        c = Consumer(self.ctx, tp_stream_id(sc), settings, **kw)
        self.consumer = c
        rec = self.rec
        latency = self.latency
        mono = _mono
        touch = sc.touch
        touch_row = make_touch(sc.size)
        poll_batch = c.poll_batch
        stats = c.stats
        page = PAGE

        def step() -> int:
            batch = poll_batch(BATCH_POLL)
            if not len(batch):
                return 0
            arr = batch.array
            if touch:  # one byte per 4 KiB page of every frame: one reduction per batch
                if arr is not None and len(arr) == 1:  # a paced frame: the per-frame touch
                    touch_row(arr[0])
                elif arr is not None:
                    int(arr.reshape(len(arr), -1).view(np.uint8)[:, ::page].sum())
                else:
                    for a in batch.arrays:
                        if a is not None:
                            int(a.reshape(-1).view(np.uint8)[::page].sum())
            got = batch.confirm()
            if latency and got:
                now = mono()
                for ts in batch.timestamps_ns[batch.valid].tolist():
                    if rec.lat_from <= ts < rec.lat_to:
                        rec.lat.append(now - ts)
            return got

        def drops() -> dict[str, int]:
            d = stats.drops.snapshot()
            d["gap"] = c.drops_gap
            d["frames"] = stats.frames
            return d

        self.step = step
        self.drops = drops

    def _setup_iox(self) -> None:
        sc = self.sc
        self.iox = IoxEndpoint(sc)
        sub = self.iox.service.subscriber_builder().buffer_size(sc.nslots).create()
        self.iox.ports.append(sub)
        receive = sub.receive
        rec = self.rec
        latency = self.latency
        touch = make_touch(sc.size) if sc.touch else None
        mono = _mono
        frombuffer = np.frombuffer
        u8 = np.uint8
        unpack_ts = _i64.unpack_from

        def step() -> int:
            n = 0
            while n < 64:
                sample = receive()
                if sample is None:
                    break
                view = sample.payload().as_memory_view()
                if touch is not None:
                    touch(frombuffer(view, u8))
                if latency:
                    ts = unpack_ts(view, 0)[0]
                    if rec.lat_from <= ts < rec.lat_to:
                        rec.lat.append(mono() - ts)
                sample.delete()  # back to the publisher's pool
                n += 1
            rec.frames += n
            return n

        self.step = step
        self.drops = lambda: {"frames": rec.frames}

    def _setup_inline(self, aeron_dir: str) -> None:
        sc = self.sc
        self.ctx = AeronContext(
            TransportConfig(aeron_dir=aeron_dir, pre_touch_mapped_memory=True)
        ).start()
        channel = sc.inline_channel or inline_channel_for(sc.size)
        sub = self.ctx.aeron.add_subscription(channel, inline_stream_id(sc))
        self._sub = sub
        rec = self.rec
        latency = self.latency
        touch = make_touch(sc.size) if sc.touch else None
        mono = _mono
        frombuffer = np.frombuffer
        u8 = np.uint8
        unpack_ts = _i64.unpack_from

        def handler(buffer: object, header: object) -> None:
            if touch is not None:
                touch(frombuffer(buffer, u8))  # type: ignore[call-overload]
            rec.frames += 1
            if latency:
                ts = unpack_ts(buffer, 0)[0]  # type: ignore[arg-type]
                if rec.lat_from <= ts < rec.lat_to:
                    rec.lat.append(mono() - ts)

        poll = sub.poll
        # fragments per poll: enough for 64 whole messages at this size
        limit = 64 * max(1, -(-sc.size // 65472))

        def step() -> int:
            return poll(handler, limit)

        self.step = step
        self.drops = lambda: {"frames": rec.frames}

    def _setup_mpq(self, info: dict[str, Any]) -> None:
        sc = self.sc
        # Attaching registers the name with the (shared) resource tracker again; that is
        # harmless: the producer's unlink unregisters it once for both.
        self.shm = SharedMemory(name=info["shm_name"])
        slots = np.ndarray((NSLOTS, sc.size), np.uint8, buffer=self.shm.buf)
        views = list(slots)
        rec = self.rec
        latency = self.latency
        touch = make_touch(sc.size) if sc.touch else None
        mono = _mono
        get = self.mpq.get
        empty = queue_mod.Empty

        def step() -> int:
            try:
                item = get(True, 0.05)  # the natural idle for a Queue: block in the kernel
            except empty:
                return 0
            if item is None:
                self.sentinel_seen = True
                return 0
            i, ts = item
            if touch is not None:
                touch(views[i])
            rec.frames += 1
            if latency and rec.lat_from <= ts < rec.lat_to:
                rec.lat.append(mono() - ts)
            return 1

        self.step = step
        self.drops = lambda: {"frames": rec.frames}

    def is_ready(self) -> bool:
        if self.consumer is not None:
            return self.consumer.is_mapped
        if self.sc.transport == INLINE:
            return bool(self._sub.is_connected)
        return True

    def close(self) -> None:
        if self.sc.transport == MPQ and self.ran and not self.sentinel_seen:
            # drain to the sentinel so the next scenario starts with an empty queue
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                try:
                    if self.mpq.get(True, 0.1) is None:
                        break
                except queue_mod.Empty:
                    continue
        if self.iox is not None:
            self.iox.close()
        if self.consumer is not None:
            self.consumer.close()
        if self.ctx is not None:
            self.ctx.close()
        if self.shm is not None:
            self.shm.close()


def _diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = {}
    for k in set(a) | set(b):
        d = b.get(k, 0) - a.get(k, 0)
        if d:
            out[k] = d
    return out


def _run_consumer(run: _ConsumerRun, win: Window) -> ConsumerResult:
    step = run.step
    idle = make_idle(run.sc.idle).idle
    mono = _mono
    rec = run.rec
    run.ran = True
    rec.lat_from = win.measure_ns
    rec.lat_to = win.end_ns
    mpq = run.sc.transport == MPQ
    quit_ns = win.end_ns + win.grace_ns
    now = mono()
    while now < win.measure_ns:
        idle(step())
        now = mono()
    t0, d0, cpu0 = now, run.drops(), _cpu()
    while now < win.end_ns:
        idle(step())
        now = mono()
    t1, d1, cpu1 = now, run.drops(), _cpu()
    # drain what was published inside the window (latency samples), then stop; mp.Queue runs
    # until the producer's sentinel so the next scenario starts with an empty queue
    give_up = quit_ns + 5_000_000_000
    while not (mpq and run.sentinel_seen) and (now < quit_ns or (mpq and now < give_up)):
        idle(step())
        now = mono()
    delta = _diff(d0, d1)
    res = ConsumerResult()
    res.frames = delta.pop("frames", 0)
    res.seconds = (t1 - t0) / 1e9
    res.drops = delta
    res.latencies_ns = rec.lat
    res.total_frames = run.drops().get("frames", 0)
    res.cpu_s = cpu1 - cpu0
    return res


def consumer_main(
    conn: Connection, mpq: Queue, shm_base_dir: str, aeron_dir: str
) -> None:  # pragma: no cover - runs in a child process
    """Serve consumer scenarios until told to exit."""
    while True:
        msg = conn.recv()
        if msg[0] == "exit":
            return
        sc: Scenario = msg[1]
        info: dict[str, Any] = msg[2]
        run: _ConsumerRun | None = None
        try:
            run = _ConsumerRun(sc, info, shm_base_dir, aeron_dir, mpq)
            deadline = time.monotonic() + 15.0
            while not run.is_ready():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"consumer not ready after 15 s ({sc.transport})")
                run.step()
                time.sleep(0.0005)
        except Exception:
            conn.send(("setup_failed", traceback.format_exc()))
            if run is not None:
                run.close()
            continue
        conn.send(("ready",))
        result = ConsumerResult()
        try:
            while not conn.poll(0):
                if sc.transport != MPQ:  # a Queue read here would eat the producer's frames
                    run.step()
                time.sleep(0.0002)
            msg = conn.recv()
            if msg[0] == "window":
                win = msg[1]
                result = _profiled(sc, "consumer", _run_consumer, run, win)
            else:
                result.error = "aborted"
        except Exception:
            result.error = traceback.format_exc()
        finally:
            try:
                run.close()
            except Exception:
                result.error = traceback.format_exc()
        conn.send(("done", result))
