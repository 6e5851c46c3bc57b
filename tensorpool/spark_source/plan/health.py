"""Stream health in progress reports, stale-producer detection and ``minFramesPerTrigger``.

Issue #16.2 / #16.4. Everything here is sans-IO: callers pass ``now_ns`` (monotonic) and what
they scanned, so the rules are tested with a driven clock.

Where health goes (and why not into the offsets)
------------------------------------------------
Spark decides whether a micro-batch has new data by comparing the source's ``latestOffset``
with the committed offset (``MicroBatchExecution.isNewDataAvailable``: ``committed !=
available``, offsets compared by their JSON text). Lag or ages in that offset would change at
every trigger and make Spark run an empty batch each time (and write it to the offset log).
So the offsets stay as they are, and health goes into ``reportLatestOffset()``: Spark calls it
right after ``latestOffset`` at every trigger and shows it, verbatim, as
``progress["sources"][i]["latestOffset"]`` -- report only, never compared, never checkpointed.
Per stream::

    {"epoch": 3, "seq": 5400, "lag": 12, "newestFrameAgeMs": 4, "live": true,
     "announceAgeMs": 250, "noProducerMs": 0}

``seq`` is the producer's head (next seq), ``lag`` the committed frames at or after the planned
end (frames behind the head after this batch, Kafka's ``offsetsBehindLatest``),
``newestFrameAgeMs`` the age of the newest frame's timestamp on this host's wall clock,
``live`` whether a producer announces the stream now, ``announceAgeMs`` the time since the last
accepted announce, ``noProducerMs`` how long the stream has had no live producer (0 when live).
Values not known (a stream never announced) are ``null``. :func:`tensorpool.spark_source.
stream_health` / :func:`stream_lag` read them back out of a progress.

Stale streams: a stream with no live producer for ``staleStreamTimeoutMs`` fails the query
(:class:`TensorPoolStaleStreamError`) or, with ``onStaleStream=warn``, logs one warning per
episode. Its clock starts when the reader first looks at the stream (query start, or the moment
a discovered stream joined), so a query started before its producer gets the full timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tensorpool.spark_source.plan.offsets import NOT_STARTED, RingState, StreamPos

log = logging.getLogger("tensorpool.spark_source")

_MS: Final = 1_000_000


class TensorPoolStaleStreamError(RuntimeError):
    """A stream had no live producer for ``staleStreamTimeoutMs`` (``onStaleStream=fail``)."""


@dataclass(frozen=True, slots=True)
class StreamHealth:
    """One stream's health as reported in ``latestOffset`` (see the module doc)."""

    epoch: int | None
    head: int | None
    lag: int | None
    newest_frame_age_ms: int | None
    live: bool
    announce_age_ms: int | None
    no_producer_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "seq": self.head,
            "lag": self.lag,
            "newestFrameAgeMs": self.newest_frame_age_ms,
            "live": self.live,
            "announceAgeMs": self.announce_age_ms,
            "noProducerMs": self.no_producer_ms,
        }


@dataclass(frozen=True, slots=True)
class Stale:
    """A stream over the timeout: ``for_ms`` without a live producer; ``ever_live``: one was
    seen by this reader (then ``epoch`` is the last one it announced)."""

    stream_id: int
    for_ms: int
    ever_live: bool
    epoch: int | None


