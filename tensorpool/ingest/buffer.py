"""The ingress buffer: cheap ``ingest`` at arrival time, bounded storage, budgeted ``drain``.

Storage model (chosen so every operation the hot paths need is O(1) in C):

* Every lane owns its storage. ``queue`` lanes are a ``deque`` of ``(seq, item)``. Keyed lanes
  are an ``OrderedDict`` key -> entry kept in *last-seen* order (``move_to_end`` on every ingest
  attempt), so the LRU eviction victim is always at the front. ``ordering="fifo"`` adds a
  ``deque`` of the entries per lane in *first-enqueue* order, used only to pick the next item
  to drain (the seed's "spend memory to keep related work closer together").
* An entry is a small list ``[last_seen_seq, item, lane, key]`` mutated in place on
  re-ingest.
* With a ``lane`` classifier a global ``dict`` key -> entry finds a pending key in any lane
  (needed for dedupe across lanes and for lane migration); without one the single lane's
  ``OrderedDict`` is the index.
* The pending depth is exact at every moment a user callback can run, so a handler or hook
  that ingests into the same buffer sees the true depth. Keyed modes derive it from the key
  containers (``len`` of the index, or of the single lane's store), so taking a key out is all
  the accounting a drained item needs; ``queue`` mode keeps a counter, ``_queued``.

``ingest`` is bound per instance to a specialised implementation (queue / keyed, one lane /
several lanes) so the common configurations pay for nothing they do not use.
"""

from __future__ import annotations

import logging
import math
import numbers
import operator
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from functools import partial
from itertools import count, islice
from typing import Any, Final

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
)

__all__ = ["IngressBuffer"]

_LOG: Final = logging.getLogger("tensorpool.ingest")

_ENQUEUED: Final = IngestResult.ENQUEUED
_DEDUPED: Final = IngestResult.DEDUPED
_REPLACED: Final = IngestResult.REPLACED
_DROPPED: Final = IngestResult.DROPPED

# Index of each drop reason in the per-buffer counter list (hot paths bump a list slot).
_REASONS: Final = tuple(DropReason)
_R_BAD_KEY: Final = _REASONS.index(DropReason.BAD_KEY)
_R_EVICT_LRU: Final = _REASONS.index(DropReason.EVICT_LRU)
_R_OVERFLOW: Final = _REASONS.index(DropReason.OVERFLOW)
_POLICY_REASON: Final = {
    Overflow.DROP_OLDEST: DropReason.DROP_OLDEST,
    Overflow.DROP_NEWEST: DropReason.DROP_NEWEST,
    Overflow.DROP_BUFFER: DropReason.DROP_BUFFER,
    Overflow.FAIL: DropReason.OVERFLOW,
}

_QUEUED: Final = operator.attrgetter("_queued")

Handler = Callable[[Any], object]
Clock = Callable[[], float]


def _is_time(t: object) -> bool:
    """True for a finite real number (bool excluded): the only clock readings we trust."""
    tt = type(t)
    if tt is int:
        return True
    if tt is float:
        return math.isfinite(t)  # type: ignore[arg-type]
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        return False
    return math.isfinite(t)


def _is_positive_budget(x: object) -> bool:
    """A usable ``max_millis``: a real number > 0 (``inf`` allowed, NaN and bool not)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return False
    return not math.isnan(x) and x > 0


def _as_int(value: object, what: str) -> int:
    """Accept ints and int-likes (numpy integers); reject bools, floats and strings loudly."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None


def _as_count(value: object, what: str) -> int:
    n = _as_int(value, what)
    if n < 0:
        raise ValueError(f"{what} must be >= 0, got {n}")
    return n


def _enum(cls: type, value: object, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)  # type: ignore[attr-defined]
        raise ValueError(f"{what} must be one of {allowed}; got {value!r}") from None


class _PriorityClass:
    """Lanes sharing one priority, with the two round-robin pointers the seed asks for."""

    __slots__ = ("drain_next", "evict_last", "lanes", "priority")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.lanes: list[_Lane] = []
        #: Slot of the lane that opens the next drain (rotates so equal lanes share budget).
        self.drain_next = 0
        #: Slot of the lane that lost the last capacity contest (ties rotate from there).
        self.evict_last = -1


