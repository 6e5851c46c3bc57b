"""Vocabulary shared by the ingress buffer and its scheduler: enums, result records, errors.

Everything a caller receives from :mod:`tensorpool.ingest` is an immutable snapshot, so a
stats object kept for later never changes under the caller's feet. Enum values are the stable
names used in metrics and logs; they never change once published.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

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
    "IngressOverflowError",
    "LaneMetrics",
    "Mode",
    "Ordering",
    "Overflow",
    "ReplaceInfo",
    "SchedulerBufferMetrics",
    "SchedulerMetrics",
    "TickStats",
]

#: Lane used when no ``lane`` classifier is configured or when it returns ``None``.
DEFAULT_LANE: Final = "default"
#: Priority of lanes the ``lane_priority`` callable/mapping does not know (seed: "start at 1").
DEFAULT_PRIORITY: Final = 1
#: Smoothing factor of the ``ema_*`` metrics, sampled once per drain call (~10-drain horizon).
EMA_ALPHA: Final = 0.1


class Mode(StrEnum):
    """What ``capacity`` counts and what a repeated key does."""

    #: One pending entry per key; re-ingesting a pending key keeps the first item ("deduped").
    DEDUP_SET = "dedup_set"
    #: One pending entry per key; re-ingesting a pending key replaces its item ("replaced").
    LATEST_BY_KEY = "latest_by_key"
    #: Every item is kept, in arrival order, in a bounded FIFO per lane.
    QUEUE = "queue"


class Ordering(StrEnum):
    """Drain order inside one lane for the keyed modes (``queue`` is always FIFO)."""

    #: No promise. Today: least-recently-seen key first (the next eviction victim is served first).
    NONE = "none"
    #: Oldest *first enqueue* first; re-ingest refreshes last-seen but keeps the position.
    FIFO = "fifo"


class Overflow(StrEnum):
    """What a full ``queue`` buffer does when one more item arrives (applied to the losing lane)."""

    #: Drop the oldest item of the losing lane (the default).
    DROP_OLDEST = "drop_oldest"
    #: Drop the newest item of the losing lane (the arriving item when its own lane loses).
    DROP_NEWEST = "drop_newest"
    #: Drop every item of the losing lane, the arriving item too when its own lane loses.
    DROP_BUFFER = "drop_buffer"
    #: Refuse the arriving item: count it, log it and raise :class:`IngressOverflowError`.
    FAIL = "fail"


class DropReason(StrEnum):
    """Stable reason names of drop events (keys of ``BufferMetrics.dropped_by_reason``)."""

    BAD_KEY = "bad_key"
    EVICT_LRU = "evict_lru"
    DROP_OLDEST = "drop_oldest"
    DROP_NEWEST = "drop_newest"
    DROP_BUFFER = "drop_buffer"
    OVERFLOW = "overflow"


class IngestResult(StrEnum):
    """What happened to the item handed to ``ingest``."""

    #: A new key / a new queue item is now pending (another item may have been evicted for it).
    ENQUEUED = "enqueued"
    #: ``dedup_set``: the key was already pending; the item was discarded, last-seen refreshed.
    DEDUPED = "deduped"
    #: ``latest_by_key``: the key was already pending; its item was replaced by this one.
    REPLACED = "replaced"
    #: This very item is not pending: bad key, or it lost the capacity contest on arrival.
    DROPPED = "dropped"


class IngressOverflowError(RuntimeError):
    """A ``queue`` buffer with ``overflow="fail"`` refused an item because it was full.

    The item is handed back so the caller can retry it, park it or count it as lost.
    """

    def __init__(self, buffer: str, capacity: int, lane: Hashable, item: Any) -> None:
        super().__init__(
            f"ingress buffer {buffer!r} is full ({capacity} items); item for lane {lane!r} refused"
        )
        self.buffer = buffer
        self.capacity = capacity
        self.lane = lane
        self.item = item


@dataclass(frozen=True, slots=True)
class DrainStats:
    """Result of one ``drain`` call; the deltas let a caller adapt its budget tick by tick."""

    #: Items whose handler was invoked in this call.
    processed: int
    #: Items (keyed modes: keys) still pending after the call.
    pending: int
    #: Drop events since the previous ``drain`` call returned (ingest-time drops included).
    dropped: int
    #: Replacement events since the previous ``drain`` call returned.
    replaced: int
    #: Milliseconds spent in the call, only when a usable, monotonic clock was supplied.
    spent_millis: float | None = None

    @property
    def pending_after(self) -> int:
        """The seed's name for ``pending`` in the last-drain snapshot."""
        return self.pending


@dataclass(frozen=True, slots=True)
class DrainStartInfo:
    """Payload of ``on_drain_start``: the budget the drain is about to run under."""

    now_millis: float | None
    max_items: int
    max_millis: float | None


