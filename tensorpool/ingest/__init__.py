"""Ingest -> bounded buffer -> budgeted drain: admission control without backpressure.

Producers we cannot slow down (an Aeron poll loop, a burst of descriptors) call ``ingest``:
O(1), no I/O, never blocks. Work happens later, when the host calls ``drain`` on its own cadence
(a duty cycle, a rate slot, a Spark trigger) with a budget of items and optionally milliseconds.
Between the two sits an :class:`IngressBuffer` whose memory is bounded by ``capacity`` (required,
no default) and whose overload behaviour is explicit: every drop is counted under a stable reason,
reported in the next drain's stats and in ``metrics()``, and offered to an ``on_drop`` hook.

Modes (``capacity`` counts keys in the keyed modes, items in ``queue``):

* ``dedup_set`` -- one entry per ``key(item)``; a pending key ingested again is *deduped*
  (first item kept). ``latest_by_key`` -- same, but the newer item *replaces* the pending one.
* ``queue`` -- every item kept, FIFO per lane; a full buffer applies ``overflow``:
  ``drop_oldest`` (default), ``drop_newest``, ``drop_buffer`` or ``fail`` (raises).

Lanes: an optional ``lane(item)`` classifier (``None`` -> ``"default"``) and ``lane_priority``
(callable or mapping; higher wins; unknown lanes get 1). Capacity is global across lanes. When
full, the lowest-priority non-empty lane (the arriving item counted in its lane) loses: keyed
modes evict its least-recently-seen key, ``queue`` applies the overflow policy to it; equal
losers take turns. "Seen" is a monotonic ``ingest_seq`` bumped on every ingest, re-ingests
included -- no clock needed. A pending key re-ingested with another lane migrates there.
``key(item) is None`` (keyed modes: or unhashable) drops it as ``bad_key``, with a warning.

Drain: strict lane priority (equal lanes round-robin), ``ordering="fifo"`` = first-enqueue order
inside a lane for the keyed modes. Returns :class:`DrainStats` (``processed``, ``pending``,
``dropped``/``replaced`` since the previous drain, ``spent_millis`` when a clock was usable).
Bad time budgets or clocks stop the drain with a warning. ``metrics()`` / ``metrics_reset()``
give totals, peaks, means, EMAs, sequence span and per-lane summaries; a reset never changes
behaviour. :class:`IngressScheduler` drains several buffers under one ``max_items_per_tick``.

Typical uses::

    # rate limiter: hold only the newest frame until the next rate slot opens
    slot = IngressBuffer("rl.pending", mode="latest_by_key", capacity=1, key=lambda d: 0)
    slot.ingest(descriptor)              # replaces an older pending frame (counted)
    slot.drain(1, publish)               # when the slot opens

    # Spark source: descriptors per stream, at most N frames per micro-batch
    intake = IngressBuffer("spark.intake", mode="queue", capacity=65536,
                           lane=lambda d: d.stream_id)
    batch: list = []
    intake.drain(max_frames_per_trigger, batch.append)
"""

from tensorpool.ingest._types import (
    DEFAULT_LANE,
    DEFAULT_PRIORITY,
    EMA_ALPHA,
    BufferMetrics,
    DrainStartInfo,
    DrainStats,
    DropInfo,
    DropReason,
    IngestResult,
    IngressOverflowError,
    LaneMetrics,
    Mode,
    Ordering,
    Overflow,
    ReplaceInfo,
    SchedulerBufferMetrics,
    SchedulerMetrics,
    TickStats,
)
from tensorpool.ingest.buffer import IngressBuffer
from tensorpool.ingest.scheduler import IngressScheduler

__all__ = [
    "DEFAULT_LANE",
    "DEFAULT_PRIORITY",
    "EMA_ALPHA",
    "BufferMetrics",
    "DrainStartInfo",
    "DrainStats",
    "DropInfo",
    "DropReason",
    "IngestResult",
    "IngressBuffer",
    "IngressOverflowError",
    "IngressScheduler",
    "LaneMetrics",
    "Mode",
    "Ordering",
    "Overflow",
    "ReplaceInfo",
    "SchedulerBufferMetrics",
    "SchedulerMetrics",
    "TickStats",
]