class HealthMonitor:
    """Per-stream liveness clocks and the last ring facts seen (sans-IO).

    ``timeout_ms`` 0 disables stale detection (health is still reported).
    """

    def __init__(self, timeout_ms: int, warn_only: bool) -> None:
        self.timeout_ns = timeout_ms * _MS
        self.warn_only = warn_only
        self._since: dict[int, int] = {}  # monotonic ns of the last live sighting (or first look)
        self._ever_live: set[int] = set()
        self._live: dict[int, bool] = {}
        self._announce_age: dict[int, int | None] = {}
        self._warned: set[int] = set()
        self._ring: dict[int, tuple[int, int, int | None]] = {}  # epoch, head, newest wall ns
        self._lag: dict[int, int | None] = {}

    # --- inputs ------------------------------------------------------------------------------
    def observe(
        self, liveness: Mapping[int, tuple[bool, int | None]], streams: Iterable[int], now_ns: int
    ) -> None:
        """Fold one liveness sample (:meth:`Attachment.liveness`) of ``streams`` in."""
        for sid in streams:
            live, announce_age = liveness.get(sid, (False, None))
            self._since.setdefault(sid, now_ns)
            self._live[sid] = live
            self._announce_age[sid] = announce_age
            if live:
                self._since[sid] = now_ns
                self._ever_live.add(sid)
                self._warned.discard(sid)

    def observe_ring(
        self, sid: int, state: RingState | None, newest_wall_ns: int | None, end: StreamPos | None
    ) -> None:
        """The ring as planned: head, newest frame, and lag behind the planned ``end``."""
        if state is not None and not state.empty:
            self._ring[sid] = (state.epoch, state.head, newest_wall_ns)
        elif state is not None:
            self._ring[sid] = (state.epoch, state.head, self._ring.get(sid, (0, 0, None))[2])
        self._lag[sid] = lag_of(state, end) if state is not None else self._stale_lag(sid, end)

    def _stale_lag(self, sid: int, end: StreamPos | None) -> int | None:
        ring = self._ring.get(sid)
        if ring is None or end is None:
            return None
        epoch, head, _ = ring
        if end.epoch == epoch:
            return max(0, head - end.seq)
        return None

    # --- outputs -----------------------------------------------------------------------------
    def stale(self, now_ns: int) -> list[Stale]:
        """Streams without a live producer for longer than the timeout (none when disabled)."""
        if not self.timeout_ns:
            return []
        out = []
        for sid, since in sorted(self._since.items()):
            if not self._live.get(sid) and now_ns - since > self.timeout_ns:
                ring = self._ring.get(sid)
                out.append(
                    Stale(
                        sid,
                        (now_ns - since) // _MS,
                        sid in self._ever_live,
                        ring[0] if ring else None,
                    )
                )
        return out

    def check(self, now_ns: int, where: str) -> None:
        """Fail (or warn once per episode) for stale streams. ``where`` names the endpoints."""
        stale = self.stale(now_ns)
        if not stale:
            return
        message = stale_message(stale, self.timeout_ns // _MS, where)
        if not self.warn_only:
            raise TensorPoolStaleStreamError(message)
        new = [s for s in stale if s.stream_id not in self._warned]
        if new:
            self._warned.update(s.stream_id for s in new)
            log.warning("%s [onStaleStream=warn: the query keeps running]", message)

    def report(self, streams: Iterable[int], now_ns: int, wall_now_ns: int) -> dict[str, Any]:
        """The ``reportLatestOffset`` document (streams by ascending id)."""
        out: dict[str, Any] = {}
        for sid in sorted(streams):
            ring = self._ring.get(sid)
            epoch, head, newest = ring if ring is not None else (None, None, None)
            live = self._live.get(sid, False)
            since = self._since.get(sid, now_ns)
            out[str(sid)] = StreamHealth(
                epoch,
                head,
                self._lag.get(sid),
                None if newest is None else max(0, (wall_now_ns - newest) // _MS),
                live,
                self._announce_age.get(sid),
                0 if live else (now_ns - since) // _MS,
            ).to_json()
        return out


def lag_of(state: RingState, end: StreamPos | None) -> int:
    """Committed frames in the ring the query has not planned yet (after ``end``)."""
    if end is None or end.epoch == NOT_STARTED or end.epoch < state.epoch:
        return len(state.present(state.oldest, state.head))
    if end.epoch > state.epoch:
        return 0
    return len(state.present(end.seq, state.head))


def stale_message(stale: list[Stale], timeout_ms: int, where: str) -> str:
    parts = []
    for s in stale:
        if s.ever_live:
            why = (
                f"its producer (epoch {s.epoch}) stopped announcing"
                if s.epoch is not None
                else "its producer stopped announcing"
            )
        else:
            why = "no producer has announced it since the query started"
        parts.append(f"stream {s.stream_id}: no live producer for {s.for_ms / 1000:.1f} s ({why})")
    return (
        f"tensorpool stale stream(s): {'; '.join(parts)} -- over staleStreamTimeoutMs="
        f"{timeout_ms}. Listening on {where}. Start or restart the producer, check streams / "
        "aeronDir / controlChannel / controlStreamId, raise staleStreamTimeoutMs, or set "
        "onStaleStream=warn to keep the query running"
    )


# --- minFramesPerTrigger / maxTriggerDelay ------------------------------------------------------
def backlog(start: Mapping[int, StreamPos], states: Mapping[int, RingState | None]) -> int | None:
    """Frames a plan from ``start`` could admit now; None when a stream needs a bookkeeping
    batch that must not wait (it appeared, or changed epoch)."""
    total = 0
    for sid, pos in start.items():
        st = states.get(sid)
        if st is None or st.epoch < pos.epoch:
            continue
        if pos.epoch == NOT_STARTED or st.epoch > pos.epoch:
            return None
        total += len(st.present(pos.seq, st.head))
    return total


class MinFramesGate:
    """Kafka's ``minOffsetsPerTrigger`` + ``maxTriggerDelay`` for frames (sans-IO).

    A trigger is held (``latestOffset`` returns its start: Spark runs no batch) while fewer than
    ``min_frames`` frames are available and less than ``max_delay`` has passed since the last
    batch that admitted frames (or since the query started). Once the delay has passed, the
    next trigger takes whatever is there, even a single frame.
    """

    def __init__(self, min_frames: int, max_delay_ms: int) -> None:
        self.min_frames = min_frames
        self.max_delay_ns = max_delay_ms * _MS
        self.last_batch_ns: int | None = None

    def hold(self, available: int, now_ns: int) -> bool:
        if self.last_batch_ns is None:
            self.last_batch_ns = now_ns
        if available >= self.min_frames:
            return False
        return now_ns - self.last_batch_ns < self.max_delay_ns

    def admitted(self, frames: int, now_ns: int) -> None:
        """A batch with ``frames`` frames was planned: the delay counts from now."""
        if frames:
            self.last_batch_ns = now_ns


__all__ = [
    "HealthMonitor",
    "MinFramesGate",
    "Stale",
    "StreamHealth",
    "TensorPoolStaleStreamError",
    "backlog",
    "lag_of",
    "stale_message",
]
