"""Publishing with back-pressure handling that never blocks and always says why it failed.

Model: an Aeron offer either appends the message or fails for a reason. Retryable reasons come
back from pyaeron as falsy ``OfferCode`` singletons; terminal ones are raised:

- ``BACK_PRESSURED``: the slowest subscriber is a whole term window behind. Retrying at once
  rarely helps, so :meth:`Publisher.offer` returns False and the caller decides (tensorpool's
  producers drop the descriptor and count it; the wire spec has no producer back-pressure).
- ``NOT_CONNECTED``: nobody subscribes. The message would go nowhere; return False at once.
- ``ADMIN_ACTION``: the log rotated to a new term under us. An immediate retry normally
  succeeds, so it is retried a bounded number of times (never an unbounded spin).
- ``PublicationClosed`` / ``ResourceClosed`` / ``MaxPositionExceeded``: the publication is dead
  for good; counted, and offer returns False so a duty cycle carries on (the owner decides
  whether to re-create it).

Every outcome is counted in :class:`OfferCounters` under a stable name, for QoS and ``inspect``.

Copying: pyaeron offers ``bytes``, ``bytearray`` and C-contiguous ``memoryview`` without copying
them (the only copy is into the log), and ``offset``/``length`` select a slice of a reusable
scratch buffer without building a new view. Cost on this host: raw pyaeron offer ~180 ns, this
wrapper ~300 ns; passing ``offset``/``length`` adds ~100-200 ns (pyaeron takes them as keywords),
so a fixed-size message is cheapest offered as a buffer (or memoryview) of exactly its length.

:meth:`Publisher.try_claim` lets a message be encoded straight into the log instead (single fragment
only, i.e. at most ``max_payload_length`` bytes). Measured on this project's 2-core host: for a
32-byte message, encode-into-scratch then ``offer`` and claim+write+commit run at the same rate; at
256-1344 bytes the claim path was ~15-30 % faster because it skips the scratch copy. Above one MTU
only ``offer`` works.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Buffer
from types import TracebackType
from typing import Final, Self

import pyaeron

from tensorpool.transport.channels import channel_term_length, max_message_length

_BACK_PRESSURED: Final = pyaeron.BACK_PRESSURED
_NOT_CONNECTED: Final = pyaeron.NOT_CONNECTED
_ADMIN_ACTION: Final = pyaeron.ADMIN_ACTION
_CLOSED_ERRORS: Final = (pyaeron.PublicationClosed, pyaeron.ResourceClosed)
_MaxPositionExceeded: Final = pyaeron.MaxPositionExceeded
_AeronError: Final = pyaeron.AeronError

DEFAULT_ADMIN_ACTION_RETRIES: Final = 3


class OfferRejected(ValueError):
    """Aeron refused the message itself (e.g. longer than the publication's maximum)."""


class OfferCounters:
    """Offer outcomes by reason. Plain int attributes: one store per offer on the hot path."""

    __slots__ = (
        "admin_action",
        "back_pressured",
        "closed",
        "max_position_exceeded",
        "not_connected",
        "ok",
        "rejected",
    )

    REASONS: Final = (
        "ok",
        "back_pressured",
        "not_connected",
        "admin_action",
        "closed",
        "max_position_exceeded",
        "rejected",
    )

    def __init__(self) -> None:
        self.ok = 0
        self.back_pressured = 0
        self.not_connected = 0
        self.admin_action = 0
        """Every ADMIN_ACTION seen, including ones a retry then got past."""
        self.closed = 0
        self.max_position_exceeded = 0
        self.rejected = 0

    @property
    def failed(self) -> int:
        """Offers that returned False (ADMIN_ACTION counts only when retries ran out)."""
        return self.back_pressured + self.not_connected + self.closed + self.max_position_exceeded

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.REASONS}

    def __repr__(self) -> str:
        return f"OfferCounters({self.snapshot()!r})"


type AnyPublication = pyaeron.Publication | pyaeron.ExclusivePublication


