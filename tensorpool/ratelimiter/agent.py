"""The rate limiter agent: the I/O shell around the gates, relays and forwarder.

One :class:`RateLimiterAgent` runs one rate limiter instance (one config file). It holds a
:class:`~tensorpool.ratelimiter.relay.MappingRelay` per mapping and, besides, polls:

all through its context's :class:`~tensorpool.client.conductor.ContextConductor` (#28.1: the
process's one subscription per stream, each message decoded once; the agent drains its taps):

* the driver control stream for ``ConsumerHello`` of a *destination* stream, whose
  ``max_rate_hz`` (mode ``RATE_LIMITED``) becomes that mapping's rate (§4);
* with ``forward_metadata`` the shared metadata stream, forwarding the sources'
  ``DataSourceAnnounce``/``DataSourceMeta`` for the destinations on the same stream (§6);
* with ``forward_progress`` ``control_channel``/``source_control_stream_id`` -> forwarded
  ``FrameProgress`` on ``control_channel``/``dest_control_stream_id`` (§6.1);
* with ``forward_qos`` ``qos_channel``/``source_qos_stream_id`` -> forwarded
  ``QosProducer``/``QosConsumer`` on ``qos_channel``/``dest_qos_stream_id`` (§6.1).

Construction attaches every destination first (the driver refuses a second producer of a
stream with ``REJECTED``: :class:`~tensorpool.client.producer.AttachError` propagates and
nothing keeps running, §3), then the sources. The source side uses the deployment's shared
channels (``[driver]`` in the config); the destination differs only in its descriptor
channel/stream (``rate_limiter.descriptor_channel``/``descriptor_stream_id``). The rate
limiter never publishes a ``FrameDescriptor`` for a source stream: its only producers are
the destination ones.

``do_work()`` follows Aeron's Agent contract (returns the work done and never waits: the
destination reattach after a source restart completes over later duty cycles, see
:mod:`~tensorpool.ratelimiter.relay`, #14.3) and can be driven by an
:class:`~tensorpool.transport.AgentRunner`; run it with
:meth:`RateLimiterAgent.idle_strategy`, which sleeps until the next rate slot so the cost
follows the output rate (:mod:`tensorpool.ratelimiter.idle`). Time comes from the injected
clock; the same clock drives the consumers, producers and gates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from tensorpool.client.conductor import ContextConductor, Tap
from tensorpool.client.consumer import Consumer
from tensorpool.client.driver_client import LeaseTimings
from tensorpool.client.producer import Producer
from tensorpool.client.progress_core import ProgressRequest
from tensorpool.client.settings import ClientSettings
from tensorpool.counters import DropCounters
from tensorpool.endpoints import Endpoints
from tensorpool.ratelimiter.config import MappingConfig, RateLimiterConfig, pool_fit_problem
from tensorpool.ratelimiter.forward import Forwarder, Route
from tensorpool.ratelimiter.gate import idle_hint_ns
from tensorpool.ratelimiter.idle import SlotIdleStrategy
from tensorpool.ratelimiter.relay import MappingRelay
from tensorpool.specs import CodecError
from tensorpool.specs.generated import wire
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext
from tensorpool.transport.idle import BackoffIdleStrategy
from tensorpool.transport.publication import Publisher

log = logging.getLogger(__name__)

__all__ = ["PoolFitError", "RateLimiterAgent", "client_settings"]

_MS: Final = 1_000_000
#: Longest sleep between duty cycles while every mapping waits for its next slot.
MAX_SLEEP_NS: Final = 10 * _MS
MAX_SLEEP_PROGRESS_NS: Final = 1 * _MS

OpenSource = Callable[[MappingConfig], Consumer]
OpenDest = Callable[[MappingConfig], Producer]


def client_settings(
    config: RateLimiterConfig, ctx: AeronContext, *, destination: bool
) -> ClientSettings:
    """Client settings for the source side, or (``destination``) the destination side."""
    d = config.driver
    channels = Endpoints(
        control_channel=d.control_channel,
        control_stream_id=d.control_stream_id,
        descriptor_channel=config.descriptor_channel if destination else d.descriptor_channel,
        descriptor_stream_id=config.descriptor_stream_id if destination else d.descriptor_stream_id,
        qos_channel=d.qos_channel,
        qos_stream_id=d.qos_stream_id,
        metadata_channel=d.metadata_channel,
        metadata_stream_id=d.metadata_stream_id,
    )
    return ClientSettings(
        transport=ctx.config,
        channels=channels,
        shm_base_dir=d.shm_base_dir,
        allowed_base_dirs=d.allowed_base_dirs,
        announce_period_ns=d.announce_period_ms * _MS,
    )


class PoolFitError(RuntimeError):
    """A mapping's destination pools cannot hold the frames its source carries (#13.7)."""


