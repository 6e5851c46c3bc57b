"""Stream discovery: ``streams="*"`` / ``"lo-hi"`` (#16.4, like Kafka's ``subscribePattern``).

Producers (and the SHM driver, for driver-managed streams) announce every stream on the
control channel (``ShmPoolAnnounce``, about once per announce period). A
:class:`StreamDiscovery` subscribes to that channel and collects the stream ids announced in
the query's range. The streaming reader asks it for new ids at every ``latestOffset`` and
grows the query's stream set: a stream that appears later joins from its earliest frame, and
its offset entry is added to the next offset (the checkpoint accepts the grown set, see
:func:`tensorpool.spark_source.plan.offsets.grow_offsets`). A discovered stream is never dropped
(like a Kafka partition): a producer that goes away just leaves its stream without new data.

Discovery cannot ask for announces (``ConsumerHello`` names one stream id), so the first
collection waits one announce period: :func:`announce_period_s`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from tensorpool.client.conductor import ContextConductor
from tensorpool.spark_source.options import SourceOptions
from tensorpool.specs.generated import wire
from tensorpool.transport.context import AeronContext, release_shared_context, shared_context

if TYPE_CHECKING:
    from tensorpool.spark_source.rings.probe import AnnounceProbe

log = logging.getLogger(__name__)

#: added to the announce period when waiting for the first announces (delivery, scheduling)
WAIT_SLACK_S: Final = 0.2


def announce_period_s(freshness_ms: int) -> float:
    """The producers' announce period implied by ``freshnessMs`` (3 periods), in seconds."""
    return max(0.01, freshness_ms / 3000)


class StreamDiscovery:
    """Stream ids in ``[lo, hi]`` announced on one control channel (thread-safe reads).

    ``poll()`` runs on the thread that polls the Aeron client (the attachment's background
    thread); ``found()`` may be called from any thread. The announces come decoded from a tap
    of ``ctx``'s conductor (#28.1: the process's one control subscription), not a subscription
    of its own; the tap goes with this object (:meth:`close`, or when it is collected).
    """

    def __init__(self, ctx: AeronContext, channel: str, stream_id: int, pattern: tuple[int, int]):
        self.lo, self.hi = pattern
        self._found: set[int] = set()
        self._lock = threading.Lock()
        self._conductor = conductor = ContextConductor.acquire(ctx)
        self._tap = conductor.tap(channel, stream_id, (wire.ShmPoolAnnounceDecoder,))
        self._finalizer = weakref.finalize(self, _untap, conductor, self._tap)

    def close(self) -> None:
        """Stop listening (idempotent)."""
        self._finalizer()

    def _on_announce(self, dec: wire.ShmPoolAnnounceDecoder) -> None:
        sid = dec.stream_id
        if self.lo <= sid <= self.hi and sid not in self._found:
            with self._lock:
                self._found.add(sid)
            log.info("tensorpool: discovered stream %d (announced on the control channel)", sid)

    def poll(self) -> int:
        work = self._conductor.poll()
        for dec, _raw, _join in self._tap.drain():
            work += 1
            if not isinstance(dec, str):  # a damaged announce is the consumers' to count
                self._on_announce(dec)
        return work

    def found(self) -> set[int]:
        """Every stream id announced in the range so far."""
        with self._lock:
            return set(self._found)

    def wait(self, seconds: float, *, poll: bool) -> set[int]:
        """Collect for ``seconds`` (polling here when no other thread does)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not (poll and self.poll()):
                time.sleep(0.005)
        return self.found()


def discover_once(
    settings: object, pattern: tuple[int, int], freshness_ms: int, timeout_s: float
) -> tuple[int, ...]:
    """Stream ids announced in ``pattern`` within one announce period (batch reads)."""
    from tensorpool.client.settings import ClientSettings

    assert isinstance(settings, ClientSettings)
    ch = settings.channels
    ctx = shared_context(settings.transport)  # the process's one client (#28.1)
    try:
        disc = StreamDiscovery(ctx, ch.control_channel, ch.control_stream_id, pattern)
        try:
            wait = min(timeout_s, announce_period_s(freshness_ms) + WAIT_SLACK_S)
            return tuple(sorted(disc.wait(wait, poll=True)))
        finally:
            disc.close()
    finally:
        release_shared_context(ctx)


def _untap(conductor: ContextConductor, tap: object) -> None:
    conductor.unregister(tap)  # type: ignore[arg-type]
    conductor.release()


def discovered_from(probe: AnnounceProbe, opts: SourceOptions) -> SourceOptions:
    """:func:`discovered_options` through an announce probe (#15): the streams whose announces
    it received within the last announce period (plus slack), waiting for the rest of that
    period only if it has listened for less. A probe kept between plans answers at once."""
    if opts.stream_pattern is None:
        return opts
    lo, hi = opts.stream_pattern
    window = min(
        opts.connection.attach_timeout_ms / 1000,
        announce_period_s(opts.freshness_ms) + WAIT_SLACK_S,
    )
    found = probe.announced(lo, hi, window)
    if not found:
        log.warning("tensorpool: no stream in %d-%d is announced; the batch read is empty", lo, hi)
    return replace(opts, streams=found)


def discovered_options(opts: SourceOptions, settings: object) -> SourceOptions:
    """``opts`` with ``streams`` set to the streams announced now (a batch read's snapshot)."""
    if opts.stream_pattern is None:
        return opts
    timeout = opts.connection.attach_timeout_ms / 1000
    found = discover_once(settings, opts.stream_pattern, opts.freshness_ms, timeout)
    lo, hi = opts.stream_pattern
    if not found:
        log.warning("tensorpool: no stream in %d-%d is announced; the batch read is empty", lo, hi)
    return replace(opts, streams=found)


__all__ = [
    "StreamDiscovery",
    "announce_period_s",
    "discover_once",
    "discovered_from",
    "discovered_options",
]