class _Lane:
    __slots__ = (
        "base_drained",
        "base_dropped",
        "drained",
        "dropped",
        "fifo",
        "index",
        "name",
        "peak",
        "priority",
        "slot",
        "stale",
        "store",
    )

    store: Any

    def __init__(self, name: Hashable, priority: int, slot: int, index: dict | None) -> None:
        self.name = name
        self.priority = priority
        self.slot = slot
        self.index = index
        self.fifo: deque[list] | None = None
        self.stale = 0
        self.peak = 0
        self.drained = 0
        self.dropped = 0
        self.base_drained = 0
        self.base_dropped = 0

    # Overridden per storage kind.
    def pop(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def take(self, k: int, handle: Handler, buf: IngressBuffer) -> int:  # pragma: no cover
        raise NotImplementedError

    def oldest_seq(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def newest_seq(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


class _QueueLane(_Lane):
    __slots__ = ()

    def __init__(self, name: Hashable, priority: int, slot: int, index: dict | None) -> None:
        super().__init__(name, priority, slot, index)
        self.store: deque[tuple[int, Any]] = deque()

    def pop(self) -> Any:
        return self.store.popleft()[1]

    def take(self, k: int, handle: Handler, buf: IngressBuffer) -> int:
        # The emptiness check stays inside the loop: a handler may ingest into this buffer and
        # evict from this very lane while we drain it. The range loop variable is the count
        # handed out so far (exact if the handler raises); CPython 3.12 updates a loop int in
        # place where ``n += 1`` would allocate a new one per item.
        q = self.store
        popleft = q.popleft
        n = 0
        try:
            for n in range(1, k + 1):
                if not q:
                    n -= 1
                    break
                buf._queued -= 1
                handle(popleft()[1])
        finally:
            self.drained += n
            buf._drained += n
        return n

    def oldest_seq(self) -> int:
        return self.store[0][0]

    def newest_seq(self) -> int:
        return self.store[-1][0]


class _KeyedLane(_Lane):
    """Keyed lane drained in last-seen order (``ordering="none"``)."""

    __slots__ = ()

    def __init__(self, name: Hashable, priority: int, slot: int, index: dict | None) -> None:
        super().__init__(name, priority, slot, index)
        self.store: OrderedDict[Hashable, list] = OrderedDict()

    def pop(self) -> Any:
        k, e = self.store.popitem(False)
        if self.index is not None:
            del self.index[k]
        return e[1]

    def take(self, k: int, handle: Handler, buf: IngressBuffer) -> int:
        store = self.store
        popitem = store.popitem
        index = self.index
        n = 0
        try:
            # Pending is derived from the key containers (see IngressBuffer._depth), so
            # removing the key is all the accounting an item needs before its handler runs.
            if index is None:
                for n in range(1, k + 1):
                    if not store:
                        n -= 1
                        break
                    handle(popitem(False)[1][1])
            else:
                for n in range(1, k + 1):
                    if not store:
                        n -= 1
                        break
                    key, e = popitem(False)
                    del index[key]
                    handle(e[1])
        finally:
            self.drained += n
            buf._drained += n
        return n

    def oldest_seq(self) -> int:
        return next(iter(self.store.values()))[0]

    def newest_seq(self) -> int:
        store = self.store
        return store[next(reversed(store))][0]


class _FifoKeyedLane(_KeyedLane):
    """Keyed lane drained in first-enqueue order (``ordering="fifo"``).

    The first-enqueue order is a ``deque`` of the entries themselves (an entry carries its
    key). An entry that leaves the lane other than by draining (evicted, migrated) is marked
    dead (lane slot set to ``None``; a migrated key continues in a fresh entry) and stays
    queued; dead entries are skipped when met at the front and swept out when they outnumber
    the live ones (amortised O(1), memory bounded by about twice the pending keys). Cheaper
    than a second ``OrderedDict`` (append/popleft instead of insert/popitem) and than
    ``(key, entry, token)`` records (no tuple to allocate, unpack and free per key).
    """

    __slots__ = ()

    def __init__(self, name: Hashable, priority: int, slot: int, index: dict | None) -> None:
        super().__init__(name, priority, slot, index)
        self.fifo = deque()

    def pop(self) -> Any:
        popleft = self.fifo.popleft  # type: ignore[union-attr]
        e = popleft()
        while e[2] is None:
            self.stale -= 1
            e = popleft()
        key = e[3]
        del self.store[key]
        if self.index is not None:
            del self.index[key]
        return e[1]

    def take(self, k: int, handle: Handler, buf: IngressBuffer) -> int:
        store = self.store
        popleft = self.fifo.popleft  # type: ignore[union-attr]
        index = self.index
        n = 0
        try:
            # A non-empty store guarantees a live entry in the FIFO, so the dead-entry skip
            # cannot run off the end.
            for n in range(1, k + 1):
                if not store:
                    n -= 1
                    break
                e = popleft()
                while e[2] is None:
                    self.stale -= 1
                    e = popleft()
                key = e[3]
                del store[key]
                if index is not None:
                    del index[key]
                handle(e[1])
        finally:
            self.drained += n
            buf._drained += n
        return n

    def retire(self, e: list) -> None:
        """``e`` left this lane's store (evicted or migrated): mark it dead in the FIFO."""
        e[2] = None
        self.stale = stale = self.stale + 1
        if stale > len(self.store) + 16:
            fifo = self.fifo
            assert fifo is not None
            live = [r for r in fifo if r[2] is not None]
            fifo.clear()  # same deque object: a drain in progress keeps a bound popleft
            fifo.extend(live)
            self.stale = 0


class IngressBuffer:
    """A bounded pending-work buffer with explicit overflow rules and budgeted draining.

    Not thread-safe: one thread ingests and drains (an agent duty cycle, a Spark driver
    callback); guard it externally otherwise. All user callables are expected to be cheap and
    pure (``key``, ``lane``, ``lane_priority``): they run on the ingest path.
    """

    def __init__(
        self,
        name: str,
        *,
        mode: Mode | str,
        capacity: int,
        key: Callable[[Any], Hashable | None] | None = None,
        lane: Callable[[Any], Hashable | None] | None = None,
        lane_priority: Callable[[Hashable], int] | Mapping[Hashable, int] | None = None,
        ordering: Ordering | str | None = None,
        overflow: Overflow | str | None = None,
        on_drain_start: Callable[[DrainStartInfo], object] | None = None,
        on_drain_end: Callable[[DrainStats], object] | None = None,
        on_drop: Callable[[DropInfo], object] | None = None,
        on_replace: Callable[[ReplaceInfo], object] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        """Validate the whole configuration up front: a buffer that constructs is usable.

        ``capacity`` has no default on purpose (the seed: the domain must choose it). ``key``
        is required by the keyed modes; in ``queue`` mode it is optional and only validates
        items (``None`` -> ``bad_key``) and fills ``DropInfo.key``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty str (it labels metrics and logs)")
        self._name = name
        self._mode: Mode = _enum(Mode, mode, "mode")
        capacity = _as_int(capacity, "capacity")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._keyed = self._mode is not Mode.QUEUE
        self._latest = self._mode is Mode.LATEST_BY_KEY
        for label, fn in (
            ("key", key),
            ("lane", lane),
            ("on_drain_start", on_drain_start),
            ("on_drain_end", on_drain_end),
            ("on_drop", on_drop),
            ("on_replace", on_replace),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{label} must be callable or None")
        if self._keyed and key is None:
            raise ValueError(f"mode {self._mode.value!r} needs a key function")
        if lane_priority is not None and not (
            callable(lane_priority) or isinstance(lane_priority, Mapping)
        ):
            raise TypeError("lane_priority must be a callable, a mapping or None")
        if isinstance(lane_priority, Mapping):
            for ln, prio in lane_priority.items():
                self._check_priority(ln, prio)
        self._key = key
        self._lane_fn = lane
        self._lane_priority = lane_priority

        # Ordering: meaningful for keyed modes; for queue it is ignored and warned about on
        # every drain when explicitly set (seed §11).
        self._ordering_set: Ordering | None = (
            None if ordering is None else _enum(Ordering, ordering, "ordering")
        )
        if self._keyed:
            self._ordering: Ordering | None = self._ordering_set or Ordering.NONE
            if overflow is not None:
                raise ValueError(
                    "overflow applies to mode 'queue' only; keyed modes always evict the "
                    "least-recently-seen key of the losing lane"
                )
            self._overflow: Overflow | None = None
        else:
            self._ordering = self._ordering_set
            self._overflow = (
                Overflow.DROP_OLDEST if overflow is None else _enum(Overflow, overflow, "overflow")
            )
        self._fifo = self._keyed and self._ordering is Ordering.FIFO
        self._policy_index = (
            _REASONS.index(_POLICY_REASON[self._overflow]) if self._overflow is not None else -1
        )
        self._warn_ordering = not self._keyed and self._ordering_set is not None

        self._on_drain_start = on_drain_start
        self._on_drain_end = on_drain_end
        self._on_drop = on_drop
        self._on_replace = on_replace
        self._log = logger if logger is not None else _LOG

        # --- lanes ------------------------------------------------------------------------
        self._multi = lane is not None
        self._index: dict[Hashable, list] | None = {} if (self._keyed and self._multi) else None
        self._lanes: dict[Hashable, _Lane] = {}
        self._lane_list: list[_Lane] = []
        self._classes_desc: list[_PriorityClass] = []
        self._classes_asc: list[_PriorityClass] = []
        self._class_of: dict[int, _PriorityClass] = {}
        if self._keyed:
            self._lane_cls: type[_Lane] = _FifoKeyedLane if self._fifo else _KeyedLane
        else:
            self._lane_cls = _QueueLane
        self._default: _Lane | None = None if self._multi else self._new_lane(DEFAULT_LANE)

        # --- state and lifetime counters (metrics subtract a baseline; drains a delta mark) --
        # Pending depth: a counter in queue mode; in keyed modes the key containers' length.
        self._queued = 0
        self._depth: Callable[[], int]
        if not self._keyed:
            self._depth = partial(_QUEUED, self)  # C-level read of the counter
        elif self._index is not None:
            self._depth = self._index.__len__
        else:
            self._depth = self._default.store.__len__  # type: ignore[union-attr]
        self._seq = 0
        self._deduped = 0
        self._replaced = 0
        self._migrated = 0
        self._drained = 0
        self._drain_calls = 0
        self._hook_errors = 0
        self._drops = [0] * len(_REASONS)
        self._draining = False
        self._warned_no_clock = False
        # Drain deltas: lifetime totals at the end of the previous drain.
        self._mark_dropped = 0
        self._mark_replaced = 0
        self._last_drain: DrainStats | None = None
        # Metrics since reset.
        self._peak = 0
        self._base: tuple[int, ...] = (0,) * 7
        self._base_drops = [0] * len(_REASONS)
        self._samples = 0
        self._sum_pending = 0
        self._sum_span = 0
        self._ema_pending: float | None = None
        self._ema_span: float | None = None

        # Specialised ingest, bound once.
        if self._keyed:
            impl = self._ingest_keyed_lanes if self._multi else self._ingest_keyed_one
        else:
            impl = self._ingest_queue_lanes if self._multi else self._ingest_queue_one
        self.ingest = impl  # type: ignore[method-assign]

    # ------------------------------------------------------------------ introspection
    @property
    def name(self) -> str:
        return self._name

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def ordering(self) -> Ordering | None:
        return self._ordering

    @property
    def overflow(self) -> Overflow | None:
        return self._overflow

    @property
    def pending(self) -> int:
        """Items (keyed modes: keys) waiting to be drained."""
        return self._depth()

    def __len__(self) -> int:
        return self._depth()

    @property
    def lanes(self) -> tuple[Hashable, ...]:
        """Lane names seen so far, in creation order (lanes are kept for their metrics)."""
        return tuple(ln.name for ln in self._lane_list)

    def lane_pending(self, lane: Hashable) -> int:
        """Pending count of one lane (0 for a lane never seen)."""
        ln = self._lanes.get(lane)
        return 0 if ln is None else len(ln.store)

    def __repr__(self) -> str:
        return (
            f"IngressBuffer(name={self._name!r}, mode={self._mode.value!r}, "
            f"pending={self._depth()}, capacity={self._capacity}, lanes={len(self._lane_list)})"
        )

    # ------------------------------------------------------------------ lanes
    def _check_priority(self, lane: Hashable, prio: object) -> int:
        try:
            if isinstance(prio, bool):
                raise TypeError
            prio = operator.index(prio)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"ingress buffer {self._name!r}: priority of lane {lane!r} must be an int, "
                f"got {type(prio).__name__}"
            ) from None
        if prio < 1:
            raise ValueError(
                f"ingress buffer {self._name!r}: priority of lane {lane!r} must be >= 1, got {prio}"
            )
        return prio

    def _new_lane(self, name: Hashable) -> _Lane:
        """First sight of a lane: fix its priority (evaluated once) and file it in its class."""
        try:
            hash(name)
        except TypeError:
            raise TypeError(
                f"ingress buffer {self._name!r}: lane classifier returned unhashable {name!r}"
            ) from None
        lp = self._lane_priority
        if lp is None:
            prio = DEFAULT_PRIORITY
        elif isinstance(lp, Mapping):
            prio = lp.get(name, DEFAULT_PRIORITY)
        else:
            prio = lp(name)
        prio = self._check_priority(name, prio)
        cls = self._class_of.get(prio)
        if cls is None:
            cls = _PriorityClass(prio)
            self._class_of[prio] = cls
            self._classes_desc = sorted(self._class_of.values(), key=lambda c: -c.priority)
            self._classes_asc = self._classes_desc[::-1]
        lane = self._lane_cls(name, prio, len(cls.lanes), self._index)
        cls.lanes.append(lane)
        self._lanes[name] = lane
        self._lane_list.append(lane)
        return lane

    def _losing_lane(self) -> _Lane:
        """Lowest priority non-empty lane; equal candidates take turns (seed §11)."""
        if not self._multi:
            return self._default  # type: ignore[return-value]
        for cls in self._classes_asc:
            lanes = cls.lanes
            m = len(lanes)
            start = cls.evict_last + 1
            for i in range(m):
                j = (start + i) % m
                lane = lanes[j]
                if lane.store:
                    cls.evict_last = j
                    return lane
        raise AssertionError("capacity contest with no pending lane")  # pragma: no cover

    # ------------------------------------------------------------------ hooks
    def _emit(self, hook: Callable[[Any], object], payload: object, which: str) -> None:
        """Run a hook; its failure is logged and counted, never allowed to unwind our state."""
        try:
            hook(payload)
        except Exception:
            self._hook_errors += 1
            self._log.exception("ingress buffer %r: %s hook raised", self._name, which)

    def _bad_key(self, item: Any, lane: Hashable, detail: str) -> IngestResult:
        self._drops[_R_BAD_KEY] += 1
        self._log.warning(
            "ingress buffer %r: %s; item dropped (reason bad_key)", self._name, detail
        )
        if self._on_drop is not None:
            self._emit(self._on_drop, DropInfo(DropReason.BAD_KEY, item, None, lane), "on_drop")
        return _DROPPED

    # ------------------------------------------------------------------ ingest
    def ingest(self, item: Any) -> IngestResult:
        """Admit one item at arrival time (bound per instance to a specialised path).

        Keyed modes: a new key is enqueued (at capacity the losing lane's least-recently-seen
        key is evicted, possibly this very key); a pending key has its last-seen refreshed and
        is deduped (``dedup_set``) or has its item replaced (``latest_by_key``), migrating to
        the item's lane if the classification changed. ``queue``: the item is appended to its
        lane; at capacity the overflow policy is applied to the losing lane.
        ``key(item) is None`` (or an unhashable key) drops the item as ``bad_key``.
        """
        raise NotImplementedError  # pragma: no cover - replaced in __init__

    def _ingest_queue_one(self, item: Any) -> IngestResult:
        kf = self._key
        if kf is not None and kf(item) is None:
            return self._bad_key(item, DEFAULT_LANE, "key(item) returned None")
        lane: _Lane = self._default  # type: ignore[assignment]
        if self._queued >= self._capacity:
            return self._queue_full(item, lane)
        self._seq = seq = self._seq + 1
        lane.store.append((seq, item))
        self._queued = p = self._queued + 1
        if p > self._peak:
            self._peak = p
            if p > lane.peak:
                lane.peak = p
        return _ENQUEUED

    def _ingest_queue_lanes(self, item: Any) -> IngestResult:
        ln = self._lane_fn(item)  # type: ignore[misc]
        if ln is None:
            ln = DEFAULT_LANE
        kf = self._key
        if kf is not None and kf(item) is None:
            return self._bad_key(item, ln, "key(item) returned None")
        try:
            lane = self._lanes[ln]
        except (KeyError, TypeError):
            lane = self._new_lane(ln)
        if self._queued >= self._capacity:
            return self._queue_full(item, lane)
        self._seq = seq = self._seq + 1
        q = lane.store
        q.append((seq, item))
        self._queued = p = self._queued + 1
        if p > self._peak:
            self._peak = p
        if len(q) > lane.peak:
            lane.peak = len(q)
        return _ENQUEUED

    def _queue_full(self, item: Any, lane: _Lane) -> IngestResult:
        """Admit-then-evict: the arriving item joins its lane, then the losing lane pays."""
        policy = self._overflow
        if policy is Overflow.FAIL:
            self._drops[_R_OVERFLOW] += 1
            lane.dropped += 1
            self._log.warning(
                "ingress buffer %r: full (%d items), item for lane %r refused (reason overflow)",
                self._name,
                self._capacity,
                lane.name,
            )
            if self._on_drop is not None:
                k = self._key(item) if self._key is not None else None
                self._emit(
                    self._on_drop, DropInfo(DropReason.OVERFLOW, item, k, lane.name), "on_drop"
                )
            raise IngressOverflowError(self._name, self._capacity, lane.name, item)
        self._seq = seq = self._seq + 1
        q = lane.store
        q.append((seq, item))
        # The arrival sits in its lane while the loser is chosen; one in, one out leaves
        # _queued unchanged, so it is only touched when a whole lane goes.
        victim = self._losing_lane() if self._multi else lane
        vq: deque[tuple[int, Any]] = victim.store
        if policy is Overflow.DROP_BUFFER:
            dropped = list(vq)
            vq.clear()
            self._queued -= len(dropped) - 1
        else:
            dropped = [vq.popleft() if policy is Overflow.DROP_OLDEST else vq.pop()]
        nd = len(dropped)
        self._drops[self._policy_index] += nd
        victim.dropped += nd
        if len(q) > lane.peak:
            lane.peak = len(q)
        if self._on_drop is not None:
            kf = self._key
            vname = victim.name
            reason = _REASONS[self._policy_index]
            for _, it in dropped:
                self._emit(
                    self._on_drop,
                    DropInfo(reason, it, kf(it) if kf is not None else None, vname),
                    "on_drop",
                )
        return _DROPPED if dropped[-1][0] == seq else _ENQUEUED

    def _ingest_keyed_one(self, item: Any) -> IngestResult:
        k = self._key(item)  # type: ignore[misc]
        if k is None:
            return self._bad_key(item, DEFAULT_LANE, "key(item) returned None")
        lane: _Lane = self._default  # type: ignore[assignment]
        store = lane.store
        try:
            e = store.get(k)
        except TypeError:
            return self._bad_key(item, DEFAULT_LANE, f"unhashable key {k!r}")
        self._seq = seq = self._seq + 1
        if e is not None:
            e[0] = seq
            store.move_to_end(k)
            if self._latest:
                old = e[1]
                e[1] = item
                self._replaced += 1
                if self._on_replace is not None:
                    self._emit(self._on_replace, ReplaceInfo(old, item, k, lane.name), "on_replace")
                return _REPLACED
            self._deduped += 1
            return _DEDUPED
        p = len(store)  # the pending depth before this key
        if p >= self._capacity:
            return self._keyed_full(item, k, lane, seq)
        e = [seq, item, lane, k]
        store[k] = e
        if self._fifo:
            lane.fifo.append(e)  # type: ignore[union-attr]
        if p >= self._peak:
            self._peak = p = p + 1
            if p > lane.peak:
                lane.peak = p
        return _ENQUEUED

    def _ingest_keyed_lanes(self, item: Any) -> IngestResult:
        ln = self._lane_fn(item)  # type: ignore[misc]
        if ln is None:
            ln = DEFAULT_LANE
        k = self._key(item)  # type: ignore[misc]
        if k is None:
            return self._bad_key(item, ln, "key(item) returned None")
        index: dict = self._index  # type: ignore[assignment]
        try:
            e = index.get(k)
        except TypeError:
            return self._bad_key(item, ln, f"unhashable key {k!r}")
        try:
            lane = self._lanes[ln]
        except (KeyError, TypeError):
            lane = self._new_lane(ln)
        self._seq = seq = self._seq + 1
        if e is not None:
            e[0] = seq
            old_lane = e[2]
            if old_lane is lane:
                lane.store.move_to_end(k)
            else:
                # Lane migration (seed §11): the key now lives where its latest classification
                # says, at the tail of the new lane (its first-enqueue slot cannot be kept).
                del old_lane.store[k]
                if self._fifo:
                    # The old lane's FIFO still holds ``e``: retire it there and continue
                    # with a fresh entry, queued at the new lane's tail.
                    old_lane.retire(e)  # type: ignore[attr-defined]
                    e = [seq, e[1], lane, k]
                    index[k] = e
                    lane.fifo.append(e)  # type: ignore[union-attr]
                else:
                    e[2] = lane
                lane.store[k] = e
                self._migrated += 1
                if len(lane.store) > lane.peak:
                    lane.peak = len(lane.store)
            if self._latest:
                old = e[1]
                e[1] = item
                self._replaced += 1
                if self._on_replace is not None:
                    self._emit(self._on_replace, ReplaceInfo(old, item, k, ln), "on_replace")
                return _REPLACED
            self._deduped += 1
            return _DEDUPED
        p = len(index)  # the pending depth before this key
        if p >= self._capacity:
            return self._keyed_full(item, k, lane, seq)
        e = [seq, item, lane, k]
        index[k] = e
        store = lane.store
        store[k] = e
        if self._fifo:
            lane.fifo.append(e)  # type: ignore[union-attr]
        if p >= self._peak:
            self._peak = p + 1
        if len(store) > lane.peak:
            lane.peak = len(store)
        return _ENQUEUED

    def _keyed_full(self, item: Any, k: Hashable, lane: _Lane, seq: int) -> IngestResult:
        """New key at capacity: admit it, then evict the LRU key of the losing lane."""
        e = [seq, item, lane, k]
        lane.store[k] = e
        if self._fifo:
            lane.fifo.append(e)  # type: ignore[union-attr]
        index = self._index
        if index is not None:
            index[k] = e
        # One key in, one key out: the pending depth is unchanged.
        victim = self._losing_lane() if self._multi else lane
        vk, ve = victim.store.popitem(False)
        if self._fifo:
            victim.retire(ve)  # type: ignore[attr-defined]
        if index is not None:
            del index[vk]
        self._drops[_R_EVICT_LRU] += 1
        victim.dropped += 1
        if len(lane.store) > lane.peak:
            lane.peak = len(lane.store)
        if self._on_drop is not None:
            self._emit(
                self._on_drop, DropInfo(DropReason.EVICT_LRU, ve[1], vk, victim.name), "on_drop"
            )
        return _DROPPED if ve is e else _ENQUEUED

    def ingest_many(self, items: Iterable[Any]) -> None:
        """Same outcome as ``for item in items: buffer.ingest(item)``, with less per-item cost.

        A ``queue`` buffer without lanes and key function fills its free room with one C-level
        ``deque.extend``; once full, items go through the per-item overflow path. With
        ``overflow="fail"`` the error stops the batch at the refused item; earlier items stay.
        """
        impl = self.ingest
        if self._keyed or self._multi or self._key is not None:
            for item in items:
                impl(item)
            return
        lane: _Lane = self._default  # type: ignore[assignment]
        q = lane.store
        it = iter(items)
        while True:
            room = self._capacity - self._queued
            if room > 0:
                before = len(q)
                q.extend(zip(count(self._seq + 1), islice(it, room)))
                added = len(q) - before
                self._seq += added
                self._queued = p = self._queued + added
                if p > self._peak:
                    self._peak = p
                if p > lane.peak:
                    lane.peak = p
                if added < room:
                    return
            for item in it:
                impl(item)
                break
            else:
                return

    # ------------------------------------------------------------------ drain
    def drain(
        self,
        max_items: int,
        handle: Handler,
        *,
        max_millis: float | None = None,
        now_millis: Clock | None = None,
    ) -> DrainStats:
        """Hand up to ``max_items`` pending items to ``handle``, highest lane priority first.

        Lanes of equal priority share the budget round-robin, one item each in turn, starting
        one lane further on each drain. ``max_millis`` limits the time spent (handler included)
        when ``now_millis`` is supplied; without a clock it is ignored (warned once). A time
        budget that is not a number > 0, a clock that returns a non-number, or (checked after
        each item) a clock that goes backwards ends the drain at once with a warning; items
        already handed out stay handled, ``spent_millis`` is then ``None``.

        If ``handle`` raises, the item it received counts as drained, the exception propagates,
        and the drop/replace deltas roll over to the next drain. ``drain`` is not reentrant
        (a handler may ``ingest`` into this buffer, but not ``drain`` it).
        """
        if type(max_items) is not int:
            max_items = _as_count(max_items, "max_items")
        elif max_items < 0:
            raise ValueError(f"max_items must be >= 0, got {max_items}")
        if not callable(handle):
            raise TypeError("handle must be callable")
        if self._draining:
            raise RuntimeError(f"ingress buffer {self._name!r}: drain() is not reentrant")
        log = self._log
        if self._warn_ordering:
            log.warning(
                "ingress buffer %r: ordering=%r is ignored in mode 'queue' (always FIFO per lane)",
                self._name,
                self._ordering_set.value,  # type: ignore[union-attr]
            )
        budget = max_items
        t0: float | None = None
        limit: float | None = None
        timed = False
        if now_millis is not None:
            if max_millis is not None and not _is_positive_budget(max_millis):
                log.warning(
                    "ingress buffer %r: max_millis=%r is not a number > 0; drained 0 items",
                    self._name,
                    max_millis,
                )
                budget = 0
            t0 = now_millis()
            if not _is_time(t0):
                log.warning(
                    "ingress buffer %r: now_millis() returned %r, not a number; drained 0 items",
                    self._name,
                    t0,
                )
                t0 = None
                budget = 0
            else:
                timed = True
                if budget and max_millis is not None:
                    limit = max_millis
        elif max_millis is not None and not self._warned_no_clock:
            self._warned_no_clock = True
            log.warning(
                "ingress buffer %r: max_millis given without now_millis; time budget ignored",
                self._name,
            )
        if self._on_drain_start is not None:
            self._emit(
                self._on_drain_start,
                DrainStartInfo(t0, max_items, max_millis),
                "on_drain_start",
            )

        drained0 = self._drained
        clock_ok = True
        t_last = t0
        self._draining = True
        try:
            if budget > 0 and (self._depth() if self._keyed else self._queued) > 0:
                if limit is None:
                    self._run(budget, handle)
                else:
                    clock_ok, t_last = self._run_timed(budget, handle, now_millis, t0, limit)  # type: ignore[arg-type]
        except BaseException:
            self._drain_calls += 1
            raise
        finally:
            self._draining = False

        spent: float | None = None
        if timed and clock_ok:
            t_end = now_millis()  # type: ignore[misc]
            if _is_time(t_end) and t_end >= t_last:  # type: ignore[operator]
                spent = t_end - t0  # type: ignore[operator]
            else:
                self._warn_clock(t_end, t_last)
        drops = sum(self._drops)
        dropped = drops - self._mark_dropped
        self._mark_dropped = drops
        replaced = self._replaced - self._mark_replaced
        self._mark_replaced = self._replaced
        pending = self._depth() if self._keyed else self._queued
        stats = DrainStats(self._drained - drained0, pending, dropped, replaced, spent)
        self._last_drain = stats
        self._drain_calls += 1
        span = self._seq_span()
        self._samples += 1
        self._sum_pending += pending
        self._sum_span += span
        if self._ema_pending is None:
            self._ema_pending = float(pending)
            self._ema_span = float(span)
        else:
            self._ema_pending += EMA_ALPHA * (pending - self._ema_pending)
            self._ema_span += EMA_ALPHA * (span - self._ema_span)  # type: ignore[operator]
        if self._on_drain_end is not None:
            self._emit(self._on_drain_end, stats, "on_drain_end")
        return stats

    def _warn_clock(self, t: object, last: object) -> None:
        if _is_time(t):
            self._log.warning(
                "ingress buffer %r: now_millis() went backwards (%r after %r); drain stopped",
                self._name,
                t,
                last,
            )
        else:
            self._log.warning(
                "ingress buffer %r: now_millis() returned %r, not a number; drain stopped",
                self._name,
                t,
            )

    def _run(self, budget: int, handle: Handler) -> None:
        """Item budget only: strict priority between classes, round-robin inside a class."""
        n = 0
        for cls in self._classes_desc:
            if n >= budget:
                return
            lanes = cls.lanes
            if len(lanes) == 1:
                lane = lanes[0]
                if lane.store:
                    n += lane.take(budget - n, handle, self)
                continue
            n += self._run_class(cls, budget - n, handle)

    def _run_class(self, cls: _PriorityClass, k: int, handle: Handler) -> int:
        """Round-robin over the non-empty lanes of one class, one item per lane per turn.

        The first round uses each lane's ``pop`` (cheap for the small drains of a rate slot or
        a tick). After it, as many full rounds as every lane and the budget allow run as one
        batch in ``_rounds`` (the multi-lane drain hot path); a budget smaller than a round is
        spent one item per lane in turn; one lane left drains in a single ``take``. Emptiness
        is re-checked per item because a handler may ingest into this buffer and evict from a
        lane we are about to visit.
        """
        lanes = cls.lanes
        m = len(lanes)
        start = cls.drain_next
        queued = not self._keyed
        n = 0
        taken = 0  # items handed out by take()/_rounds(), which do their own _drained accounting
        last: _Lane | None = None
        try:
            for i in range(m):
                lane = lanes[(start + i) % m]
                if not lane.store:
                    continue
                n += 1
                if queued:
                    self._queued -= 1
                lane.drained += 1
                last = lane
                handle(lane.pop())
                if n >= k:
                    return n
            order = [lanes[(start + i) % m] for i in range(m)]
            active = [ln for ln in order if ln.store]
            while n < k and active:
                a = len(active)
                if a == 1:
                    last = active[0]
                    t = last.take(k - n, handle, self)
                    n += t
                    taken += t
                    break
                rounds = min(min(len(ln.store) for ln in active), (k - n) // a)
                if rounds:
                    if last is not None:  # _rounds records its own last lane, even on error
                        cls.drain_next = (last.slot + 1) % m
                        last = None
                    t = self._rounds(cls, m, active, rounds, handle)
                    n += t
                    taken += t
                else:
                    # Less budget left than one full round.
                    for lane in active:
                        if not lane.store:
                            continue
                        n += 1
                        if queued:
                            self._queued -= 1
                        lane.drained += 1
                        last = lane
                        handle(lane.pop())
                        if n >= k:
                            break
                active = [ln for ln in active if ln.store]
        finally:
            self._drained += n - taken
            if last is not None:
                cls.drain_next = (last.slot + 1) % m
        return n

    def _rounds(
        self, cls: _PriorityClass, m: int, active: list[_Lane], rounds: int, handle: Handler
    ) -> int:
        """Up to ``rounds`` full round-robin rounds over ``active`` (each lane holds that many).

        ``m`` is the class size when its drain began (the rotation modulus, as in the caller).

        Per item the loop only takes the item out of its lane and calls the handler (plus the
        ``queue`` counter, the only pending depth that is not derived). The counts -- handed
        out, per lane drained, the lane that opens the next drain -- are settled once, from the
        round number and the lane position, which are exact also when the handler raises (the
        item it received counts as drained, as everywhere). A lane changes under us only if a
        handler ingests, and every admitted ingest takes a sequence number: then the batch
        ends after the current round and the caller re-checks which lanes are non-empty, at
        the point where a round-by-round loop would.
        """
        seq0 = self._seq
        index: dict = self._index  # type: ignore[assignment]
        skips: list[tuple[int, _Lane]] = []  # (round, lane) visits that found the lane empty
        rnd = 0
        lane: _Lane | None = None
        ok = False
        try:
            if not self._keyed:
                turns = [(ln, ln.store, ln.store.popleft) for ln in active]
                for rnd in range(rounds):
                    for lane, q, pop in turns:
                        if not q:
                            skips.append((rnd, lane))
                            continue
                        self._queued -= 1
                        handle(pop()[1])
                    if self._seq != seq0:
                        break
            elif self._fifo:
                turns = [(ln, ln.store, ln.fifo.popleft) for ln in active]  # type: ignore[union-attr]
                for rnd in range(rounds):
                    for lane, store, pop in turns:
                        if not store:
                            skips.append((rnd, lane))
                            continue
                        e = pop()
                        while e[2] is None:
                            lane.stale -= 1
                            e = pop()
                        key = e[3]
                        del store[key]
                        del index[key]
                        handle(e[1])
                    if self._seq != seq0:
                        break
            else:
                turns = [(ln, ln.store, ln.store.popitem) for ln in active]
                for rnd in range(rounds):
                    for lane, store, pop in turns:
                        if not store:
                            skips.append((rnd, lane))
                            continue
                        key, e = pop(False)
                        del index[key]
                        handle(e[1])
                    if self._seq != seq0:
                        break
            ok = True
        finally:
            # Visits: `full` complete rounds, then positions 0..pos of the round under way.
            if ok:
                full, pos = rnd + 1, -1
            else:
                full, pos = rnd, (-1 if lane is None else active.index(lane))
            handed = 0
            for i, ln in enumerate(active):
                d = full + (i <= pos)
                if skips:
                    d -= sum(1 for s in skips if s[1] is ln)
                ln.drained += d
                handed += d
            self._drained += handed
            last = self._last_served(active, full, pos, skips)
            if last is not None:
                cls.drain_next = (last.slot + 1) % m
        return handed

    @staticmethod
    def _last_served(
        active: list[_Lane], full: int, pos: int, skips: list[tuple[int, _Lane]]
    ) -> _Lane | None:
        """The lane of the latest visit that handed out an item (skips are rare: walk back)."""
        a = len(active)
        rnd, i = (full, pos) if pos >= 0 else (full - 1, a - 1)
        skipped = set(skips)
        while rnd >= 0:
            if (rnd, active[i]) not in skipped:
                return active[i]
            i -= 1
            if i < 0:
                rnd, i = rnd - 1, a - 1
        return None

    def _run_timed(
        self, budget: int, handle: Handler, clock: Clock, t0: float, limit: float
    ) -> tuple[bool, float]:
        """Item and time budget: same order as ``_run``, clock checked after every item."""
        n = 0
        last = t0
        queued = not self._keyed
        for cls in self._classes_desc:
            lanes = cls.lanes
            m = len(lanes)
            start = cls.drain_next
            active = [lanes[(start + i) % m] for i in range(m)]
            active = [ln for ln in active if ln.store]
            while active:
                for lane in active:
                    if not lane.store:
                        continue
                    item = lane.pop()
                    n += 1
                    if queued:
                        self._queued -= 1
                    self._drained += 1
                    lane.drained += 1
                    cls.drain_next = (lane.slot + 1) % m
                    handle(item)
                    t = clock()
                    if not _is_time(t) or t < last:
                        self._warn_clock(t, last)
                        return False, last
                    last = t
                    if n >= budget or t - t0 >= limit:
                        return True, last
                active = [ln for ln in active if ln.store]
        return True, last

    # ------------------------------------------------------------------ metrics
    def _seq_bounds(self) -> tuple[int | None, int | None]:
        """Oldest and newest last-seen sequence numbers pending (O(lanes), sampled per drain)."""
        lo: int | None = None
        hi: int | None = None
        keyed = self._keyed
        for lane in self._lane_list:
            store = lane.store
            if not store:
                continue
            if keyed:
                a = next(iter(store.values()))[0]
                b = store[next(reversed(store))][0]
            else:
                a = store[0][0]
                b = store[-1][0]
            if lo is None or a < lo:
                lo = a
            if hi is None or b > hi:
                hi = b
        return lo, hi

    def _seq_span(self) -> int:
        lo, hi = self._seq_bounds()
        return 0 if lo is None else hi - lo  # type: ignore[operator]

    def _totals(self) -> tuple[int, ...]:
        return (
            self._seq,
            self._deduped,
            self._replaced,
            self._drained,
            self._drain_calls,
            self._migrated,
            self._hook_errors,
        )

    def metrics(self) -> BufferMetrics:
        """Pull a snapshot; cost is O(lanes), nothing is maintained for it on the hot path."""
        seq, deduped, replaced, drained, calls, migrated, hook_errors = (
            now - base for now, base in zip(self._totals(), self._base, strict=True)
        )
        ingested = seq  # every admitted ingest takes exactly one sequence number
        by_reason = {
            r.value: self._drops[i] - self._base_drops[i]
            for i, r in enumerate(_REASONS)
            if self._reason_applies(r)
        }
        lo, hi = self._seq_bounds()
        lanes: dict[Hashable, LaneMetrics] = {}
        for lane in self._lane_list:
            if lane.store:
                a, b = lane.oldest_seq(), lane.newest_seq()
            else:
                a = b = None
            lanes[lane.name] = LaneMetrics(
                priority=lane.priority,
                pending=len(lane.store),
                peak_pending=lane.peak,
                drained_total=lane.drained - lane.base_drained,
                dropped_total=lane.dropped - lane.base_dropped,
                oldest_seq=a,
                newest_seq=b,
                seq_span=0 if a is None else b - a,  # type: ignore[operator]
            )
        samples = self._samples
        return BufferMetrics(
            name=self._name,
            mode=self._mode,
            capacity=self._capacity,
            ordering=self._ordering,
            overflow=self._overflow,
            ingest_seq_now=self._seq,
            oldest_seq=lo,
            newest_seq=hi,
            seq_span=0 if lo is None else hi - lo,  # type: ignore[operator]
            pending=self._depth(),
            peak_pending=self._peak,
            ingested_total=ingested,
            enqueued_total=ingested - deduped - replaced,
            deduped_total=deduped,
            replaced_total=replaced,
            dropped_total=sum(self._drops) - sum(self._base_drops),
            drained_total=drained,
            drain_calls_total=calls,
            dropped_by_reason=by_reason,
            migrated_total=migrated,
            hook_errors_total=hook_errors,
            last_drain=self._last_drain,
            avg_pending=self._sum_pending / samples if samples else None,
            avg_seq_span=self._sum_span / samples if samples else None,
            ema_pending=self._ema_pending,
            ema_seq_span=self._ema_span,
            lanes=lanes,
        )

    def _reason_applies(self, reason: DropReason) -> bool:
        if reason is DropReason.BAD_KEY:
            return True
        if self._keyed:
            return reason is DropReason.EVICT_LRU
        return reason is _POLICY_REASON[self._overflow]  # type: ignore[index]

    def metrics_reset(self) -> None:
        """Restart totals, peaks and averages; contents, order, lanes and pointers stay put.

        Peaks restart from the current depth. Drain deltas are unaffected (they are measured
        from the previous drain, not from the reset), as is ``last_drain``.
        """
        self._base = self._totals()
        self._base_drops = list(self._drops)
        self._peak = self._depth()
        for lane in self._lane_list:
            lane.base_drained = lane.drained
            lane.base_dropped = lane.dropped
            lane.peak = len(lane.store)
        self._samples = 0
        self._sum_pending = 0
        self._sum_span = 0
        self._ema_pending = None
        self._ema_span = None
