"""Announce probes: standalone layouts for batch plans without a Consumer per stream.

:class:`AnnounceProbe` taps the process's control subscription (its one client and conductor,
#28.1), says ``ConsumerHello`` and applies the Consumer's announce rules; :func:`shared_probe`
keeps one per process and control channel between plans (#15), polled by a keeper thread while
no plan uses it and closed when unused for :data:`PROBE_IDLE_S`, when its media driver is gone,
or at exit (:func:`~.lifecycle.close_all`). In a Spark worker the first shared probe starts the
parent watch (:func:`~.lifecycle.watch_parent`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Final

from tensorpool.client.announce import (
    CLOCK_REALTIME_SYNCED,
    AnnounceTracker,
    StreamLayout,
    Verdict,
)
from tensorpool.client.conductor import ClientConductor
from tensorpool.client.settings import ClientSettings
from tensorpool.spark_source.rings import lifecycle
from tensorpool.spark_source.rings.attach import StreamsNotAttached
from tensorpool.spark_source.rings.stream_meta import MetaTracker
from tensorpool.specs import CodecError
from tensorpool.specs.generated import wire
from tensorpool.transport.agent import AgentRunner, AgentTermination
from tensorpool.transport.context import AeronContext, release_shared_context, shared_context
from tensorpool.transport.idle import SleepingIdleStrategy

log = logging.getLogger(__name__)

#: stream ids an announce probe remembers for discovery before it forgets the silent ones
MAX_HEARD_STREAMS: Final = 65536


def _same_regions(a: StreamLayout, b: StreamLayout) -> bool:
    """The same layout apart from the announce's timestamp."""
    return a == replace(b, announce_timestamp_ns=a.announce_timestamp_ns)


class AnnounceProbe:
    """Standalone layouts for batch plans, on the process's client and conductor (#28.1).

    A :class:`~.attach.Attachment` builds a full Consumer per stream (five publications and
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
                if lifecycle.is_spark_worker():
                    lifecycle.watch_parent()
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

lifecycle.also_close(_close_probes)

__all__ = [
    "PROBE_IDLE_S",
    "AnnounceProbe",
    "shared_probe",
    "shared_probes",
]