class Publisher:
    """One Aeron publication with counted, bounded, non-blocking offers.

    Prefer ``exclusive=True`` publications (created by the context by default): tensorpool's
    writers are single threaded, and exclusive publications skip the concurrent-claim atomics.
    An exclusive publication must only be used from one thread at a time.
    """

    __slots__ = (
        "_offer",
        "_pub",
        "_try_claim",
        "admin_action_retries",
        "channel",
        "counters",
        "exclusive",
        "session_id",
        "stream_id",
    )

    def __init__(
        self,
        publication: AnyPublication,
        *,
        admin_action_retries: int = DEFAULT_ADMIN_ACTION_RETRIES,
    ) -> None:
        if admin_action_retries < 0:
            raise ValueError(f"admin_action_retries must be >= 0, got {admin_action_retries}")
        self._pub = publication
        self._offer = publication.offer
        self._try_claim = publication.try_claim
        self.admin_action_retries = admin_action_retries
        self.counters = OfferCounters()
        self.exclusive = isinstance(publication, pyaeron.ExclusivePublication)
        self.channel: str = publication.channel
        self.stream_id: int = publication.stream_id
        self.session_id: int = publication.session_id

    # -- hot path -------------------------------------------------------------------------

    def offer(self, buf: Buffer, offset: int = 0, length: int | None = None) -> bool:
        """Append ``buf[offset:offset+length]`` as one message; True if appended.

        Never blocks. On False the reason is in :attr:`counters`. Raises OfferRejected if the
        message is too long for this publication (a caller bug, not a transient state).
        """
        try:
            if length is None and not offset:
                result = self._offer(buf)  # positional call: ~150 ns cheaper than keywords
            else:
                result = self._offer(buf, offset=offset, length=length)
        except _CLOSED_ERRORS:
            self.counters.closed += 1
            return False
        except _MaxPositionExceeded:
            self.counters.max_position_exceeded += 1
            return False
        except _AeronError as exc:
            self.counters.rejected += 1
            raise OfferRejected(self._rejection(exc, buf, offset, length)) from exc
        if result is True:
            self.counters.ok += 1
            return True
        return self._offer_failed(result, buf, offset, length)

    def _offer_failed(self, result: object, buf: Buffer, offset: int, length: int | None) -> bool:
        counters = self.counters
        retries = self.admin_action_retries
        while result is _ADMIN_ACTION:
            counters.admin_action += 1
            if retries == 0:
                return False
            retries -= 1
            try:
                result = self._offer(buf, offset=offset, length=length)
            except _CLOSED_ERRORS:
                counters.closed += 1
                return False
            except _MaxPositionExceeded:
                counters.max_position_exceeded += 1
                return False
            if result is True:
                counters.ok += 1
                return True
        if result is _BACK_PRESSURED:
            counters.back_pressured += 1
        elif result is _NOT_CONNECTED:
            counters.not_connected += 1
        else:  # pragma: no cover - pyaeron documents only the three codes above
            raise TypeError(f"unexpected offer result {result!r}")
        return False

    def try_claim(self, length: int) -> pyaeron.BufferClaim | None:
        """Reserve ``length`` bytes in the log to encode into directly; None on failure.

        Write through ``claim.buffer`` (a writable memoryview over the log) and then
        ``claim.commit()``, or ``claim.abort()``; ``with claim:`` commits on success and aborts
        on an exception. A claim never committed is aborted when garbage-collected, but until
        then it stalls subscribers, so commit promptly. Only single-fragment messages
        (``length <= max_payload_length``) can be claimed.
        """
        counters = self.counters
        retries = self.admin_action_retries
        while True:
            try:
                result = self._try_claim(length)
            except _CLOSED_ERRORS:
                counters.closed += 1
                return None
            except _MaxPositionExceeded:
                counters.max_position_exceeded += 1
                return None
            except _AeronError as exc:
                counters.rejected += 1
                raise OfferRejected(f"claim of {length} bytes refused: {exc}") from exc
            if result.__class__ is pyaeron.BufferClaim:
                counters.ok += 1
                return result  # type: ignore[return-value]
            if result is _ADMIN_ACTION:
                counters.admin_action += 1
                if retries == 0:
                    return None
                retries -= 1
                continue
            if result is _BACK_PRESSURED:
                counters.back_pressured += 1
            elif result is _NOT_CONNECTED:
                counters.not_connected += 1
            else:  # pragma: no cover
                raise TypeError(f"unexpected try_claim result {result!r}")
            return None

    # -- state ----------------------------------------------------------------------------

    def _rejection(self, exc: Exception, buf: Buffer, offset: int, length: int | None) -> str:
        if length is None:
            length = memoryview(buf).nbytes - offset
        limit = self.max_message_length
        bound = f" (max_message_length={limit})" if limit is not None else ""
        return f"message of {length} bytes refused by {self.channel}{bound}: {exc}"

    @property
    def publication(self) -> AnyPublication:
        return self._pub

    @property
    def is_connected(self) -> bool:
        return bool(self._pub.is_connected)

    @property
    def is_closed(self) -> bool:
        return bool(self._pub.is_closed)

    @property
    def position(self) -> int:
        return int(self._pub.position)

    @property
    def max_message_length(self) -> int | None:
        """Largest message ``offer`` accepts; None if it cannot be known here.

        Concurrent publications report it; for exclusive ones it follows from the channel's
        ``term-length`` (unknown when the channel relies on the driver's default).
        """
        value = getattr(self._pub, "max_message_length", None)
        if value is not None:
            return int(value)
        term_length = channel_term_length(self.channel)
        return None if term_length is None else max_message_length(term_length)

    def await_connected(self, timeout_s: float | None = None) -> bool:
        """Wait (GIL released) until a subscriber is connected; False on timeout."""
        try:
            self._pub.await_connected(timeout=timeout_s)
        except pyaeron.DriverTimeout:
            return False
        return bool(self._pub.is_connected)

    def close(self) -> None:
        """Close the publication (idempotent)."""
        with contextlib.suppress(pyaeron.ResourceClosed):
            self._pub.close()

    def rebind(self, aeron: pyaeron.Aeron) -> None:
        """Re-create this publication on a new Aeron client (same channel, stream, kind).

        Called by the owning context after its media driver was replaced, so that holders of
        this Publisher (and of its bound ``offer``) keep working without rebuilding anything.
        The old publication belonged to a dead client: closing it is best effort.
        """
        with contextlib.suppress(Exception):
            self._pub.close()
        if self.exclusive:
            pub: AnyPublication = aeron.add_exclusive_publication(self.channel, self.stream_id)
        else:
            pub = aeron.add_publication(self.channel, self.stream_id)
        self._pub = pub
        self._offer = pub.offer
        self._try_claim = pub.try_claim
        self.session_id = pub.session_id

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SharedPublisher(Publisher):
    """An exclusive publication that several threads of one process offer on, under a lock.

    The client conductor's control, QoS and metadata publications are offered on by every
    client of the process, from their own threads. A concurrent Aeron publication would be
    thread safe, but Aeron shares its log with every client of the media driver that adds the
    same channel and stream: two processes that spell the channel's parameters differently
    (``term-length``) then refuse each other ("existing publication has different
    'term-length'"). An exclusive publication keeps each process's log its own, as before the
    conductor; the lock supplies the thread safety. Offers only: a claim would hold the log
    past the lock.
    """

    __slots__ = ("_lock",)

    def __init__(
        self,
        publication: AnyPublication,
        *,
        admin_action_retries: int = DEFAULT_ADMIN_ACTION_RETRIES,
    ) -> None:
        super().__init__(publication, admin_action_retries=admin_action_retries)
        self._lock = threading.Lock()

    def offer(self, buf: Buffer, offset: int = 0, length: int | None = None) -> bool:
        with self._lock:
            return super().offer(buf, offset, length)

    def try_claim(self, length: int) -> pyaeron.BufferClaim | None:
        raise TypeError("a shared publication is offered on, never claimed")

    def rebind(self, aeron: pyaeron.Aeron) -> None:
        with self._lock:
            super().rebind(aeron)
