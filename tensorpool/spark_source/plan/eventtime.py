"""Event time of the Spark source: per-stream watermarks, the minimum rule, late frames (#17).

Sans-IO: callers pass each stream's newest event time, its head and ``now_ns`` (the driver's
monotonic clock); nothing here reads a ring or a clock.

Why the source aligns at all
----------------------------
Spark keeps *one* watermark per query, ``max(event time of every row) - delay``. A source over
several streams hands it rows of all of them, so a stream that runs behind in event time has
its rows dropped as late by every downstream stateful operator. Seed 004's
``WatermarkAligner`` instead combines per-source watermarks by the **minimum rule**. The
source cannot change Spark's watermark, but it can decide which frames enter a micro-batch:
with ``alignEventTime`` it admits, per stream, only frames whose event time is at or below
``min over live streams of (the newest event time the stream will have delivered once this
micro-batch is planned) + maxEventTimeSkewMs`` (:meth:`Aligner.bound`, #27.1), after every
per-stream cap (``maxFramesPerTrigger``, the byte budget, the rate, the memory bound), so the
maximum Spark sees never runs ahead of what the slowest live stream has delivered by more
than the skew. (Bounding by the newest frame in each *ring* is not enough: a stream with a
backlog or a per-trigger cap delivers far less than its ring holds, and its rows would reach
Spark after Spark's watermark had passed them.) A stream that delivers nothing in the
micro-batch counts with its oldest waiting frame (it cannot deliver anything older), or its
watermark when nothing waits (the newest frame in its ring before it has delivered any).
A stream is bounded by the others only: what it delivers itself is within the bound it
sets, so the lagging stream is never held and takes the budget the others leave.

Idleness: a stream whose head has not moved for ``idleStreamTimeoutMs`` (or that has never
had a frame since the reader first looked at it for that long) stops holding the others back.
With no live stream at all the bound is None: nothing is held (seed 004's aligner with zero
sources reports no watermark).

Watermarks
----------
A stream's watermark is the highest event time the source has delivered for it (cumulative,
carried in the offsets as ``eventNs`` so a restarted query keeps it). The source's global
watermark is the minimum over live streams, never decreasing (seed 004 §2.1, "per-edge
non-decreasing"). Frames below ``global - allowedLatenessMs`` are *late*.

A producer whose clock steps back (#31.2)
----------------------------------------
Frames of a stream are published in seq order, so a frame is no older than any frame before
it: for lag and alignment its time is the highest stamp at or before it in the stream
(:func:`running_max`, carried on from the stream's watermark, not restarted at each trigger),
which keeps those decisions a seq *prefix*. Lateness is about the event time a frame claims:
a frame is late when its own stamp is below the watermark as it stands just before it
(:func:`late_reference`: every earlier frame of its stream counted, the other streams as of
the trigger) minus ``allowedLatenessMs``. Neither depends on where a trigger boundary falls.
The offsets record late frames as one prefix per batch, so a run of late frames after
on-time ones ends the micro-batch (:func:`late_runs`); the next one starts with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np

_MS: Final = 1_000_000
#: no watermark yet (:func:`late_reference`); as a bound: hold everything
NO_WATERMARK: Final = -(2**63)


def running_max(stamps: np.ndarray, floor: int | None = None) -> np.ndarray:
    """Event times made non-decreasing in seq order, from ``floor`` (the highest event time
    of the frames before these; see the module doc)."""
    if floor is not None and len(stamps):
        stamps = np.maximum(stamps, floor)
    if len(stamps) < 2:
        return stamps
    return np.maximum.accumulate(stamps)


def late_reference(
    times: np.ndarray, carried: int | None, others: int | None, global_ns: int | None
) -> np.ndarray:
    """Per frame: the source's watermark just before it (#31.2). ``times``: this stream's
    :func:`running_max` from ``carried`` (its watermark); ``others``: the lowest watermark of
    the other live streams (None: none); ``global_ns``: the source's watermark, which never
    decreases. ``-2**63``: no watermark yet."""
    before = np.empty(len(times), np.int64)
    if len(times):
        before[0] = NO_WATERMARK if carried is None else carried
        before[1:] = times[:-1]
    if others is not None:
        np.minimum(before, others, out=before)
    if global_ns is not None:
        np.maximum(before, global_ns, out=before)
    return before


def late_runs(late: np.ndarray) -> tuple[int, int]:
    """``(k, stop)``: the leading late frames, and where the on-time run after them ends (the
    next late frame, or the end): a batch delivers at most ``stop`` frames of these."""
    n = len(late)
    k = int(np.argmin(late)) if n and not late.all() else n
    rest = late[k:]
    stop = k + int(np.argmax(rest)) if rest.any() else n
    return k, stop


def count_at_or_below(times: np.ndarray, bound: int | None) -> int:
    """Leading frames of ``times`` (non-decreasing) at or below ``bound`` (None: all)."""
    if bound is None:
        return len(times)
    return int(np.searchsorted(times, bound, side="right"))


@dataclass(slots=True)
class _StreamClock:
    head: int = -1
    moved_ns: int = 0  # driver monotonic time the head last moved (or was first looked at)


@dataclass(slots=True)
class Aligner:
    """The minimum rule over the streams of one query (seed 004 ``WatermarkAligner``).

    ``skew_ns``: how far ahead of the slowest live stream a frame may be; ``idle_ns``: silence
    after which a stream no longer holds the others back.
    """

    skew_ns: int
    idle_ns: int
    _clocks: dict[int, _StreamClock] = field(default_factory=dict)
    #: the source's global watermark (ns, wall clock), monotone; None before any frame
    global_ns: int | None = None

    def observe(self, sid: int, head: int | None, now_ns: int) -> None:
        """One ring scan of ``sid``: its head (None: not mapped)."""
        c = self._clocks.get(sid)
        if c is None:
            c = self._clocks[sid] = _StreamClock(moved_ns=now_ns)
        if head is not None and head != c.head:
            c.moved_ns = now_ns
            c.head = head

    def idle(self, sid: int, now_ns: int) -> bool:
        c = self._clocks.get(sid)
        return c is not None and now_ns - c.moved_ns >= self.idle_ns

    def live(self, now_ns: int) -> list[int]:
        return sorted(s for s in self._clocks if not self.idle(s, now_ns))

    def bound(self, delivered: Mapping[int, int | None], now_ns: int) -> int | None:
        """Highest event time admissible now, given the event time each stream will have
        delivered (see the module doc); None: no live stream holds anything back.

        A live stream with no frame at all holds every other stream (its first frames may be
        older than anything seen) until it has been silent for the idle timeout.
        """
        return self._low(self._lows(delivered, now_ns), None)

    def bounds(
        self, delivered: Mapping[int, int | None], now_ns: int, sids: Iterable[int]
    ) -> dict[int, int | None]:
        """:meth:`bound` for each of ``sids`` over the *other* live streams: a stream is never
        held by itself (what it delivers is within the bound it sets)."""
        lows = self._lows(delivered, now_ns)[:2]
        return {sid: self._low(lows, sid) for sid in sids}

    def _lows(self, delivered: Mapping[int, int | None], now_ns: int) -> list[tuple[int, int]]:
        """(delivered or NO_WATERMARK, sid) of the live streams, lowest first."""
        out = []
        for sid in self.live(now_ns):
            d = delivered.get(sid)
            out.append((NO_WATERMARK if d is None else d, sid))
        return sorted(out)

    def _low(self, lows: list[tuple[int, int]], exclude: int | None) -> int | None:
        for d, sid in lows:
            if sid != exclude:
                return d if d == NO_WATERMARK else d + self.skew_ns
        return None

    def advance(self, per_stream_ns: dict[int, int], now_ns: int) -> int | None:
        """Fold the per-stream watermarks in: global = min over live streams, never lower."""
        live = [per_stream_ns[s] for s in self.live(now_ns) if s in per_stream_ns]
        if live:
            low = min(live)
            if self.global_ns is None or low > self.global_ns:
                self.global_ns = low
        return self.global_ns

    def seed(self, per_stream_ns: Iterable[int]) -> None:
        """A restarted query: the global watermark from the checkpointed per-stream ones (the
        minimum over all of them: conservative, it may flag fewer frames late than before)."""
        vals = [v for v in per_stream_ns if v]
        if vals and self.global_ns is None:
            self.global_ns = min(vals)


__all__ = [
    "NO_WATERMARK",
    "Aligner",
    "count_at_or_below",
    "late_reference",
    "late_runs",
    "running_max",
]
