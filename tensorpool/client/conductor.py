"""One client conductor per Aeron context: the control plane of all of a process's clients.

Everything of a process that listens to or speaks on the shared control-plane streams goes
through the one :class:`ContextConductor` of its :class:`~tensorpool.transport.context.
AeronContext` (issue #28.1), as the C client shares its client conductor: producers, consumers
and their lease machines (:class:`~tensorpool.client.driver_client.DriverClient`), the rate
limiter's relays and forwarders, the bridge's sender and receiver, and the Spark source's
probes, discovery and metadata trackers. It holds

* one subscription per stream (a *lane*: channel and stream id), made on first use and closed
  with its last user: control, announce, QoS and metadata streams alike;
* one publication per stream (shared: offered on under a lock, see
  :class:`~tensorpool.transport.publication.SharedPublisher`).

Every message of a lane is decoded once, here, and handed to those it concerns: clients by
stream id (the lease machine then checks correlation, lease and client ids) through an
:class:`Inbox`; whole-stream listeners (forwarders, probes) by message type through a
:class:`Tap`. The descriptor stream (the data path) stays each client's own, as do the bridge's
payload streams.

:class:`ClientConductor` is a client's view of it for one set of endpoints: the control,
QoS and metadata publications and the control and metadata lanes of those endpoints (and,
for a producer, the QoS lane: its consumers' ``QosConsumer`` say they are alive, §10.1.3).

Driving: any client's ``poll``/``do_work`` (or an agent's duty cycle) calls
:meth:`ContextConductor.poll`, so the public API and its blocking and non-blocking behaviour
are what they were.

Threads (the rule): a client is used from one thread at a time, as before; different clients
of one process may run on different threads (the Spark keeper thread and the plan thread).
The conductor's lock serialises polling and (un)registration; a thread that finds another one
polling skips its turn (that thread delivers). Dispatch only appends a decoded message, over its
own copy of the bytes and never changed afterwards, to the recipient's inbox; the recipient
drains its inbox on the thread that polls it, so a client's state is only ever touched by its
own thread. A recipient that is not polled keeps at most :data:`INBOX_LIMIT` messages; more
are dropped and counted (``inbox_full``).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any, Final

from tensorpool.endpoints import Endpoints
from tensorpool.specs import CodecError, decode_any, peek_header
from tensorpool.specs.generated import bridge as bridge_schema
from tensorpool.specs.generated import driver as dp
from tensorpool.specs.generated import wire
from tensorpool.transport.channels import subscription_channel
from tensorpool.transport.context import AeronContext
from tensorpool.transport.publication import Publisher
from tensorpool.transport.subscription import Subscriber

WIRE_SCHEMA: Final = wire.SCHEMA_ID
DRIVER_SCHEMA: Final = dp.SCHEMA_ID
BRIDGE_SCHEMA: Final = bridge_schema.SCHEMA_ID

INBOX_LIMIT: Final = 4096
"""Messages kept for a recipient that is not polled (a few minutes of announces at 8 streams)."""

_DRAIN_ROUNDS: Final = 8
"""Polls of a lane per :meth:`ContextConductor.poll` while they come back full, so announces
are never read stale after a pause (bounded: the caller's duty cycle goes on)."""

_FRAGMENT_LIMIT: Final = 64

LaneKey = tuple[str, int]
"""(channel, stream id) of a shared subscription or publication."""


def lane_key(channel: str, stream_id: int) -> LaneKey:
    """The lane that receives ``channel``/``stream_id``: IPC spellings that differ only in
    publication parameters (``term-length``) share one subscription."""
    return (subscription_channel(channel), stream_id)


class Inbox:
    """Decoded messages for one client, in arrival order; drained by the client's own thread.

    Items: ``(decoder, join_time_ns)`` for a message (the join time of the image that carried
    it for an announce, None otherwise), ``(reason, None)`` for one that could not be decoded
    (the recipient counts it as before, in its own stats).
    """

    __slots__ = ("items", "registered_ns")

    def __init__(self, registered_ns: int) -> None:
        self.items: deque[Any] = deque()
        self.registered_ns = registered_ns
        """When the client registered: its join time floor (it saw nothing before, §10.1.1)."""

    def drain(self) -> list[Any]:
        items = self.items
        out = []
        while items:
            out.append(items.popleft())
        return out


class Tap(Inbox):
    """Every message of one lane whose decoder is one of ``kinds``, whatever its stream id:
    for those that watch or forward a whole stream (rate limiter, bridge, Spark probes).

    Items: ``(decoder, raw, join_time_ns)``: the decoder, the bytes it wraps (a forwarder
    re-sends or re-encodes them), the image's join time for an announce (else None); or
    ``(reason, None, None)`` for a message that could not be decoded and whose header named
    one of ``kinds`` (``all_errors``: any message of the lane that could not be decoded).
    """

    __slots__ = ("all_errors", "kinds", "lane", "templates")

    def __init__(
        self, registered_ns: int, lane: LaneKey, kinds: tuple[type, ...], all_errors: bool
    ) -> None:
        super().__init__(registered_ns)
        self.lane = lane
        self.kinds = kinds
        self.templates = frozenset((k.SCHEMA_ID, k.TEMPLATE_ID) for k in kinds)  # type: ignore[attr-defined]
        self.all_errors = all_errors


class _Lane:
    """One shared subscription and who receives what arrives on it."""

    __slots__ = ("consumers", "key", "leases", "metadata", "producers", "refs", "sub", "taps")

    def __init__(self, key: LaneKey) -> None:
        self.key = key
        self.sub: Subscriber | None = None
        self.refs = 0
        # recipients by stream id; tuples are replaced (never changed in place) under the lock
        self.consumers: dict[int, tuple[Inbox, ...]] = {}
        """Consumers of a stream whose control stream this is (announces, configs)."""
        self.metadata: dict[int, tuple[Inbox, ...]] = {}
        """Consumers of a stream whose metadata stream this is (everything else of the stream)."""
        self.producers: dict[int, tuple[Inbox, ...]] = {}
        self.leases: dict[int, tuple[Inbox, ...]] = {}
        self.taps: tuple[Tap, ...] = ()

    def tables(self) -> tuple[dict[int, tuple[Inbox, ...]], ...]:
        return (self.consumers, self.metadata, self.producers, self.leases)

    def wants(self, schema_id: int, template_id: int) -> bool:
        """Whether anyone here takes this message (else it is not decoded at all)."""
        if schema_id == WIRE_SCHEMA and (self.consumers or self.metadata or self.producers):
            return True
        if schema_id == DRIVER_SCHEMA and self.leases:
            return True
        return any((schema_id, template_id) in t.templates for t in self.taps)


def _all(table: dict[int, tuple[Inbox, ...]]) -> tuple[Inbox, ...]:
    return tuple(i for inboxes in table.values() for i in inboxes)


class ContextConductor:
    """The shared subscriptions and publications of one Aeron context (see the module)."""

    def __init__(self, ctx: AeronContext) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._refs = 0
        self._lanes: dict[LaneKey, _Lane] = {}
        self._subs: tuple[Subscriber, ...] = ()  # the lanes' subscriptions, replaced on change
        self._pubs: dict[LaneKey, list[Any]] = {}  # key -> [publisher, holders]
        self.counters: dict[str, int] = {"decoded": 0, "dispatched": 0, "polls": 0}
        """``decoded``: messages decoded (each once); ``dispatched``: inbox deliveries;
        drop reasons (``inbox_full``, codec reasons) by name."""

    @classmethod
    def acquire(cls, ctx: AeronContext) -> ContextConductor:
        """The conductor of ``ctx``, made on first use; pair with :meth:`release`."""
        with _REGISTRY_LOCK:
            conductor = _REGISTRY.get(ctx)
            if conductor is None:
                conductor = _REGISTRY[ctx] = cls(ctx)
            conductor._refs += 1
            return conductor

    def release(self) -> None:
        with _REGISTRY_LOCK:
            self._refs -= 1
            if self._refs <= 0 and _REGISTRY.get(self.ctx) is self:
                del _REGISTRY[self.ctx]

    # --- publications -------------------------------------------------------------------------
    def publication(self, channel: str, stream_id: int) -> Publisher:
        """The process's one publication on ``channel``/``stream_id``; pair with
        :meth:`release_publication`."""
        key = (channel, stream_id)
        with self._lock:
            held = self._pubs.get(key)
            if held is None:
                held = self._pubs[key] = [
                    self.ctx.add_publication(channel, stream_id, shared=True),
                    0,
                ]
            held[1] += 1
            return held[0]

    def release_publication(self, pub: Publisher) -> None:
        with self._lock:
            for key, held in list(self._pubs.items()):
                if held[0] is pub:
                    held[1] -= 1
                    if held[1] <= 0:
                        del self._pubs[key]
                        self.ctx.release(pub)
                    return

    # --- lanes and registration ---------------------------------------------------------------
    def _lane(self, key: LaneKey) -> _Lane:
        """The lane of ``key`` (a :func:`lane_key`) with one more holder (under the lock)."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = _Lane(key)
            lane.sub = self.ctx.add_subscription(
                key[0],
                key[1],
                lambda buffer, header, lane=lane: self._on_message(lane, buffer, header),
                fragment_limit=_FRAGMENT_LIMIT,
            )
            self._lanes[key] = lane
            self._subs = (*self._subs, lane.sub)
        lane.refs += 1
        return lane

    def hold_lane(self, key: LaneKey) -> None:
        """Keep ``key`` subscribed (a client view holds its control and metadata lanes from the
        start, so nothing sent after it was made is missed); pair with :meth:`drop_lane`."""
        with self._lock:
            self._lane(key)

    def drop_lane(self, key: LaneKey) -> None:
        with self._lock:
            self._drop_lane(key)

    def _drop_lane(self, key: LaneKey) -> None:
        lane = self._lanes.get(key)
        if lane is None:
            return
        lane.refs -= 1
        if lane.refs <= 0:
            del self._lanes[key]
            self._subs = tuple(s for s in self._subs if s is not lane.sub)
            assert lane.sub is not None
            self.ctx.release(lane.sub)

    def register(
        self, key: LaneKey, table: str, stream_id: int, inbox: Inbox | None = None
    ) -> Inbox:
        """A client's inbox (``inbox``, or a new one) for ``stream_id`` on lane ``key`` (a
        :func:`lane_key`; ``table``: ``consumers``, ``metadata``, ``producers`` or ``leases``)."""
        if inbox is None:
            inbox = Inbox(self.ctx.clock())
        with self._lock:
            recipients: dict[int, tuple[Inbox, ...]] = getattr(self._lane(key), table)
            recipients[stream_id] = (*recipients.get(stream_id, ()), inbox)
        return inbox

    def tap(
        self,
        channel: str,
        stream_id: int,
        kinds: tuple[type, ...],
        *,
        all_errors: bool = False,
    ) -> Tap:
        """Every message of ``kinds`` on ``channel``/``stream_id`` (the one subscription of
        the process on it); pair with :meth:`unregister`."""
        key = lane_key(channel, stream_id)
        tap = Tap(self.ctx.clock(), key, kinds, all_errors)
        with self._lock:
            lane = self._lane(key)
            lane.taps = (*lane.taps, tap)
        return tap

    def unregister(self, inbox: Inbox) -> None:
        """Stop delivering to ``inbox`` (an inbox or a tap) and drop its hold on its lane."""
        with self._lock:
            for key, lane in list(self._lanes.items()):
                if inbox in lane.taps:
                    lane.taps = tuple(t for t in lane.taps if t is not inbox)
                    self._drop_lane(key)
                    continue
                for table in lane.tables():
                    for sid, inboxes in list(table.items()):
                        if inbox in inboxes:
                            rest = tuple(i for i in inboxes if i is not inbox)
                            if rest:
                                table[sid] = rest
                            else:
                                del table[sid]
                            self._drop_lane(key)

    # --- the duty cycle -----------------------------------------------------------------------
    def poll(self, now: int | None = None) -> int:
        """Poll every lane once (a full one up to :data:`_DRAIN_ROUNDS` times) and dispatch
        what arrived; return messages polled.

        Non-blocking: if another thread is polling, returns 0 at once (it delivers)."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            self.counters["polls"] += 1
            self.ctx.maintain(now)  # notices a lost media driver and reconnects (#13.2)
            work = 0
            for sub in self._subs:
                n = sub.poll()
                work += n
                rounds = 1
                while n >= _FRAGMENT_LIMIT and rounds < _DRAIN_ROUNDS:
                    n = sub.poll()
                    work += n
                    rounds += 1
            return work
        finally:
            self._lock.release()

    # --- dispatch (under the lock, on the polling thread) -------------------------------------
    def _count(self, reason: str) -> None:
        self.counters[reason] = self.counters.get(reason, 0) + 1

    def _deliver(self, inboxes: tuple[Inbox, ...], item: tuple[Any, ...]) -> None:
        for inbox in inboxes:
            if len(inbox.items) >= INBOX_LIMIT:
                self._count("inbox_full")
                continue
            inbox.items.append(item)
            self.counters["dispatched"] += 1

    def _fail(self, lane: _Lane, reason: str, schema_id: int | None, template: int | None) -> None:
        """A message of ``lane`` that could not be decoded: counted, and told to those who
        count such drops themselves (as each did when it decoded the stream on its own)."""
        self._count(reason)
        if schema_id == DRIVER_SCHEMA:
            clients = _all(lane.leases)
        elif schema_id == WIRE_SCHEMA:
            clients = _all(lane.consumers) + _all(lane.metadata)
        else:  # no header, or a schema no client knows
            clients = _all(lane.consumers) + _all(lane.metadata)
            if schema_id is None:
                clients += _all(lane.leases)
        self._deliver(clients, (reason, None))
        taps = tuple(t for t in lane.taps if t.all_errors or (schema_id, template) in t.templates)
        self._deliver(taps, (reason, None, None))

    def _on_message(self, lane: _Lane, buffer: object, header: object) -> None:
        try:
            _bl, template_id, schema_id, _v = peek_header(buffer)  # type: ignore[arg-type]
        except CodecError as exc:
            self._fail(lane, exc.reason, None, None)
            return
        if schema_id not in (WIRE_SCHEMA, DRIVER_SCHEMA, BRIDGE_SCHEMA):
            self._fail(lane, "unknown_schema_id", schema_id, template_id)
            return
        if not lane.wants(schema_id, template_id):
            return  # e.g. bridge traffic on a shared control stream: nobody's here
        raw = bytes(buffer)  # type: ignore[call-overload]
        try:
            dec = decode_any(raw)
            stream_id = getattr(dec, "stream_id", None)
        except CodecError as exc:
            self._fail(lane, exc.reason, schema_id, template_id)
            return
        self.counters["decoded"] += 1
        join: int | None = None
        if isinstance(dec, wire.ShmPoolAnnounceDecoder):
            # the image's join time, fixed on this (the polling) thread; each consumer takes
            # the later of it and its own registration (it saw nothing before, §10.1.1)
            assert lane.sub is not None
            join = lane.sub.join_time_ns(header.session_id)  # type: ignore[attr-defined]
        for tap in lane.taps:
            if isinstance(dec, tap.kinds):
                self._deliver((tap,), (dec, raw, join))
        if schema_id == DRIVER_SCHEMA:
            if isinstance(dec, dp.ShmLeaseRevokedDecoder):
                self._deliver(lane.leases.get(stream_id, ()), (dec, None))  # type: ignore[arg-type]
            else:  # responses (matched by correlation id) and shutdown notices: everyone
                self._deliver(_all(lane.leases), (dec, None))
            return
        if schema_id != WIRE_SCHEMA or stream_id is None:
            return
        if isinstance(dec, wire.ShmPoolAnnounceDecoder):
            item = (dec, join)
            self._deliver(lane.consumers.get(stream_id, ()), item)
            self._deliver(lane.producers.get(stream_id, ()), item)
        elif isinstance(dec, wire.ConsumerHelloDecoder):
            self._deliver(lane.producers.get(stream_id, ()), (dec, None))
        elif isinstance(dec, (wire.ConsumerConfigDecoder, wire.FrameProgressDecoder)):
            # producers too: in driver mode the driver assigns per-consumer streams (§10.1.3)
            self._deliver(lane.consumers.get(stream_id, ()), (dec, None))
            self._deliver(lane.producers.get(stream_id, ()), (dec, None))
        else:
            if isinstance(dec, wire.QosConsumerDecoder):
                # a consumer's QoS keeps its per-consumer stream and progress interest (§10.1.3)
                self._deliver(lane.producers.get(stream_id, ()), (dec, None))
            self._deliver(lane.metadata.get(stream_id, ()), (dec, None))