class RateLimiterAgent:
    """A rate limiter instance over an Aeron context (use from one thread)."""

    role_name = "ratelimiter"

    def __init__(
        self,
        config: RateLimiterConfig,
        ctx: AeronContext,
        *,
        clock: NanoClock = now_ns,
        open_source: OpenSource | None = None,
        open_dest: OpenDest | None = None,
        attach_timeout_s: float = 10.0,
        max_sleep_ns: int | None = None,
    ) -> None:
        self.config = config
        if max_sleep_ns is None:  # forwarded progress must not wait long; leases never do
            max_sleep_ns = MAX_SLEEP_PROGRESS_NS if config.forward_progress else MAX_SLEEP_NS
        self.max_sleep_ns = max_sleep_ns
        self._ctx = ctx
        self._clock = clock
        self.counters = DropCounters()
        timings = LeaseTimings(
            keepalive_interval_ns=config.driver.lease_keepalive_interval_ms * _MS
        )
        src_settings = client_settings(config, ctx, destination=False)
        dst_settings = client_settings(config, ctx, destination=True)

        def default_source(m: MappingConfig) -> Consumer:
            return Consumer(
                ctx,
                m.source_stream_id,
                src_settings,
                driver=True,
                clock=clock,
                lease_timings=timings,
                # a producer publishes FrameProgress only to consumers that ask (§10.2.2)
                progress=ProgressRequest() if config.forward_progress else None,
            )

        def default_dest(m: MappingConfig, *, wait: bool = True) -> Producer:
            producer = Producer(
                ctx,
                m.dest_stream_id,
                dst_settings,
                driver=True,
                clock=clock,
                lease_timings=timings,
                attach_timeout_s=attach_timeout_s,
                instance_id=config.instance_id,
            )
            if wait:  # at startup: a refused attach (§3) must stop us before anything runs
                try:
                    producer.wait_until_attached()
                except BaseException:
                    producer.close()
                    raise
            return producer

        def reopen_dest(m: MappingConfig) -> Producer:
            # a rollover after a source restart: the attach completes in later duty cycles
            # (#14.3, §5 "MUST NOT block": the other mappings keep being served meanwhile)
            return default_dest(m, wait=False)

        self._open_source = open_source or default_source
        self._open_dest = open_dest or default_dest
        self._reopen_dest = open_dest or reopen_dest
        self.routes: list[Route] = []
        self.relays: list[MappingRelay] = []
        self._by_dest: dict[int, MappingRelay] = {}
        self._route_of: dict[int, Route] = {}
        self.forwarder: Forwarder | None = None
        self._meta_pub: Publisher | None = None
        self._progress_pub: Publisher | None = None
        self._qos_pub: Publisher | None = None
        self._conductor = ContextConductor.acquire(ctx)
        self._conductor_held = True
        self._taps: list[tuple[Tap, Callable[[Any, bytes], None]]] = []
        self._fit_checked: dict[int, tuple[object, object]] = {}
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        cfg = self.config
        for m in cfg.mappings:
            route = Route(m.source_stream_id, m.dest_stream_id, m.metadata_stream_id)
            self.routes.append(route)
            self._route_of[m.dest_stream_id] = route
        # Destinations first: a refused producer attach (§3) must stop us before anything runs.
        dests: list[Producer] = []
        try:
            for m in cfg.mappings:
                dests.append(self._open_dest(m))
            for m, producer in zip(cfg.mappings, list(dests), strict=True):
                first = [producer]

                def open_dest(m: MappingConfig = m, first: list[Producer] = first) -> Producer:
                    return first.pop() if first else self._reopen_dest(m)

                relay = MappingRelay(
                    m,
                    self._open_source(m),
                    open_dest,
                    hold=cfg.hold,
                    clock=self._clock,
                    on_dest_epoch=self._on_dest_epoch,
                )
                dests.remove(producer)  # owned by the relay now
                self.relays.append(relay)
                self._by_dest[m.dest_stream_id] = relay
                self._on_dest_epoch(relay)
        except BaseException:
            for p in dests:
                p.close()
            raise
        d = cfg.driver
        self.forwarder = Forwarder(self.routes)
        hub = self._conductor
        w = wire
        self._tap(d.control_channel, d.control_stream_id, (w.ConsumerHelloDecoder,), self._on_hello)
        if cfg.forward_metadata:
            self._meta_pub = hub.publication(d.metadata_channel, d.metadata_stream_id)
            kinds = (w.DataSourceAnnounceDecoder, w.DataSourceMetaDecoder)
            self._tap(d.metadata_channel, d.metadata_stream_id, kinds, self._on_metadata)
        if cfg.forward_progress:  # config validation guarantees nonzero ids (§8)
            self._progress_pub = hub.publication(cfg.control_channel, cfg.dest_control_stream_id)
            kinds = (w.FrameProgressDecoder,)
            self._tap(cfg.control_channel, cfg.source_control_stream_id, kinds, self._on_progress)
        if cfg.forward_qos:
            self._qos_pub = hub.publication(cfg.qos_channel, cfg.dest_qos_stream_id)
            kinds = (w.QosProducerDecoder, w.QosConsumerDecoder)
            self._tap(cfg.qos_channel, cfg.source_qos_stream_id, kinds, self._on_qos)

    def _tap(
        self,
        channel: str,
        stream_id: int,
        kinds: tuple[type, ...],
        handler: Callable[[Any, bytes], None],
    ) -> None:
        self._taps.append((self._conductor.tap(channel, stream_id, kinds), handler))

    # --- duty cycle -------------------------------------------------------------------------
    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        self.close()

    def do_work(self) -> int:
        now = self._clock()
        work = 0
        for relay in self.relays:
            work += relay.do_work(now)
            route = self._route_of[relay.mapping.dest_stream_id]
            route.source_epoch = relay.consumer.epoch
            self._check_pool_fit(relay)
        work += self._conductor.poll(now)
        for tap, handler in self._taps:
            for dec, raw, _join in tap.drain():
                handler(dec, raw)
                work += 1
        return work

    def _check_pool_fit(self, relay: MappingRelay) -> None:
        """Refuse a destination that cannot hold the source's frames (#13.7).

        Checked once per (source layout, destination layout) pair, as soon as both are
        known (the source's announce or attach response, the destination's attach): raises
        :class:`PoolFitError` instead of dropping every larger frame as ``no_pool_fits``.
        """
        layout, producer = relay.consumer.layout, relay.producer
        if layout is None or producer is None or not producer.attached:
            return
        key = (layout.pools, producer.stream.pools)  # what the verdict depends on
        if self._fit_checked.get(relay.mapping.dest_stream_id) == key:
            return
        self._fit_checked[relay.mapping.dest_stream_id] = key
        src_max = max((p.stride_bytes for p in layout.pools), default=0)
        problem = pool_fit_problem(
            relay.mapping, src_max, producer.payload_capacity(), f"epoch {layout.epoch}"
        )
        if problem:
            raise PoolFitError(problem)

    def idle_hint_ns(self, now: int) -> int:
        """How long the agent may sleep: until the earliest rate slot (at most
        ``max_sleep_ns``); 0 while a slot is open or a mapping is unlimited."""
        return idle_hint_ns((r.gate for r in self.relays), now, self.max_sleep_ns)

    def idle_strategy(self, max_park_ns: int = 1_000_000) -> SlotIdleStrategy:
        """The idle strategy to run this agent with (see :mod:`tensorpool.ratelimiter.idle`)."""
        return SlotIdleStrategy(
            self.idle_hint_ns, BackoffIdleStrategy(max_park_ns=max_park_ns), clock=self._clock
        )

    # --- ConsumerHello (§4) -----------------------------------------------------------------
    def _on_hello(self, dec: wire.ConsumerHelloDecoder | str, _raw: bytes) -> None:
        if isinstance(dec, str):  # a hello the conductor could not decode
            self.counters.increment(f"hello_{dec}")
            return
        try:
            relay = self._by_dest.get(dec.stream_id)
            if relay is None:
                return
            consumer_id, mode, rate = dec.consumer_id, dec.mode_raw, dec.max_rate_hz
        except CodecError as exc:
            self.counters.increment(f"hello_{exc.reason}")
            return
        gate = relay.gate
        previous = gate.hello_consumer_id
        if gate.on_consumer_hello(consumer_id, mode, rate):
            log.info(
                "stream %d: consumer %d asks for %s",
                relay.mapping.dest_stream_id,
                consumer_id,
                f"{rate} Hz" if rate else "no limit",
            )
        if previous is not None and previous != gate.hello_consumer_id:
            self.counters.increment("hello_from_another_consumer")

    # --- forwarding (§6, §6.1) --------------------------------------------------------------
    def _on_dest_epoch(self, relay: MappingRelay) -> None:
        route = self._route_of[relay.mapping.dest_stream_id]
        producer = relay.producer
        if producer is None or not relay.dest_epoch:
            route.dest_nslots = 0
            return
        route.dest_epoch = producer.epoch
        route.dest_producer_id = producer.producer_id
        route.dest_nslots = producer.stream.header_nslots
        self._sync_producer_metadata(relay, route)
        if self._meta_pub is not None and self.forwarder is not None:
            for data in self.forwarder.replay(route):
                self._offer(self._meta_pub, data, "metadata_not_sent")

    def _sync_producer_metadata(self, relay: MappingRelay, route: Route) -> None:
        """Keep the destination producer's own periodic ``DataSourceAnnounce`` identical to the
        forwarded one (same name, summary and meta_version), so the two never disagree."""
        producer = relay.producer
        if producer is None or route.metadata_stream_id != route.dest_stream_id:
            return
        if route.meta_version is None:
            return
        if producer.stream.name != route.name or producer.stream.summary != route.summary:
            from dataclasses import replace

            producer.stream = replace(producer.stream, name=route.name, summary=route.summary)
        producer.meta_version = route.meta_version

    # The forwarder translates from the bytes the conductor decoded (the taps carry both).
    def _on_metadata(self, dec: object, raw: bytes) -> None:
        fwd = self.forwarder
        assert fwd is not None and self._meta_pub is not None
        if isinstance(dec, str):
            fwd.counters.increment(f"metadata_{dec}")
            return
        out = fwd.metadata(raw)
        if out is None:
            return
        route, data = out
        self._offer(self._meta_pub, data, "metadata_not_sent")
        relay = self._by_dest.get(route.dest_stream_id)
        if relay is not None:
            self._sync_producer_metadata(relay, route)

    def _on_progress(self, dec: object, raw: bytes) -> None:
        assert self.forwarder is not None and self._progress_pub is not None
        if isinstance(dec, str):
            self.forwarder.counters.increment(f"progress_{dec}")
            return
        data = self.forwarder.progress(raw)
        if data is not None:
            self._offer(self._progress_pub, data, "progress_not_sent")

    def _on_qos(self, dec: object, raw: bytes) -> None:
        assert self.forwarder is not None and self._qos_pub is not None
        if isinstance(dec, str):
            self.forwarder.counters.increment(f"qos_{dec}")
            return
        data = self.forwarder.qos(raw)
        if data is not None:
            self._offer(self._qos_pub, data, "qos_not_sent")

    def _offer(self, pub: Publisher, data: memoryview, reason: str) -> None:
        if not pub.offer(data):
            self.counters.increment(reason)

    # --- reporting / lifecycle --------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Counters for logs, the CLI's JSON lines and tests (plain values only)."""
        mappings = []
        for relay in self.relays:
            st = relay.stats
            g = relay.gate
            mappings.append(
                {
                    "source_stream_id": relay.mapping.source_stream_id,
                    "dest_stream_id": relay.mapping.dest_stream_id,
                    "source_epoch": relay.source_epoch,
                    "dest_epoch": relay.dest_epoch,
                    "rate_hz": g.rate_hz,
                    "hello_rate_hz": g.hello_rate_hz,
                    "hold": "copy" if relay.copying else "descriptor",
                    "offered": g.stats.offered,
                    "published": st.published,
                    "published_bytes": st.published_bytes,
                    "copies": st.copies,
                    "superseded": g.stats.superseded,
                    "discarded_on_reset": g.stats.discarded_on_reset,
                    "source_remaps": st.source_remaps,
                    "dest_epochs": st.dest_epochs,
                    "dest_rollovers": st.dest_rollovers,
                    "drops": st.drops.snapshot(),
                    "source_drops": relay.consumer.stats.drops.snapshot(),
                }
            )
        fwd = self.forwarder
        return {
            "instance_id": self.config.instance_id,
            "mappings": mappings,
            "forwarded": dict(fwd.forwarded) if fwd else {},
            "forward_drops": fwd.counters.snapshot() if fwd else {},
            "counters": self.counters.snapshot(),
        }

    def close(self) -> None:
        relays, self.relays = self.relays, []
        for relay in relays:
            try:
                relay.close()
            except Exception:
                log.exception("closing mapping %d failed", relay.mapping.source_stream_id)
        hub = self._conductor
        for tap, _ in self._taps:
            hub.unregister(tap)
        self._taps = []
        for pub in (self._meta_pub, self._progress_pub, self._qos_pub):
            if pub is not None:
                hub.release_publication(pub)
        self._meta_pub = self._progress_pub = self._qos_pub = None
        if self._conductor_held:
            self._conductor_held = False
            hub.release()
