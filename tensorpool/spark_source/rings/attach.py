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

Process hygiene (exit hooks, the parent watch): :mod:`.lifecycle`. The batch readers' announce
probes, which need only the announces: :mod:`.probe`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from tensorpool.client.announce import StreamLayout
from tensorpool.client.consumer import Consumer
from tensorpool.client.settings import ClientSettings
from tensorpool.ingest import DropInfo, IngressBuffer
from tensorpool.spark_source.rings import lifecycle
from tensorpool.specs import CodecError
from tensorpool.specs.generated import wire
from tensorpool.transport.agent import AgentRunner
from tensorpool.transport.context import AeronContext, release_shared_context, shared_context
from tensorpool.transport.idle import SleepingIdleStrategy

log = logging.getLogger(__name__)

DEFAULT_INTAKE_CAPACITY: Final = 65536
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
        lifecycle.register(self)
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
        lifecycle.unregister(self)
        log.info("tensorpool attachment to streams %s closed", list(self.streams))

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    "Attachment",
    "StreamsNotAttached",
    "open_attachment",
]