def _shared_key(e: Endpoints) -> tuple[object, ...]:
    """What clients share: every endpoint but the descriptor stream (each client's own)."""
    return (
        e.control_channel,
        e.control_stream_id,
        e.qos_channel,
        e.qos_stream_id,
        e.metadata_channel,
        e.metadata_stream_id,
    )


class ClientConductor:
    """A client's view of its context's conductor for one set of endpoints: the control, QoS
    and metadata publications, and inboxes on the control and metadata lanes."""

    def __init__(self, hub: ContextConductor, endpoints: Endpoints) -> None:
        self.hub = hub
        self.ctx = hub.ctx
        self.endpoints = endpoints
        self._refs = 0
        e = endpoints
        self.control_lane = lane_key(e.control_channel, e.control_stream_id)
        self.metadata_lane = lane_key(e.metadata_channel, e.metadata_stream_id)
        self.qos_lane = lane_key(e.qos_channel, e.qos_stream_id)
        self.control_pub: Publisher = hub.publication(e.control_channel, e.control_stream_id)
        self.qos_pub: Publisher = hub.publication(e.qos_channel, e.qos_stream_id)
        self.meta_pub: Publisher = hub.publication(e.metadata_channel, e.metadata_stream_id)
        hub.hold_lane(self.control_lane)
        hub.hold_lane(self.metadata_lane)
        self.poll = hub.poll  # every client's poll goes here: no extra call layer

    @property
    def counters(self) -> dict[str, int]:
        return self.hub.counters

    @classmethod
    def acquire(cls, ctx: AeronContext, endpoints: Endpoints) -> ClientConductor:
        """The view of ``ctx``'s conductor for ``endpoints``, made on first use; pair with
        :meth:`release`. Its resources close when the last holder releases it (or with ctx)."""
        key = _shared_key(endpoints)
        with _REGISTRY_LOCK:
            views = _VIEWS.setdefault(ctx, {})
            view = views.get(key)
        if view is None:
            hub = ContextConductor.acquire(ctx)
            with _REGISTRY_LOCK:
                view = views.get(key)
                if view is None:
                    view = views[key] = cls(hub, endpoints.endpoints)
                else:
                    hub.release()
        with _REGISTRY_LOCK:
            view._refs += 1
        return view

    def release(self) -> None:
        with _REGISTRY_LOCK:
            self._refs -= 1
            if self._refs > 0:
                return
            views = _VIEWS.get(self.ctx)
            key = _shared_key(self.endpoints)
            if views is not None and views.get(key) is self:
                del views[key]
        hub = self.hub
        for pub in (self.control_pub, self.qos_pub, self.meta_pub):
            hub.release_publication(pub)
        hub.drop_lane(self.control_lane)
        hub.drop_lane(self.metadata_lane)
        hub.release()

    @property
    def holders(self) -> int:
        return self._refs

    def register_consumer(self, stream_id: int) -> Inbox:
        """Announces and configs of ``stream_id`` (control lane), and its metadata."""
        inbox = self.hub.register(self.control_lane, "consumers", stream_id)
        return self.hub.register(self.metadata_lane, "metadata", stream_id, inbox)

    def register_producer(self, stream_id: int) -> Inbox:
        """Announces, hellos and configs of ``stream_id`` (control lane), and its consumers'
        ``QosConsumer`` (QoS lane, subscribed while a producer holds it): the liveness that
        keeps a consumer's per-consumer stream (§10.1.3)."""
        inbox = self.hub.register(self.control_lane, "producers", stream_id)
        if self.qos_lane == self.control_lane:
            return inbox
        return self.hub.register(self.qos_lane, "producers", stream_id, inbox)

    def register_lease(self, stream_id: int) -> Inbox:
        """For a lease machine (driver mode): the driver's messages of its stream, and those
        that name no stream (attach and detach responses, shutdown notices)."""
        return self.hub.register(self.control_lane, "leases", stream_id)

    def unregister(self, inbox: Inbox) -> None:
        self.hub.unregister(inbox)


_REGISTRY_LOCK: Final = threading.RLock()
_REGISTRY: weakref.WeakKeyDictionary[AeronContext, ContextConductor] = weakref.WeakKeyDictionary()
_VIEWS: weakref.WeakKeyDictionary[AeronContext, dict[tuple[object, ...], ClientConductor]] = (
    weakref.WeakKeyDictionary()
)
