"""The seam between the Spark source and the tensorpool control plane: layouts and leases.

Everything in :mod:`tensorpool.spark_source` that talks Aeron lives here. The rest of the
package only needs, per stream, the *current layout* (epoch, region URIs, ring size) and a
place to drain descriptor hints from; how they are obtained is pluggable:

* **standalone** (``driver=false``, default): a :class:`~tensorpool.client.consumer.Consumer`
  per stream listens for ``ShmPoolAnnounce`` (and says ``ConsumerHello`` so a standalone
  producer announces at once);
* **driver** (``driver=true``): the same Consumer in driver mode attaches through the SHM driver
  daemon (``ShmAttachRequest`` as CONSUMER -> layout + lease, keepalives, detach on close,
  lease expiry if this process dies). The lease is the licence to map (Driver Model §2.3).

Either way a background thread keeps polling: Aeron IPC subscriptions are flow control for
their publishers, so a Spark driver that only polled when Spark calls ``latestOffset`` would
back-pressure the producer's descriptor stream for every other consumer. Descriptors are not
the offset authority (the header ring is: it survives restarts and covers frames committed
before this process joined); they are the record of *which seqs were published*, which the
planner needs to count loss on sparse (relay) streams. They go into one bounded
:class:`~tensorpool.ingest.IngressBuffer` per stream (``queue`` mode, overflow drops the oldest;
each drop's seq is remembered so the planner knows where its record has a hole). The planner
takes from a stream's queue once per trigger, only as far as the planned range reaches
(:meth:`Attachment.take`, the budgeted drain); later descriptors stay queued.

Process hygiene: attachments register themselves and ``atexit`` closes them (detaching driver
leases) when the process exits normally. Spark ends its Python workers with SIGTERM and does not
always call ``stop()``; no SIGTERM handler is installed, so SIGTERM terminates at once (a Python
handler only runs when the main thread returns to Python: one that waited on a lock kept source
runners alive for hours after their JVM was gone, issue #13.6). The driver expires the lease of
a process that died that way (loss spools are abstract sockets: nothing to remove). In
a Spark worker process (started by the JVM), the first attachment also starts a daemon thread
that exits the process when its parent JVM goes away (:func:`watch_parent`). The batch readers'
shared announce probes (:func:`shared_probe`, #15) follow the same rules: closed by ``atexit``,
when unused for :data:`PROBE_IDLE_S` or their media driver is gone, and they start the parent
watch in a Spark worker.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Final

from tensorpool.client.announce import (
    CLOCK_REALTIME_SYNCED,
    AnnounceTracker,
    StreamLayout,
    Verdict,
)
from tensorpool.client.conductor import ClientConductor
from tensorpool.client.consumer import Consumer
from tensorpool.client.settings import ClientSettings
from tensorpool.ingest import DropInfo, IngressBuffer
from tensorpool.spark_source.rings.stream_meta import MetaTracker
from tensorpool.specs import CodecError
from tensorpool.specs.generated import wire
from tensorpool.transport.agent import AgentRunner, AgentTermination
from tensorpool.transport.context import AeronContext, release_shared_context, shared_context
from tensorpool.transport.idle import SleepingIdleStrategy
from tensorpool.transport.process import watch_parent as watch_parent_process

log = logging.getLogger(__name__)

DEFAULT_INTAKE_CAPACITY: Final = 65536
#: stream ids an announce probe remembers for discovery before it forgets the silent ones
MAX_HEARD_STREAMS: Final = 65536
_decode_desc = wire.FrameDescriptorDecoder.decode_tuple


class StreamsNotAttached(RuntimeError):
    """The streams could not be attached (no announce / lease within the timeout).

    Not :class:`tensorpool.client.producer.AttachError` (a producer's refused attach): #14.1,
    one name per meaning."""


class _DropLog:
    """Seq intervals of descriptors one stream's queue dropped, per epoch (overflow holes).

    ``drop_oldest`` drops a queue's oldest entries, so the drops between two takes are a
    contiguous stretch of the stream's publication order: ``[lo, hi]`` per epoch says it all.
    """

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: dict[int, list[int]] = {}

    def __call__(self, info: DropInfo) -> None:
        _sid, epoch, seq, _ts = info.item
        span = self.spans.get(epoch)
        if span is None:
            self.spans[epoch] = [seq, seq, 1]
        else:
            span[0] = min(span[0], seq)
            span[1] = max(span[1], seq)
            span[2] += 1

    def pop(self) -> list[tuple[int, int, int, int]]:
        out = [(e, lo, hi, n) for e, (lo, hi, n) in sorted(self.spans.items())]
        self.spans = {}
        return out


class _IntakeConsumer(Consumer):
    """A Consumer whose descriptors feed an intake instead of reading slots.

    The Spark driver never reads payloads: executors do. Skipping the per-descriptor slot
    read keeps the control-plane thread at ~1 µs per descriptor.
    """

    def __init__(
        self, *args: Any, sink: Callable[[tuple[int, int, int, int]], object] | None, **kw: Any
    ) -> None:
        self._sink = sink
        self.intake_count = 0
        super().__init__(*args, **kw)

    def _on_descriptor(self, buffer: object, header: object) -> None:
        try:
            stream_id, epoch, seq, _index, ts, _mv = _decode_desc(buffer)
        except CodecError as exc:
            self.stats.control.increment("descriptor_" + exc.reason)
            return
        if stream_id != self.stream_id:
            return
        self.intake_count += 1
        sink = self._sink
        if sink is not None:
            sink((stream_id, epoch, seq, ts))


def _same_regions(a: StreamLayout, b: StreamLayout) -> bool:
    """The same layout apart from the announce's timestamp."""
    return a == replace(b, announce_timestamp_ns=a.announce_timestamp_ns)


def _noop(_frame: object) -> None:  # pragma: no cover - never called by _IntakeConsumer
    return None


class Attachment:
    """Control-plane attachment to a set of streams (one per Spark reader process)."""

    def __init__(
        self,
        streams: tuple[int, ...],
        settings: ClientSettings,
        *,
        driver: bool = False,
        background: bool = True,
        intake_capacity: int | None = DEFAULT_INTAKE_CAPACITY,
        idle_sleep_s: float = 0.001,
    ) -> None:
        self.streams = streams
        self.settings = settings
        self.driver = driver
        self._lock = threading.RLock()
        self._runner: AgentRunner | None = None
        self._closed = False
        self._intake_capacity = intake_capacity
        #: extra pollers on this client (stream discovery), run by :meth:`poll_once`
        self._pollers: list[Callable[[], int]] = []
        #: one descriptor queue per stream (lanes that can be drained with their own budget)
        self.intakes: dict[int, IngressBuffer] = {}
        self._drops: dict[int, _DropLog] = {}
        self._ctx = shared_context(settings.transport)  # the process's one client (#28.1)
        self._consumers: dict[int, _IntakeConsumer] = {}
        try:
            for sid in streams:
                self._add_consumer(sid)
        except BaseException:
            for c in self._consumers.values():
                c.close()
            release_shared_context(self._ctx)
            raise
        _register(self)
        if background:  # #26.1: the runner keeps the media driver, idles, counts errors
            self._runner = AgentRunner(
                self,
                SleepingIdleStrategy(max(int(idle_sleep_s * 1e9), 1)),
                context=self._ctx,
                context_lock=self._lock,
            ).start(name="tensorpool-spark-attach")

    def _add_consumer(self, sid: int) -> None:
        if self._intake_capacity:
            self._drops[sid] = log_ = _DropLog()
            self.intakes[sid] = IngressBuffer(
                f"spark.intake.{sid}",
                mode="queue",
                capacity=self._intake_capacity,
                overflow="drop_oldest",
                on_drop=log_,
            )
        self._consumers[sid] = _IntakeConsumer(
            self._ctx,
            sid,
            self.settings,
            driver=self.driver,
            sink=self.intakes[sid].ingest if sid in self.intakes else None,
        )

    def add_streams(self, streams: tuple[int, ...]) -> None:
        """Attach more streams (discovered ones, #16.4); their layouts arrive like the others'."""
        with self._lock:
            if self._closed:
                return
            for sid in streams:
                if sid not in self._consumers:
                    self._add_consumer(sid)
            self.streams = tuple(sorted({*self.streams, *streams}))

    def add_poller(self, poller: Callable[[], int]) -> None:
        """Run ``poller`` in every duty cycle (on this client's polling thread)."""
        with self._lock:
            self._pollers.append(poller)

    @property
    def context(self) -> AeronContext:
        return self._ctx

    # --- polling -------------------------------------------------------------------------------
    def poll_once(self) -> int:
        """One duty cycle over every stream's control plane and descriptors."""
        work = 0
        with self._lock:
            if self._closed:
                return 0
            for c in self._consumers.values():
                before = c.intake_count
                c.poll(_noop, 1 << 16)
                if not c.is_mapped:
                    # An unmapped Consumer does not poll descriptors; never let them back up
                    # into the producer's publication (IPC flow control), keep them as hints.
                    c._sub_desc.poll()
                work += c.intake_count - before
            for poller in self._pollers:
                work += poller()
        return work

    # --- the Agent its runner drives (a bad message is counted there, never fatal) ------------
    role_name = "tensorpool-spark-attach"

    def on_start(self) -> None:
        pass

    def do_work(self) -> int:
        return self.poll_once()

    def on_close(self) -> None:
        pass

    @property
    def runner(self) -> AgentRunner | None:
        return self._runner

    @property
    def lock(self) -> threading.RLock:
        """Held around every use of the consumers and the Aeron context."""
        return self._lock

    # --- queries -------------------------------------------------------------------------------
    def layouts(self) -> dict[int, StreamLayout]:
        """Layouts of the streams currently mapped (fresh announce / live lease)."""
        with self._lock:
            return {
                sid: c.layout
                for sid, c in self._consumers.items()
                if c.is_mapped and c.layout is not None
            }

    def liveness(self, now_ns: int) -> dict[int, tuple[bool, int | None]]:
        """Per stream: (a producer is live, ms since the last accepted announce or None).

        Live = mapped (fresh announces and a fresh superblock, else the Consumer unmaps
        within ``freshnessMs``) and the newest announce names a producer: a SHM driver keeps
        announcing a stream whose producer lease ended, with ``producer_id`` 0 (#16.2).
        ``now_ns`` is on the Consumers' clock (monotonic).
        """
        out: dict[int, tuple[bool, int | None]] = {}
        with self._lock:
            for sid, c in self._consumers.items():
                core = c.core
                seen = core.announce_received_ns
                age = (now_ns - seen) // 1_000_000 if seen else None
                out[sid] = (c.is_mapped and bool(core.announce_producer_id), age)
        return out

    def wait_for_layouts(self, timeout_s: float) -> dict[int, StreamLayout]:
        """Block until every stream has a layout; :class:`StreamsNotAttached` names the rest."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._runner is None:
                self.poll_once()
            got = self.layouts()
            if len(got) == len(self.streams):
                return got
            if time.monotonic() >= deadline:
                missing = [s for s in self.streams if s not in got]
                ch = self.settings.channels
                how = (
                    "no lease from the SHM driver"
                    if self.driver
                    else "no ShmPoolAnnounce (is the producer running?)"
                )
                raise StreamsNotAttached(
                    f"stream(s) {missing}: {how} within {timeout_s:g} s on control "
                    f"{ch.control_channel} stream {ch.control_stream_id}, Aeron dir "
                    f"{self._ctx.dir!r}; check streams / aeronDir / controlChannel / "
                    "controlStreamId / shmBaseDir / attachTimeoutMs"
                )
            time.sleep(0.002)

    def pending(self, stream_id: int) -> int:
        """Descriptors of ``stream_id`` queued and not taken yet."""
        intake = self.intakes.get(stream_id)
        return 0 if intake is None else intake.pending

    def take(
        self, stream_id: int, max_items: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
        """Up to ``max_items`` oldest ``(epoch, seq)`` of one stream, plus ``(epoch, lo, hi,
        count)``: the seq span and number of descriptors its queue dropped (overflow) since
        the previous take -- they precede the returned ones. A
        :class:`~.offsets.DescriptorFeed`."""
        intake = self.intakes.get(stream_id)
        if intake is None:
            return [], []
        out: list[tuple[int, int]] = []
        add = out.append

        def handle(d: tuple[int, int, int, int]) -> None:
            add((d[1], d[2]))

        with self._lock:
            intake.drain(max_items, handle)
            return out, self._drops[stream_id].pop()

    # --- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop polling, detach (driver mode) and close the Aeron client (idempotent)."""
        if self._closed:
            return
        if self._runner is not None:
            self._runner.stop(5.0)  # from its own thread: it ends when this cycle returns
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for c in self._consumers.values():
                try:
                    c.close()
                except Exception:
                    log.exception("closing the consumer of stream %d failed", c.stream_id)
            release_shared_context(self._ctx)
        _unregister(self)
        log.info("tensorpool attachment to streams %s closed", list(self.streams))

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AnnounceProbe:
    """Standalone layouts for batch plans, on the process's client and conductor (#28.1).

    A :class:`Attachment` builds a full Consumer per stream (five publications and
    subscriptions, ~30 ms each to register with the media driver); a batch read only needs
    the announces. The probe subscribes to the control stream, says ``ConsumerHello`` per
    stream (a standalone producer answers with an announce at once) and applies the same
    announce rules as the Consumer (:class:`~tensorpool.client.announce.AnnounceTracker`:
    freshness, join time, highest epoch wins). A layout counts only once its regions map and
    validate (``on_mapped``), so a bad announce cannot hide the stream's real producer.
    One plan can open and close its own probe; :func:`shared_probe` keeps one per process
    between plans (#15), so a layout is handed out only while its newest announce is fresh and
    ``is_current`` says its files are still the ones validated.
    """

    def __init__(
        self,
        streams: tuple[int, ...],
        settings: ClientSettings,
        *,
        map_layout: Callable[[StreamLayout], object],
        is_current: Callable[[StreamLayout], bool] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.streams = streams
        self.settings = settings
        self._map = map_layout
        self._is_current = is_current
        self._clock = clock
        self._trackers: dict[int, AnnounceTracker] = {}
        self._layouts: dict[int, StreamLayout] = {}
        #: per stream: (timestamp, clock domain) of the newest announce of its current layout
        self._heard: dict[int, tuple[int, int]] = {}
        self.rejected: dict[str, int] = {}
        #: stream id -> when an announce of it was last received (any stream on the channel)
        self._announced: dict[int, int] = {}
        self._opened_ns = clock()
        #: ConsumerHellos said (a plan that found every layout fresh says none)
        self.hellos = 0
        #: held while a plan uses the probe; a shared probe's keeper polls only when it is free
        self.lock = threading.RLock()
        self.closed = False
        self.last_used = time.monotonic()
        self.track(streams)
        self._buf = bytearray(1024)
        self._consumer_id = random.getrandbits(31) + 1
        self._meta: MetaTracker | None = None
        # the process's one client and conductor (#28.1): announces arrive decoded on a tap of
        # the shared control subscription, hellos go out on the shared control publication
        self._ctx = shared_context(settings.transport)
        self.generation = self._ctx.generation
        """The media driver generation this probe's layouts were learnt on (#13.2)."""
        ch = settings.channels
        try:
            self._conductor = ClientConductor.acquire(self._ctx, ch)
            self._tap = self._conductor.hub.tap(
                ch.control_channel, ch.control_stream_id, (wire.ShmPoolAnnounceDecoder,)
            )
            self._pub = self._conductor.control_pub
        except BaseException:
            release_shared_context(self._ctx)
            raise

    def _take_announces(self) -> int:
        items = self._tap.drain()
        for dec, _raw, join in items:
            if not isinstance(dec, str):  # a damaged announce: the conductor counted it
                self._on_announce(dec, join)
        return len(items)

    def _on_announce(self, dec: wire.ShmPoolAnnounceDecoder, join: int) -> None:
        try:
            sid = dec.stream_id
            now = self._clock()
            if len(self._announced) >= MAX_HEARD_STREAMS and sid not in self._announced:
                self._forget_unheard(now)
            self._announced[sid] = now  # stream discovery (#16.4) hears every announce
            tracker = self._trackers.get(sid)
            if tracker is None:
                return
            decision = tracker.on_announce(
                sid,
                dec.epoch,
                dec.announce_timestamp_ns,
                dec.announce_clock_domain_raw,
                dec.header_slot_bytes,
                join,
                now,
            )
            if decision.verdict is Verdict.IGNORE:
                return
            layout = StreamLayout.from_announce(dec)
            if decision.verdict is Verdict.REFRESH:
                held = self._layouts.get(sid)
                if held is not None and _same_regions(held, layout):
                    self._heard[sid] = (layout.announce_timestamp_ns, layout.clock_domain)
                    return
                # the same epoch with other regions (another producer directory whose epoch
                # counter is at the same value): validate and map it like a new epoch
        except CodecError as exc:
            self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1
            return
        try:
            self._map(layout)
        except Exception as exc:
            reason = getattr(exc, "reason", type(exc).__name__)
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            log.warning("stream %d epoch %d not mappable: %s", sid, layout.epoch, exc)
            return
        tracker.on_mapped(layout.epoch, now)
        self._layouts[sid] = layout
        self._heard[sid] = (layout.announce_timestamp_ns, layout.clock_domain)

    def track(self, streams: tuple[int, ...]) -> None:
        """Apply the announce rules to ``streams`` too (a shared probe serves many queries)."""
        for sid in streams:
            if sid not in self._trackers:
                self._trackers[sid] = AnnounceTracker(
                    sid, self.settings.freshness_ns, realtime_clock=time.time_ns
                )

    def _fresh(self, sid: int, now: int) -> bool:
        """``sid`` has a mapped layout whose newest announce passes the freshness rule *now*
        (the rule an arriving announce must pass, applied again at planning time)."""
        tracker = self._trackers[sid]
        if tracker.tick(now) is not None:  # no fresh announce for a freshness window: unmap
            self._layouts.pop(sid, None)
            self._heard.pop(sid, None)
        layout = self._layouts.get(sid)
        if layout is None:
            return False
        if self._is_current is not None and not self._is_current(layout):
            # its files were removed or replaced since it mapped: that epoch is over
            tracker.on_unmapped(forget_epoch=True)
            del self._layouts[sid], self._heard[sid]
            return False
        ts, domain = self._heard[sid]
        age = (time.time_ns() if domain == CLOCK_REALTIME_SYNCED else now) - ts
        return age <= self.settings.freshness_ns

    def _forget_unheard(self, now: int) -> None:
        """Bound the discovery record: drop streams not heard for a minute."""
        old = now - 60_000_000_000
        self._announced = {s: t for s, t in self._announced.items() if t >= old}

    def announced(self, lo: int, hi: int, window_s: float) -> tuple[int, ...]:
        """Stream ids in ``[lo, hi]`` announced within the last ``window_s`` (a probe younger
        than that listens for the rest of it first): stream discovery for a batch read."""
        window = int(window_s * 1e9)
        while self._clock() - self._opened_ns < window:
            if not self.poll():
                time.sleep(0.005)
        self.poll()
        now = self._clock()
        return tuple(
            sorted(s for s, t in self._announced.items() if lo <= s <= hi and now - t <= window)
        )

    def poll(self) -> int:
        """Poll the process's conductor and apply the announces it decoded for this probe,
        and the metadata once :meth:`meta_tracker` made it."""
        work = 0
        while n := self._conductor.poll() + self._take_announces():
            work += n
        meta = self._meta
        if meta is not None:
            while n := meta.poll():
                work += n
        return work

    def meta_tracker(self) -> MetaTracker:
        """The ``DataSourceAnnounce``/``DataSourceMeta`` of this probe's metadata channel
        (``includeStreamMetadata``), subscribed on first use and kept with the probe.

        Kept, not one per plan: a shared probe outlives its plans, so a per-plan subscription
        would pile up on its Aeron client; and a kept tracker already knows the metadata of
        streams whose producers keep publishing it, so a plan waits for nothing. It is polled
        with the control subscription (:meth:`poll`, also by the shared probe's keeper): an IPC
        subscription that nobody polls holds back every publisher of its stream.
        """
        meta = self._meta
        if meta is None:
            ch = self.settings.channels
            meta = MetaTracker()
            meta.subscribe(self._ctx, ch.metadata_channel, ch.metadata_stream_id)
            self._meta = meta
        return meta

    @property
    def context(self) -> AeronContext:
        """The process's Aeron context the probe uses (its metadata tap rides along, #16.4)."""
        return self._ctx

    def hello(self, sid: int) -> None:
        """Say ``ConsumerHello`` for ``sid``: its producer announces (and sends metadata) now."""
        self._hello(sid)

    def _hello(self, sid: int) -> None:
        n = wire.ConsumerHelloEncoder.encode(
            self._buf,
            0,
            stream_id=sid,
            consumer_id=self._consumer_id,
            supports_shm=int(wire.Bool.TRUE),
            supports_progress=int(wire.Bool.FALSE),
            mode=int(wire.Mode.STREAM),
            max_rate_hz=0,
            expected_layout_version=0,
            descriptor_stream_id=0,
            control_stream_id=0,
            descriptor_channel="",
            control_channel="",
        )
        self._pub.offer(self._buf, 0, n)
        self.hellos += 1

    def wait_for_layouts(
        self, timeout_s: float, streams: tuple[int, ...] | None = None
    ) -> dict[int, StreamLayout]:
        """Layouts of ``streams`` (default: the probe's), each with a fresh announce; says
        ``ConsumerHello`` every 0.2 s for the others until ``timeout_s``."""
        streams = self.streams if streams is None else streams
        self.track(streams)
        deadline = time.monotonic() + timeout_s
        next_hello = 0.0
        self.poll()  # announces already delivered count (a shared probe has heard them)
        while True:
            now = time.monotonic()
            clock_now = self._clock()
            missing = [s for s in streams if not self._fresh(s, clock_now)]
            if not missing:
                return {s: self._layouts[s] for s in streams}
            if now >= next_hello:
                for sid in missing:
                    self._hello(sid)
                next_hello = now + 0.2
            if now >= deadline:
                ch = self.settings.channels
                raise StreamsNotAttached(
                    f"stream(s) {missing}: no ShmPoolAnnounce (is the producer running?) within "
                    f"{timeout_s:g} s on control {ch.control_channel} stream "
                    f"{ch.control_stream_id}, Aeron dir {self._ctx.dir!r}"
                    + (f", rejected: {self.rejected}" if self.rejected else "")
                    + "; check streams / aeronDir / controlChannel / controlStreamId / "
                    "shmBaseDir / attachTimeoutMs"
                )
            if not self.poll():
                time.sleep(0.001)

    @property
    def context_dir(self) -> str | None:
        """The Aeron directory (for messages), None once closed."""
        return None if self.closed else self._ctx.dir

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._meta is not None:
            self._meta.close()
        self._conductor.unregister(self._tap)
        self._conductor.release()
        release_shared_context(self._ctx)

    def __enter__(self) -> AnnounceProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- one shared probe per process and control channel (batch reads, #15) ------------------------
#: how long an unused shared probe stays open. Spark reuses its Python workers (and ends idle ones
#: after a minute), so a query planned in the same worker within this time skips the Aeron setup
#: and, while the producers keep announcing, the wait for an announce.
PROBE_IDLE_S: float = 30.0
#: how often a shared probe's keeper drains the control subscription while no plan uses it: an
#: IPC subscription that is not polled is flow control for every publisher on the control stream
PROBE_KEEPER_PERIOD_S: Final = 0.01
#: shared probes one process keeps (one per Aeron directory, channels and SHM base directories)
MAX_SHARED_PROBES: Final = 4
_PROBES: dict[tuple[object, ...], AnnounceProbe] = {}
_PROBES_LOCK = threading.Lock()


def _retire(key: tuple[object, ...], probe: AnnounceProbe, why: str) -> None:
    """Close ``probe`` (its lock held by the caller) and forget it."""
    with _PROBES_LOCK:
        if _PROBES.get(key) is probe:
            del _PROBES[key]
    where = probe.context_dir
    probe.close()
    log.info("tensorpool: shared announce probe on %s closed (%s)", where, why)


def _driver_lost(probe: AnnounceProbe) -> bool:
    """The media driver went away or was replaced (seen by the keeper's runner): a fresh
    client is needed (#13.2)."""
    ctx = probe.context
    return ctx.media_driver_lost or ctx.generation != probe.generation


class _ProbeKeeper:
    """Polls a shared probe while no plan uses it; closes it when idle or when its media driver
    was lost or replaced (a fresh probe then starts clean, #13.2). Run by an
    :class:`AgentRunner`, which keeps the probe's media driver (#26.1)."""

    role_name = "tensorpool-spark-probe"

    def __init__(self, key: tuple[object, ...], probe: AnnounceProbe) -> None:
        self.key, self.probe = key, probe

    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        pass

    def do_work(self) -> int:
        probe = self.probe
        if probe.closed:
            raise AgentTermination
        if not probe.lock.acquire(blocking=False):
            return 0  # a plan holds it (and polls it itself)
        try:
            if probe.closed:
                raise AgentTermination
            if time.monotonic() - probe.last_used > PROBE_IDLE_S:
                _retire(self.key, probe, f"unused for {PROBE_IDLE_S:g} s")
            elif _driver_lost(probe):
                _retire(self.key, probe, "media driver lost")
            else:
                probe.poll()
        except AgentTermination:
            raise
        except Exception:  # never leave a probe that nobody polls
            log.exception("tensorpool: shared announce probe failed; closing it")
            _retire(self.key, probe, "keeper failed")
        finally:
            probe.lock.release()
        return 0  # one look per period (PROBE_KEEPER_PERIOD_S), whatever it found


def _start_keeper(key: tuple[object, ...], probe: AnnounceProbe) -> None:
    AgentRunner(
        _ProbeKeeper(key, probe),
        SleepingIdleStrategy(int(PROBE_KEEPER_PERIOD_S * 1e9)),
        context=probe.context,
        context_lock=probe.lock,
    ).start(name="tensorpool-spark-probe")


@contextlib.contextmanager
def shared_probe(
    settings: ClientSettings,
    *,
    map_layout: Callable[[StreamLayout], object],
    is_current: Callable[[StreamLayout], bool] | None = None,
    scope: object = None,
) -> Iterator[AnnounceProbe]:
    """This process's :class:`AnnounceProbe` of ``settings``' control channel, held for one plan.

    The first plan opens it (a tap on the process's control subscription, joining the process's
    Aeron client if none is open yet: ~50 ms with
    the media driver, and ~15 ms to close); later plans within :data:`PROBE_IDLE_S` reuse it, and
    a keeper thread polls it in between, so the layouts of streams whose producers keep
    announcing are known when the plan starts. Every announce still passes the same rules
    (freshness, join time, highest epoch, regions that map), and a layout is used only while its
    newest announce is fresh (:meth:`AnnounceProbe.wait_for_layouts`) and ``is_current`` says
    its regions are still the files that were validated. ``scope``: whatever else the callbacks
    depend on (the SHM base directories), part of the key.
    """
    if settings.transport.aeron_dir is None:  # an embedded media driver: nothing to share
        with AnnounceProbe((), settings, map_layout=map_layout) as probe:
            yield probe
        return
    key = (os.getpid(), settings, scope)
    while True:
        victims: list[tuple[tuple[object, ...], AnnounceProbe]] = []
        with _PROBES_LOCK:
            probe = _PROBES.get(key)
            if probe is None:
                probe = _PROBES[key] = AnnounceProbe(
                    (), settings, map_layout=map_layout, is_current=is_current
                )
                _start_keeper(key, probe)
                if is_spark_worker():
                    watch_parent()
                others = sorted(
                    (p.last_used, id(k), k) for k, p in _PROBES.items() if p is not probe
                )
                for _, _, k in others[: max(0, len(_PROBES) - MAX_SHARED_PROBES)]:
                    victims.append((k, _PROBES[k]))
        for k, old in victims:  # the least recently used beyond the bound (not while in use)
            if old.lock.acquire(blocking=False):
                try:
                    if not old.closed:
                        _retire(k, old, f"more than {MAX_SHARED_PROBES} shared probes")
                finally:
                    old.lock.release()
        with probe.lock:
            if probe.closed:
                continue  # retired meanwhile
            if _driver_lost(probe):
                _retire(key, probe, "media driver lost")
                continue
            try:
                yield probe
            finally:
                probe.last_used = time.monotonic()
            return


def shared_probes() -> int:
    """How many shared probes this process holds open."""
    with _PROBES_LOCK:
        return len(_PROBES)


def _close_probes(timeout_s: float = 2.0) -> int:
    with _PROBES_LOCK:
        probes = list(_PROBES.items())
    closed = 0
    for key, probe in probes:
        # a wedged plan may hold the lock: then leave the client to the media driver's timeout
        if probe.lock.acquire(timeout=timeout_s):
            try:
                if not probe.closed:
                    _retire(key, probe, "process exit")
                    closed += 1
            finally:
                probe.lock.release()
    return closed


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: its copies must never be used."""
    global _PROBES_LOCK
    _PROBES_LOCK = threading.Lock()
    _PROBES.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --- process-wide registry, exit hooks and the parent watch ------------------------------------
_OPEN: weakref.WeakSet[Attachment] = weakref.WeakSet()
_HOOKS_LOCK = threading.Lock()

#: set by the JVM in the environment of every Python worker it starts (pyspark ``worker_util``)
SPARK_WORKER_ENV: Final = (
    "PYTHON_WORKER_FACTORY_SECRET",
    "PYTHON_WORKER_FACTORY_PORT",
    "PYTHON_WORKER_FACTORY_SOCK_PATH",
)
#: exit status of a process whose parent went away (like a shell's 128 + SIGHUP)
EXIT_PARENT_GONE: Final = 129
_WATCH: threading.Thread | None = None


def close_all() -> int:
    """Close every attachment (and shared probe) of this process; returns how many
    attachments were open."""
    open_now = list(_OPEN)
    for a in open_now:
        with contextlib.suppress(Exception):
            a.close()
    with contextlib.suppress(Exception):
        _close_probes()
    return len(open_now)


def is_spark_worker() -> bool:
    """Whether this process is a Python worker the Spark JVM started (its life is the JVM's)."""
    return any(k in os.environ for k in SPARK_WORKER_ENV)


def _parent_gone(parent: int, close_timeout_s: float) -> None:
    log.warning("tensorpool: parent process %d is gone; exiting", parent)
    # Detach leases if that can be done quickly; a wedged main thread may hold the locks.
    closer = threading.Thread(target=close_all, name="tensorpool-parent-gone", daemon=True)
    closer.start()
    closer.join(close_timeout_s)
    os._exit(EXIT_PARENT_GONE)


def watch_parent(poll_s: float = 0.5, close_timeout_s: float = 2.0) -> bool:
    """Exit this process (``os._exit``) soon after its parent process goes away (idempotent):
    :func:`tensorpool.transport.process.watch_parent` on the parent seen now. Before exiting it
    closes the attachments (detaching driver leases) for at most ``close_timeout_s``. Returns
    whether a watch runs.
    """
    global _WATCH
    with _HOOKS_LOCK:
        if _WATCH is not None:
            return True
        parent = os.getppid()
        _WATCH = watch_parent_process(parent, lambda: _parent_gone(parent, close_timeout_s), poll_s)
        return True


def _register(a: Attachment) -> None:
    _OPEN.add(a)
    if is_spark_worker():
        watch_parent()


def _unregister(a: Attachment) -> None:
    _OPEN.discard(a)


atexit.register(close_all)


def open_attachment(
    streams: tuple[int, ...],
    settings: ClientSettings,
    *,
    driver: bool,
    background: bool = True,
    intake_capacity: int | None = DEFAULT_INTAKE_CAPACITY,
) -> Attachment:
    """The one entry point the readers use (swap the implementation here)."""
    return Attachment(
        streams,
        settings,
        driver=driver,
        background=background,
        intake_capacity=intake_capacity,
    )


__all__ = [
    "DEFAULT_INTAKE_CAPACITY",
    "PROBE_IDLE_S",
    "AnnounceProbe",
    "Attachment",
    "StreamsNotAttached",
    "close_all",
    "is_spark_worker",
    "open_attachment",
    "shared_probe",
    "shared_probes",
    "watch_parent",
]