@dataclass(frozen=True, slots=True)
class DropInfo:
    """Payload of ``on_drop``: one item that left the buffer without being handled."""

    reason: DropReason
    item: Any
    #: ``None`` for ``bad_key`` drops and for ``queue`` buffers without a ``key`` function.
    key: Hashable | None
    lane: Hashable


@dataclass(frozen=True, slots=True)
class ReplaceInfo:
    """Payload of ``on_replace``: a pending item superseded by a newer one for the same key."""

    old: Any
    new: Any
    key: Hashable
    #: Lane of the entry after the replacement (the new item's lane).
    lane: Hashable


@dataclass(frozen=True, slots=True)
class LaneMetrics:
    """Per-lane summary inside :class:`BufferMetrics` (totals since the last reset).

    ``dropped_total`` counts evictions from the lane and ``overflow`` refusals of items bound
    for it; ``bad_key`` drops are buffer-level only (the item never reached a lane).
    """

    priority: int
    pending: int
    peak_pending: int
    drained_total: int
    dropped_total: int
    oldest_seq: int | None
    newest_seq: int | None
    seq_span: int


@dataclass(frozen=True, slots=True)
class BufferMetrics:
    """Pull snapshot of one buffer. Totals and averages run since the last ``metrics_reset``.

    Identities that always hold (totals since the same reset, ``evicted`` = ``dropped_total``
    minus the ``bad_key`` and ``overflow`` refusals, which were never ingested nor enqueued):
    ``ingested_total == enqueued_total + deduped_total + replaced_total`` and
    ``enqueued_total == drained_total + evicted + (pending - pending at the reset)``.
    """

    name: str
    mode: Mode
    capacity: int
    #: ``none``/``fifo`` for keyed modes; for ``queue`` the (ignored) configured value or None.
    ordering: Ordering | None
    #: Overflow policy of a ``queue`` buffer; ``None`` for keyed modes (they evict LRU).
    overflow: Overflow | None
    #: Last sequence number handed out (monotonic, never reset).
    ingest_seq_now: int
    #: Smallest last-seen sequence number among pending entries (``None`` when empty).
    oldest_seq: int | None
    #: Largest last-seen sequence number among pending entries (``None`` when empty).
    newest_seq: int | None
    #: ``newest_seq - oldest_seq`` (0 when empty).
    seq_span: int
    pending: int
    peak_pending: int
    ingested_total: int
    enqueued_total: int
    deduped_total: int
    replaced_total: int
    dropped_total: int
    drained_total: int
    drain_calls_total: int
    dropped_by_reason: dict[str, int]
    #: Pending keys moved to another lane by a re-ingest.
    migrated_total: int
    #: Exceptions raised by hooks (logged and swallowed).
    hook_errors_total: int
    #: Result of the most recent completed drain (kept across resets; ``None`` before any).
    last_drain: DrainStats | None
    #: Running means over the drains since the reset, sampled after each drain (None if none).
    avg_pending: float | None
    avg_seq_span: float | None
    #: Exponential moving averages with ``EMA_ALPHA``, sampled after each drain.
    ema_pending: float | None
    ema_seq_span: float | None
    #: Per-lane summaries keyed by lane name, in lane creation order.
    lanes: dict[Hashable, LaneMetrics]


@dataclass(frozen=True, slots=True)
class TickStats:
    """Result of one scheduler tick, with the per-buffer drain results."""

    processed: int
    pending: int
    dropped: int
    replaced: int
    spent_millis: float | None
    #: True when work was left pending because the item or time budget ran out.
    budget_exhausted: bool
    #: Drain result of every buffer, keyed by buffer name, in the order they were drained.
    buffers: dict[str, DrainStats]


@dataclass(frozen=True, slots=True)
class SchedulerBufferMetrics:
    """One buffer as the scheduler sees it (totals from this scheduler's ticks since reset)."""

    priority: int
    processed_total: int
    dropped_total: int
    replaced_total: int
    metrics: BufferMetrics


@dataclass(frozen=True, slots=True)
class SchedulerMetrics:
    """Pull snapshot of a scheduler and of each of its buffers."""

    name: str
    max_items_per_tick: int
    ticks_total: int
    processed_total: int
    dropped_total: int
    replaced_total: int
    #: Ticks that ended with work pending because the budget ran out.
    budget_exhausted_total: int
    pending: int
    #: Largest total pending seen at the start of a tick (pending only grows between ticks).
    peak_pending: int
    last_tick: TickStats | None
    avg_processed: float | None
    ema_processed: float | None
    avg_pending: float | None
    ema_pending: float | None
    buffers: dict[str, SchedulerBufferMetrics]
