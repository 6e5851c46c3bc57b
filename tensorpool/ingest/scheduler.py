"""Drain several ingress buffers under one per-tick budget.

Buffer priority decides between buffers, lane priority decides inside a buffer. Strict priority
with leftover budget: the highest-priority buffer drains first and whatever it leaves of the
budget passes to the next. Buffers of equal priority take turns going first (the order rotates
by one every tick) so a busy buffer cannot permanently starve an equal one.

Every registered buffer's ``drain`` is called on every tick, with a budget of 0 once the budget
is spent: per-buffer drain deltas, last-drain snapshots and averages then have a per-tick
cadence whatever the load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from tensorpool.ingest._types import (
    EMA_ALPHA,
    DrainStats,
    SchedulerBufferMetrics,
    SchedulerMetrics,
    TickStats,
)
from tensorpool.ingest.buffer import IngressBuffer, _as_count, _is_positive_budget, _is_time

__all__ = ["IngressScheduler"]

_LOG: Final = logging.getLogger("tensorpool.ingest")

Handler = Callable[[Any], object]
Clock = Callable[[], float]


class _Entry:
    __slots__ = (
        "base_dropped",
        "base_processed",
        "base_replaced",
        "buffer",
        "dropped",
        "handle",
        "priority",
        "processed",
        "replaced",
    )

    def __init__(self, buffer: IngressBuffer, priority: int, handle: Handler | None) -> None:
        self.buffer = buffer
        self.priority = priority
        self.handle = handle
        self.processed = 0
        self.dropped = 0
        self.replaced = 0
        self.base_processed = 0
        self.base_dropped = 0
        self.base_replaced = 0


class _Group:
    __slots__ = ("entries", "priority", "start")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.entries: list[_Entry] = []
        self.start = 0


class IngressScheduler:
    """One tick budget (``max_items_per_tick``, optional time budget) over many buffers."""

    def __init__(
        self, name: str, *, max_items_per_tick: int, logger: logging.Logger | None = None
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty str (it labels metrics and logs)")
        self._name = name
        self._max_items = _as_count(max_items_per_tick, "max_items_per_tick")
        self._log = logger if logger is not None else _LOG
        self._entries: dict[str, _Entry] = {}
        self._groups: list[_Group] = []
        self._ticking = False
        # Counters since reset.
        self._ticks = 0
        self._processed = 0
        self._dropped = 0
        self._replaced = 0
        self._exhausted = 0
        self._peak = 0
        self._samples = 0
        self._sum_processed = 0
        self._sum_pending = 0
        self._ema_processed: float | None = None
        self._ema_pending: float | None = None
        self._last_tick: TickStats | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_items_per_tick(self) -> int:
        return self._max_items

    @property
    def pending(self) -> int:
        return sum(e.buffer.pending for e in self._entries.values())

    @property
    def buffers(self) -> tuple[str, ...]:
        """Buffer names in registration order."""
        return tuple(self._entries)

    def add_buffer(
        self, buffer: IngressBuffer, *, priority: int = 1, handle: Handler | None = None
    ) -> None:
        """Register ``buffer``; ``handle`` is its handler when ``drain_tick`` gets none."""
        if not isinstance(buffer, IngressBuffer):
            raise TypeError("buffer must be an IngressBuffer")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        if handle is not None and not callable(handle):
            raise TypeError("handle must be callable or None")
        if buffer.name in self._entries:
            raise ValueError(f"scheduler {self._name!r} already has a buffer named {buffer.name!r}")
        if self._ticking:
            raise RuntimeError("cannot add buffers during a tick")
        self._entries[buffer.name] = _Entry(buffer, priority, handle)
        self._regroup()

    def remove_buffer(self, name: str) -> IngressBuffer:
        """Unregister a buffer (its contents stay in it) and return it."""
        if self._ticking:
            raise RuntimeError("cannot remove buffers during a tick")
        try:
            entry = self._entries.pop(name)
        except KeyError:
            raise KeyError(f"scheduler {self._name!r} has no buffer named {name!r}") from None
        self._regroup()
        return entry.buffer

    def _regroup(self) -> None:
        old = {g.priority: g.start for g in self._groups}
        groups: dict[int, _Group] = {}
        for e in self._entries.values():
            g = groups.get(e.priority)
            if g is None:
                g = groups[e.priority] = _Group(e.priority)
            g.entries.append(e)
        for g in groups.values():
            g.start = old.get(g.priority, 0) % len(g.entries)
        self._groups = sorted(groups.values(), key=lambda g: -g.priority)

    def drain_tick(
        self,
        handle: Handler | None = None,
        *,
        max_items: int | None = None,
        max_millis: float | None = None,
        now_millis: Clock | None = None,
    ) -> TickStats:
        """Run one tick: drain buffers by priority until the budget is spent.

        ``handle`` (if given) serves every buffer; otherwise each buffer's registered handler.
        ``max_items`` overrides ``max_items_per_tick`` for this tick. Time budget rules are the
        buffer's: ``max_millis`` needs ``now_millis``; a budget that is not a number > 0 or a
        clock that is not a number or goes backwards drains nothing more this tick, with a
        warning.
        """
        budget = self._max_items if max_items is None else _as_count(max_items, "max_items")
        if handle is not None and not callable(handle):
            raise TypeError("handle must be callable or None")
        if self._ticking:
            raise RuntimeError(f"scheduler {self._name!r}: drain_tick() is not reentrant")
        entries_order: list[_Entry] = []
        for g in self._groups:
            es = g.entries
            entries_order.extend(es[g.start :] + es[: g.start])
        for e in entries_order:
            if handle is None and e.handle is None:
                raise ValueError(
                    f"scheduler {self._name!r}: buffer {e.buffer.name!r} has no handler and "
                    "drain_tick() got none"
                )
        for g in self._groups:
            g.start = (g.start + 1) % len(g.entries)

        pending_before = sum(e.buffer.pending for e in entries_order)
        if pending_before > self._peak:
            self._peak = pending_before
        log = self._log
        t0: float | None = None
        last: float | None = None
        timed = False
        time_ok = True
        limit: float | None = None
        misconfigured = False
        if now_millis is not None:
            if max_millis is not None and not _is_positive_budget(max_millis):
                log.warning(
                    "scheduler %r: max_millis=%r is not a number > 0; drained 0 items",
                    self._name,
                    max_millis,
                )
                misconfigured = True
            t0 = now_millis()
            if not _is_time(t0):
                log.warning(
                    "scheduler %r: now_millis() returned %r, not a number; drained 0 items",
                    self._name,
                    t0,
                )
                misconfigured = True
                t0 = None
            else:
                timed = True
                last = t0
                if max_millis is not None and not misconfigured:
                    limit = max_millis
        elif max_millis is not None:
            log.warning("scheduler %r: max_millis without now_millis is ignored", self._name)
        if misconfigured:
            budget = 0

        remaining = budget
        out_of_time = False
        per: dict[str, DrainStats] = {}
        self._ticking = True
        try:
            for e in entries_order:
                h = handle if handle is not None else e.handle
                buf = e.buffer
                if remaining <= 0 or not time_ok or out_of_time:
                    st = buf.drain(0, h)  # type: ignore[arg-type]
                elif limit is not None:
                    t = now_millis()  # type: ignore[misc]
                    if not _is_time(t) or t < last:  # type: ignore[operator]
                        log.warning(
                            "scheduler %r: now_millis() returned %r after %r; tick stopped",
                            self._name,
                            t,
                            last,
                        )
                        time_ok = False
                        st = buf.drain(0, h)  # type: ignore[arg-type]
                    else:
                        last = t
                        left = limit - (t - t0)  # type: ignore[operator]
                        if left <= 0:
                            out_of_time = True
                            st = buf.drain(0, h)  # type: ignore[arg-type]
                        else:
                            st = buf.drain(remaining, h, max_millis=left, now_millis=now_millis)  # type: ignore[arg-type]
                            if st.spent_millis is None:
                                time_ok = False
                else:
                    st = buf.drain(remaining, h, now_millis=now_millis if timed else None)  # type: ignore[arg-type]
                    if timed and st.spent_millis is None:
                        time_ok = False
                remaining -= st.processed
                per[buf.name] = st
                e.processed += st.processed
                e.dropped += st.dropped
                e.replaced += st.replaced
        finally:
            self._ticking = False

        spent: float | None = None
        if timed and time_ok:
            t_end = now_millis()  # type: ignore[misc]
            if _is_time(t_end) and t_end >= last:  # type: ignore[operator]
                spent = t_end - t0  # type: ignore[operator]
                if limit is not None and spent >= limit:
                    out_of_time = True
            else:
                log.warning(
                    "scheduler %r: now_millis() returned %r after %r at tick end",
                    self._name,
                    t_end,
                    last,
                )
        processed = sum(s.processed for s in per.values())
        dropped = sum(s.dropped for s in per.values())
        replaced = sum(s.replaced for s in per.values())
        pending = sum(s.pending for s in per.values())
        exhausted = (
            pending > 0 and not misconfigured and time_ok and (remaining <= 0 or out_of_time)
        )
        stats = TickStats(processed, pending, dropped, replaced, spent, exhausted, per)
        self._last_tick = stats
        self._ticks += 1
        self._processed += processed
        self._dropped += dropped
        self._replaced += replaced
        self._exhausted += exhausted
        self._samples += 1
        self._sum_processed += processed
        self._sum_pending += pending
        if self._ema_processed is None:
            self._ema_processed = float(processed)
            self._ema_pending = float(pending)
        else:
            self._ema_processed += EMA_ALPHA * (processed - self._ema_processed)
            self._ema_pending += EMA_ALPHA * (pending - self._ema_pending)  # type: ignore[operator]
        return stats

    def metrics(self) -> SchedulerMetrics:
        """Snapshot of the scheduler and, under ``buffers``, of every buffer's own metrics."""
        n = self._samples
        return SchedulerMetrics(
            name=self._name,
            max_items_per_tick=self._max_items,
            ticks_total=self._ticks,
            processed_total=self._processed,
            dropped_total=self._dropped,
            replaced_total=self._replaced,
            budget_exhausted_total=self._exhausted,
            pending=self.pending,
            peak_pending=self._peak,
            last_tick=self._last_tick,
            avg_processed=self._sum_processed / n if n else None,
            ema_processed=self._ema_processed,
            avg_pending=self._sum_pending / n if n else None,
            ema_pending=self._ema_pending,
            buffers={
                name: SchedulerBufferMetrics(
                    priority=e.priority,
                    processed_total=e.processed - e.base_processed,
                    dropped_total=e.dropped - e.base_dropped,
                    replaced_total=e.replaced - e.base_replaced,
                    metrics=e.buffer.metrics(),
                )
                for name, e in self._entries.items()
            },
        )

    def metrics_reset(self) -> None:
        """Reset the scheduler's counters and every buffer's metrics; no behaviour changes."""
        self._ticks = 0
        self._processed = 0
        self._dropped = 0
        self._replaced = 0
        self._exhausted = 0
        self._peak = self.pending
        self._samples = 0
        self._sum_processed = 0
        self._sum_pending = 0
        self._ema_processed = None
        self._ema_pending = None
        for e in self._entries.values():
            e.base_processed = e.processed
            e.base_dropped = e.dropped
            e.base_replaced = e.replaced
            e.buffer.metrics_reset()
