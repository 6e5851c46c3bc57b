"""One client conductor per Aeron context: the control plane of all of a process's clients.

Producers, consumers and their lease machines (:class:`~tensorpool.client.driver_client.
DriverClient`) of one :class:`~tensorpool.transport.context.AeronContext` share one
:class:`ClientConductor` (per set of endpoints), as the C client shares its client conductor
(issue #28.1): one subscription to the control stream and one to the metadata stream, one
publication each for control, QoS and metadata. Every message is decoded once, here, and handed
to the clients it concerns (by stream id; the lease machine then checks correlation, lease and
client ids), instead of each client decoding every message of the shared streams again. The
descriptor stream (the data path) stays each client's own.

Driving: any client's ``poll``/``do_work`` calls :meth:`ClientConductor.poll`, so the public
API and its blocking and non-blocking behaviour are what they were; an owner with a duty cycle
of its own may call :meth:`poll` from it as well.

Threads (the rule): a client is used from one thread at a time, as before; different clients
of one process may run on different threads (the Spark keeper thread and the plan thread).
The conductor's lock serialises polling and (un)registration; a thread that finds another one
polling skips its turn (that thread delivers). Dispatch only appends a decoded message, over its
own copy of the bytes and never changed afterwards, to the recipient's :class:`Inbox`; the
recipient drains its inbox on the thread that polls it, so a client's state is only ever touched
by its own thread. The shared publications are Aeron concurrent publications (thread-safe
offers). A client that is not polled keeps at most :data:`INBOX_LIMIT` messages; more are
dropped and counted (``inbox_full``).
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
from tensorpool.transport.context import AeronContext
from tensorpool.transport.publication import Publisher

WIRE_SCHEMA: Final = wire.SCHEMA_ID
DRIVER_SCHEMA: Final = dp.SCHEMA_ID
_OTHER_TENSORPOOL_SCHEMAS: Final = frozenset({DRIVER_SCHEMA, bridge_schema.SCHEMA_ID})

INBOX_LIMIT: Final = 4096
"""Messages kept for a client that is not polled (a few minutes of announces at 8 streams)."""

_DRAIN_ROUNDS: Final = 8
"""Control-stream polls per :meth:`ClientConductor.poll` while they come back full, so
announces are never read stale after a pause (bounded: the caller's duty cycle goes on)."""

_FRAGMENT_LIMIT: Final = 64


class Inbox:
    """Decoded messages for one client, in arrival order; drained by the client's own thread.

    Items: ``(decoder, join_time_ns)`` for a message (the join time of the image that carried
    it for an announce, None otherwise), ``(reason, None)`` for one that could not be decoded
    (the recipient counts it as before, in its own stats).
    """

    __slots__ = ("items", "registered_ns")

    def __init__(self, registered_ns: int) -> None:
        self.items: deque[tuple[Any, int | None]] = deque()
        self.registered_ns = registered_ns
        """When the client registered: its join time floor (it saw nothing before, §10.1.1)."""

    def drain(self) -> list[tuple[Any, int | None]]:
        items = self.items
        out = []
        while items:
            out.append(items.popleft())
        return out


class ClientConductor:
    """The shared control-plane subscriptions and publications of one context and endpoints."""

    def __init__(self, ctx: AeronContext, endpoints: Endpoints) -> None:
        self.ctx = ctx
        self.endpoints = endpoints
        self._lock = threading.Lock()
        self._refs = 0
        e = endpoints
        # shared publications: any client's thread may offer (under the publisher's lock), and
        # the log stays this process's own, as each client's exclusive one was before
        self.control_pub: Publisher = ctx.add_publication(
            e.control_channel, e.control_stream_id, shared=True
        )
        self.qos_pub: Publisher = ctx.add_publication(e.qos_channel, e.qos_stream_id, shared=True)
        self.meta_pub: Publisher = ctx.add_publication(
            e.metadata_channel, e.metadata_stream_id, shared=True
        )
        self._sub_control = ctx.add_subscription(
            e.control_channel, e.control_stream_id, self._on_control, fragment_limit=_FRAGMENT_LIMIT
        )
        self._sub_meta = ctx.add_subscription(
            e.metadata_channel,
            e.metadata_stream_id,
            self._on_metadata,
            fragment_limit=_FRAGMENT_LIMIT,
        )
        # recipients by stream id; lists are replaced (never changed in place) under the lock
        self._consumers: dict[int, tuple[Inbox, ...]] = {}
        self._producers: dict[int, tuple[Inbox, ...]] = {}
        self._leases: dict[int, tuple[Inbox, ...]] = {}
        self.counters: dict[str, int] = {"decoded": 0, "dispatched": 0, "polls": 0}
        """``decoded``: messages decoded (each once); ``dispatched``: inbox deliveries;
        drop reasons (``inbox_full``, codec reasons) by name."""

    # --- sharing -----------------------------------------------------------------------------
    @classmethod
    def acquire(cls, ctx: AeronContext, endpoints: Endpoints) -> ClientConductor:
        """The conductor of ``ctx`` for ``endpoints``, made on first use; pair with
        :meth:`release`. Its resources close when the last holder releases it (or with ctx)."""
        key = endpoints.endpoints
        with _REGISTRY_LOCK:
            by_endpoints = _REGISTRY.setdefault(ctx, {})
            conductor = by_endpoints.get(key)
            if conductor is None:
                conductor = by_endpoints[key] = cls(ctx, key)
            conductor._refs += 1
            return conductor

    def release(self) -> None:
        with _REGISTRY_LOCK:
            self._refs -= 1
            if self._refs > 0:
                return
            by_endpoints = _REGISTRY.get(self.ctx)
            if by_endpoints is not None and by_endpoints.get(self.endpoints) is self:
                del by_endpoints[self.endpoints]
        with self._lock:
            for res in (
                self._sub_control,
                self._sub_meta,
                self.control_pub,
                self.qos_pub,
                self.meta_pub,
            ):
                self.ctx.release(res)

    @property
    def holders(self) -> int:
        return self._refs

    # --- registration ------------------------------------------------------------------------
    def register_consumer(self, stream_id: int) -> Inbox:
        return self._register(self._consumers, stream_id)

    def register_producer(self, stream_id: int) -> Inbox:
        return self._register(self._producers, stream_id)

    def register_lease(self, stream_id: int) -> Inbox:
        """For a lease machine (driver mode): the driver's messages of its stream, and those
        that name no stream (attach and detach responses, shutdown notices)."""
        return self._register(self._leases, stream_id)

    def _register(self, table: dict[int, tuple[Inbox, ...]], stream_id: int) -> Inbox:
        inbox = Inbox(self.ctx.clock())
        with self._lock:
            table[stream_id] = (*table.get(stream_id, ()), inbox)
        return inbox

    def unregister(self, inbox: Inbox) -> None:
        with self._lock:
            for table in (self._consumers, self._producers, self._leases):
                for stream_id, inboxes in list(table.items()):
                    if inbox in inboxes:
                        rest = tuple(i for i in inboxes if i is not inbox)
                        if rest:
                            table[stream_id] = rest
                        else:
                            del table[stream_id]

    # --- the duty cycle ----------------------------------------------------------------------
    def poll(self, now: int | None = None) -> int:
        """Poll the shared streams once and dispatch what arrived; return messages polled.

        Non-blocking: if another thread is polling, returns 0 at once (it delivers)."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            self.counters["polls"] += 1
            self.ctx.maintain(now)  # notices a lost media driver and reconnects (#13.2)
            work = 0
            for _ in range(_DRAIN_ROUNDS):
                n = self._sub_control.poll()
                work += n
                if n < _FRAGMENT_LIMIT:
                    break
            return work + self._sub_meta.poll()
        finally:
            self._lock.release()

    # --- dispatch (under the lock, on the polling thread) ------------------------------------
    def _count(self, reason: str) -> None:
        self.counters[reason] = self.counters.get(reason, 0) + 1

    def _deliver(self, inboxes: tuple[Inbox, ...], item: tuple[Any, int | None]) -> None:
        for inbox in inboxes:
            if len(inbox.items) >= INBOX_LIMIT:
                self._count("inbox_full")
                continue
            inbox.items.append(item)
            self.counters["dispatched"] += 1

    def _all(self, table: dict[int, tuple[Inbox, ...]]) -> tuple[Inbox, ...]:
        return tuple(i for inboxes in table.values() for i in inboxes)

    def _on_control(self, buffer: object, header: object) -> None:
        try:
            schema_id = peek_header(buffer)[2]  # type: ignore[arg-type]
        except CodecError as exc:
            self._count(exc.reason)
            self._deliver(self._all(self._consumers) + self._all(self._leases), (exc.reason, None))
            return
        if schema_id == WIRE_SCHEMA:
            if not self._consumers and not self._producers:
                return
        elif schema_id == DRIVER_SCHEMA:
            if not self._leases:
                return
        else:
            if schema_id not in _OTHER_TENSORPOOL_SCHEMAS:
                self._count("unknown_schema_id")
                self._deliver(self._all(self._consumers), ("unknown_schema_id", None))
            return  # bridge traffic on a shared control stream is no client's
        try:
            dec = decode_any(bytes(buffer))  # type: ignore[call-overload]
        except CodecError as exc:
            self._count(exc.reason)
            recipients = self._consumers if schema_id == WIRE_SCHEMA else self._leases
            self._deliver(self._all(recipients), (exc.reason, None))
            return
        self.counters["decoded"] += 1
        if schema_id == DRIVER_SCHEMA:
            item: tuple[Any, int | None] = (dec, None)
            stream_id = getattr(dec, "stream_id", None)
            if isinstance(dec, dp.ShmLeaseRevokedDecoder):
                self._deliver(self._leases.get(stream_id, ()), item)  # type: ignore[arg-type]
            else:  # responses (matched by correlation id) and shutdown notices: everyone
                self._deliver(self._all(self._leases), item)
            return
        try:
            stream_id = dec.stream_id
        except CodecError as exc:
            self._count(exc.reason)
            return
        if isinstance(dec, wire.ShmPoolAnnounceDecoder):
            # the image's join time, fixed on this (the polling) thread; each consumer takes
            # the later of it and its own registration (it saw nothing before, §10.1.1)
            join = self._sub_control.join_time_ns(header.session_id)  # type: ignore[attr-defined]
            item = (dec, join)
            self._deliver(self._consumers.get(stream_id, ()), item)
            self._deliver(self._producers.get(stream_id, ()), item)
        elif isinstance(dec, wire.ConsumerHelloDecoder):
            self._deliver(self._producers.get(stream_id, ()), (dec, None))
        elif isinstance(dec, (wire.ConsumerConfigDecoder, wire.FrameProgressDecoder)):
            # producers too: in driver mode the driver assigns per-consumer streams (§10.1.3)
            self._deliver(self._consumers.get(stream_id, ()), (dec, None))
            self._deliver(self._producers.get(stream_id, ()), (dec, None))

    def _on_metadata(self, buffer: object, header: object) -> None:
        if not self._consumers:
            return
        try:
            dec = decode_any(bytes(buffer))  # type: ignore[call-overload]
            stream_id = dec.stream_id
        except CodecError as exc:
            self._count(exc.reason)
            self._deliver(self._all(self._consumers), (exc.reason, None))
            return
        self.counters["decoded"] += 1
        self._deliver(self._consumers.get(stream_id, ()), (dec, None))


_REGISTRY_LOCK: Final = threading.Lock()
_REGISTRY: weakref.WeakKeyDictionary[AeronContext, dict[Endpoints, ClientConductor]] = (
    weakref.WeakKeyDictionary()
)
