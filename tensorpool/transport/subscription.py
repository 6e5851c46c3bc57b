"""Subscribing: whole messages to a handler, publisher arrivals/departures as events.

Model: an Aeron subscription has one *image* per publisher session it receives. ``poll`` hands
messages from all images to a fragment handler ``handler(buffer, header)``:

- ``buffer`` is a ``pyaeron.BufferView`` aliasing the log buffer: zero copy, supports the buffer
  protocol (``memoryview(buffer)``, ``struct.unpack_from(fmt, buffer, off)``, numpy
  ``frombuffer``), and is **valid only during the call**. pyaeron raises ``ValueError`` if the
  view itself is used afterwards, but a ``memoryview`` taken from it during the call keeps
  pointing into the log and silently reads whatever overwrites it later. Copy
  (``bytes(buffer)``) anything that must outlive the handler.
- ``header`` is a ``pyaeron.Header`` (``session_id``, ``stream_id``, ``position``, ``flags``,
  ``reserved_value``...), also only valid during the call.

Messages larger than the MTU arrive in fragments; pyaeron reassembles them in C
(``aeron_fragment_assembler_t``, per session) when ``assemble=True`` (the default here), so the
handler always sees one whole message. The return value of :meth:`Subscriber.poll` counts
*fragments* consumed, not messages, and ``fragment_limit`` bounds fragments per poll.

Handler exceptions: if a handler raises inside pyaeron's poll, pyaeron still consumes the rest of
that poll's batch without delivering it (verified: up to ``fragment_limit - 1`` messages lost
silently). So by default (``guard=True``) each call is wrapped: an exception is counted in
``handler_errors``, logged (at exponentially spaced counts, so a poison stream cannot flood the
log), and the poll continues with the next message. ``guard=False`` skips the wrapper (one extra
Python call, ~70-100 ns per message here) for handlers that cannot raise.

Images and join time (Wire Spec §10.1.1): ``join_time_ns`` is the local monotonic time at which the
image carrying a publisher's messages became available. pyaeron calls the image callbacks on the
Aeron client conductor thread, not the polling thread, and the C client adds the new image to the
subscription *before* running the callback (``aeron_client_conductor.c``), so a message can be
polled before its image's callback ran. :meth:`Subscriber.join_time_ns` therefore fixes the join
time at whichever comes first: the callback, or the first query for that session; both threads use
one ``dict.setdefault`` so they agree on a single value. Image events are also queued
(:meth:`Subscriber.take_image_events`) so an agent can apply them on its own thread; optional user
callbacks receive the same events on the conductor thread.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

import pyaeron

from tensorpool.transport.clock import NanoClock, now_ns

log = logging.getLogger(__name__)

FragmentHandler = Callable[[pyaeron.BufferView, pyaeron.Header], object]
"""``handler(buffer, header)``; the return value is ignored."""

DEFAULT_FRAGMENT_LIMIT: Final = 10
IMAGE_EVENT_QUEUE_LENGTH: Final = 1024


class ImageEventKind(enum.IntEnum):
    AVAILABLE = 1
    UNAVAILABLE = 2


@dataclass(frozen=True, slots=True)
class ImageEvent:
    """A publisher session appeared on, or left, a subscription."""

    kind: ImageEventKind
    session_id: int
    stream_id: int
    source_identity: str
    timestamp_ns: int
    """AVAILABLE: the join time; UNAVAILABLE: when the image went away (local monotonic)."""
    position: int


ImageCallback = Callable[[ImageEvent], object]


class SubscriberCounters:
    __slots__ = (
        "fragments",
        "handler_errors",
        "image_events_dropped",
        "images_available",
        "images_unavailable",
    )

    def __init__(self) -> None:
        self.fragments = 0
        self.handler_errors = 0
        self.images_available = 0
        self.images_unavailable = 0
        self.image_events_dropped = 0
        """Events pushed out of the bounded queue because nobody took them."""

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"SubscriberCounters({self.snapshot()!r})"


def _is_log_worthy(count: int) -> bool:
    """1, 2, 4, 8, ...: enough to notice a problem, bounded under a flood."""
    return count & (count - 1) == 0


class Subscriber:
    """One Aeron subscription with a bound handler, image tracking and counted errors.

    Not thread-safe for polling (neither is the Aeron subscription): poll from one thread.
    """

    __slots__ = (
        "_assemble",
        "_clock",
        "_events",
        "_handler",
        "_join_ns",
        "_poll",
        "_sub",
        "_user_available",
        "_user_unavailable",
        "channel",
        "counters",
        "fragment_limit",
        "stream_id",
    )

    def __init__(
        self,
        aeron: pyaeron.Aeron,
        channel: str,
        stream_id: int,
        handler: FragmentHandler,
        *,
        fragment_limit: int = DEFAULT_FRAGMENT_LIMIT,
        assemble: bool = True,
        guard: bool = True,
        clock: NanoClock = now_ns,
        on_image_available: ImageCallback | None = None,
        on_image_unavailable: ImageCallback | None = None,
    ) -> None:
        if fragment_limit <= 0:
            raise ValueError(f"fragment_limit must be > 0, got {fragment_limit}")
        self.channel = channel
        self.stream_id = stream_id
        self.fragment_limit = fragment_limit
        self.counters = SubscriberCounters()
        self._assemble = assemble
        self._clock = clock
        self._join_ns: dict[int, int] = {}
        self._events: deque[ImageEvent] = deque(maxlen=IMAGE_EVENT_QUEUE_LENGTH)
        self._user_available = on_image_available
        self._user_unavailable = on_image_unavailable
        self._handler = self._guarded(handler) if guard else handler
        # Everything the image callbacks touch exists before the subscription does: the
        # conductor thread may call them as soon as add_subscription registers it.
        self._sub = aeron.add_subscription(
            channel,
            stream_id,
            available_image=self._on_available_image,
            unavailable_image=self._on_unavailable_image,
        )
        self._poll = self._sub.poll

    def _guarded(self, handler: FragmentHandler) -> FragmentHandler:
        counters = self.counters
        channel = self.channel
        stream_id = self.stream_id

        def guarded(buffer: pyaeron.BufferView, header: pyaeron.Header) -> None:
            try:
                handler(buffer, header)
            except Exception:
                counters.handler_errors += 1
                if _is_log_worthy(counters.handler_errors):
                    log.exception(
                        "fragment handler failed on %s stream %d (%d failures so far)",
                        channel,
                        stream_id,
                        counters.handler_errors,
                    )

        return guarded

    # -- hot path -------------------------------------------------------------------------

    def poll(self, fragment_limit: int = 0) -> int:
        """Deliver up to ``fragment_limit`` fragments (default: the configured limit)."""
        if self._assemble:
            n: int = self._poll(self._handler, fragment_limit or self.fragment_limit)
        else:
            n = self._poll(self._handler, fragment_limit or self.fragment_limit, assemble=False)
        self.counters.fragments += n
        return n

    def poll_with(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Like :meth:`poll` with another handler for this call (unguarded, assembled): a
        batch reader records descriptors with a tiny handler instead of the per-message one."""
        n: int = self._poll(handler, fragment_limit)
        self.counters.fragments += n
        return n

    # -- images ---------------------------------------------------------------------------

    def _push(self, event: ImageEvent) -> None:
        events = self._events
        if len(events) == events.maxlen:
            self.counters.image_events_dropped += 1
        events.append(event)

    def _on_available_image(self, _sub: pyaeron.Subscription, image: pyaeron.Image) -> None:
        try:
            session_id = image.session_id
            joined = self._join_ns.setdefault(session_id, self._clock())
            event = ImageEvent(
                ImageEventKind.AVAILABLE,
                session_id,
                self.stream_id,
                image.source_identity,
                joined,
                image.position,
            )
            self.counters.images_available += 1
            self._push(event)
            if self._user_available is not None:
                self._user_available(event)
        except Exception:
            log.exception("image-available handling failed on %s", self.channel)

    def _on_unavailable_image(self, _sub: pyaeron.Subscription, image: pyaeron.Image) -> None:
        try:
            session_id = image.session_id
            self._join_ns.pop(session_id, None)
            event = ImageEvent(
                ImageEventKind.UNAVAILABLE,
                session_id,
                self.stream_id,
                image.source_identity,
                self._clock(),
                image.position,
            )
            self.counters.images_unavailable += 1
            self._push(event)
            if self._user_unavailable is not None:
                self._user_unavailable(event)
        except Exception:
            log.exception("image-unavailable handling failed on %s", self.channel)

    def join_time_ns(self, session_id: int) -> int:
        """When ``session_id``'s image became available here (§10.1.1 ``join_time_ns``).

        If the image callback has not run yet (the message raced it), the join time is fixed
        now, and the callback will report this same value. For a session with no image (gone,
        or never here) the current time is returned and nothing is remembered.
        """
        join = self._join_ns.get(session_id)
        if join is None:
            now = self._clock()
            if self._sub.image_by_session_id(session_id) is None:
                return now  # departed or unknown session: nothing to remember
            join = self._join_ns.setdefault(session_id, now)
        return join

    def known_sessions(self) -> dict[int, int]:
        """Session id -> join time for images currently available."""
        return dict(self._join_ns)

    def take_image_events(self) -> list[ImageEvent]:
        """Image events since the last call, oldest first (call from the polling thread)."""
        events = self._events
        taken: list[ImageEvent] = []
        while events:
            taken.append(events.popleft())
        return taken

    # -- state ----------------------------------------------------------------------------

    @property
    def subscription(self) -> pyaeron.Subscription:
        return self._sub

    @property
    def is_connected(self) -> bool:
        return bool(self._sub.is_connected)

    @property
    def image_count(self) -> int:
        return int(self._sub.image_count)

    @property
    def is_closed(self) -> bool:
        return bool(self._sub.is_closed)

    def close(self) -> None:
        """Close the subscription (idempotent)."""
        with contextlib.suppress(pyaeron.ResourceClosed):
            self._sub.close()

    def rebind(self, aeron: pyaeron.Aeron) -> None:
        """Re-create this subscription on a new Aeron client (same channel, stream, handler).

        Called by the owning context after its media driver was replaced. The old images went
        with the old driver: their join times are forgotten, and new images report themselves
        through the usual callbacks. Closing the dead client's subscription is best effort.
        """
        with contextlib.suppress(Exception):
            self._sub.close()
        self._join_ns.clear()
        self._sub = aeron.add_subscription(
            self.channel,
            self.stream_id,
            available_image=self._on_available_image,
            unavailable_image=self._on_unavailable_image,
        )
        self._poll = self._sub.poll

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
