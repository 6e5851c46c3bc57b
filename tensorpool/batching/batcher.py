"""RateAwareMessageBatcher: pulse-aligned batching across streams (seed 000).

Model
-----
Messages arrive as ``(stream_id, timestamp_ns, item)``; ``item`` is opaque (a
payload, a ring offset, anything). The batcher cuts them into consecutive windows
``[window_start_ns, window_end_ns)`` of ``batch_length_ns`` and hands each closed
window out as a :class:`Batch` holding, per stream, the ``(timestamp_ns, item)``
pairs that belong to it. It never reads a clock: its *logical clock* is the high-
water mark (HWM) of the timestamps it was given, and a host may add its own time
with :meth:`~RateAwareMessageBatcher.tick`.

Streams are *gated* or not (the ``gated`` policy given to the constructor). A gated
stream whose integer rate has been estimated the same at two closes
(:class:`StreamPeriodEstimator`) and gives at least one pulse per batch gets a
fixed :class:`PulseGrid`: its messages are placed on pulse slots, and it *gates*.
A window is complete when every gating stream has a message in (or past) its last
slot -- not after N messages, so a missing pulse does not hang the batch and a split
pulse does not complete it early. Everything else (non-gated streams, gated streams
whose rate is unknown, not an integer, or below one pulse per batch) is
*ungridded* and rides along by timestamp.

Routing of one message against the active window ``[start, end)``:

* gridded, its pulse owned by the window -> the window (a pulse of an earlier
  window is late and joins it too). A window owns the pulses whose nominal time is
  in ``[start - P/4, end - P/4)``; see :mod:`tensorpool.batching.grid`;
* gridded, past the window's last slot, ``ts <= end + 3*batch_length`` ->
  *overflow*: kept for the next window; the stream counts as past its last slot;
* ungridded, ``ts < end`` -> the window (late ones too); ``end <= ts <= end +
  3*batch_length`` -> *held back* for a later window, so a reading stamped in the
  future is not paired with this window's detector data;
* further ahead than ``end + 3*batch_length`` is implausible: it falls through to
  the active window -- unless the window is still empty, where it waits as a *gap
  candidate*: two candidates within ``3*batch_length`` of each other mean traffic
  resumed after a silence, and the window jumps to them; the first message that
  lands in the window turns waiting candidates into fall-throughs.

The first window opens at ``start_ns`` if given; otherwise once two messages agree
(lie within ``3*batch_length`` of each other) at the earlier of the two, so a lone
first message with a broken epoch cannot anchor the windows. Until the first batch
is emitted that window is provisional: far-ahead messages stay gap candidates even
though it holds messages, so a pair of broken messages arriving first is
overridden by the real traffic that follows.

Closing, in this order of precedence (re-applied until nothing fires):

1. gap recovery: overflow exists but no gating stream has anything in the window
   (its gridded traffic has moved past it), or two gap candidates agree. A
   non-empty window is emitted (reason ``gap``); an empty one is skipped by jumping
   to the window that owns the earliest waiting message;
2. slot gate: every gating stream is past its last slot (reason ``slot_gate``).
   The window is emitted as soon as there is proof that nothing more belongs to it
   (a message waits in overflow or hold-back, the HWM reached the timeout) or the
   host says its input is drained (:meth:`~RateAwareMessageBatcher.feed` at the
   end of each poll, :meth:`~RateAwareMessageBatcher.settle`, ``tick`` past the
   window end). So the late parts of a split last pulse still join their batch;
3. timeout: ``HWM >= start + timeout_factor * batch_length`` (default 1.2). A
   non-empty window is emitted (reason ``timeout``); an empty one is skipped.

A new HWM is clamped to ``max(old HWM, start + 3*batch_length)``: one far-future
timestamp moves the logical clock at most three batches ahead, which the next few
closes walk off, instead of pinning it and emitting millions of empty batches.

At each emitted close every stream present in the window has its grid built or
checked: a first grid needs ``INITIAL_RATE_CONFIRMATIONS`` equal estimates; a rate
change needs ``RATE_CHANGE_CONFIRMATIONS``; a grid none of whose slots the window
hit is dropped (the stream's clock no longer agrees); an origin is kept while it is
within ``MAX_ORIGIN_OFFSET_BATCHES`` windows, and a new origin must be a pulse seen
inside the window -- a stream stamped in another epoch (the "43 years off" case) is
refused and never gates, but is still delivered. Streams absent from
``ABSENT_BATCHES_FOR_EVICTION`` (5) consecutive emitted batches are forgotten and
start afresh if they return. :meth:`~RateAwareMessageBatcher.set_batch_length`
applies from the next window on, keeping each grid's origin and recomputing its
slot count (14 -> 28 for 1 s -> 2 s at 14 Hz).

Invariants (each has a test)
----------------------------
* Every message offered is delivered exactly once, in exactly one batch; none is
  dropped -- also when ``slots_per_batch == 1``. :meth:`flush` delivers whatever
  is still buffered. No batch is empty.
* Window starts strictly increase; windows never overlap.
* A stream that does not gate (non-gated, ungridded, sub-Hz, evicted, refused)
  never holds a window open; a gating stream that falls silent holds it at most
  until the timeout, and is evicted after five absent batches.
* An ungridded message in a batch has ``ts < window_end`` unless it was
  implausibly far ahead (``> window_end + 3*batch_length``) when it arrived.
* The HWM never decreases, and a timestamp moves it at most to the active window
  start plus three batch lengths.
* A grid's origin survives batch-length changes while it is plausible.
* Output is a pure function of the sequence of calls: the same calls produce the
  same batches, and :meth:`snapshot` / :meth:`restore` resume it exactly.

Contract departures from a fixed-interval batcher
--------------------------------------------------
A fixed-interval (or count-based) batcher emits one batch per interval, each with
the messages whose timestamps fall inside it. This one deliberately does not:

1. **No placeholder batches.** After a silence the window jumps to where traffic
   resumes; no empty batch is emitted for the silent intervals (in fact an empty
   window is never emitted at all). Consumers that drive heartbeats or UI ticks off
   batch arrivals see nothing during a gap, and window starts can skip ahead by
   many batch lengths.
2. **Batches are cut on the pulse grid, not on raw timestamps.** A gridded message
   goes to the window that owns its nearest pulse, so its raw timestamp may lie up
   to 3/4 of a period before ``window_start`` or 1/4 after ``window_end``. The
   seed's edge case is ``slots_per_batch == 1``: a 1 Hz stray at ``t0 + 0.6 s``
   rounds to the pulse at ``t0 + 1 s`` and is delivered with the *next* window. The
   seed's batcher emits an empty batch for the current window in that case; this
   one skips the empty window instead (departure 1). Either way the message is
   delivered exactly once, never lost.

Replay and persistence
----------------------
The batcher is a sans-IO state machine: :meth:`snapshot` returns plain data
(JSON-compatible when stream ids and items are), :meth:`restore` rebuilds an
identical batcher, and feeding it the same messages in the same polls re-cuts the
same windows. A micro-batch source (Spark ``latestOffset``) can record
``snapshot()`` next to the offsets of the windows it hands out and, on restart,
restore it and re-read the same messages to reproduce those windows exactly; each
:class:`Batch` carries a ``sequence`` number for that bookkeeping.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .estimator import DIFF_RING_SIZE, MIN_DIFFS_FOR_GATE, StreamPeriodEstimator
from .grid import PulseGrid, slots_for

__all__ = [
    "ABSENT_BATCHES_FOR_EVICTION",
    "DEFAULT_TIMEOUT_FACTOR",
    "HOLD_BATCHES",
    "INITIAL_RATE_CONFIRMATIONS",
    "MAX_ORIGIN_OFFSET_BATCHES",
    "MIN_DIFFS_FOR_GATE",
    "RATE_CHANGE_CONFIRMATIONS",
    "SNAPSHOT_VERSION",
    "Batch",
    "CloseReason",
    "RateAwareMessageBatcher",
]

#: Consecutive emitted batches without a stream before it is forgotten.
ABSENT_BATCHES_FOR_EVICTION = 5
#: Hold-back horizon, HWM clamp and gap-candidate distance, in batch lengths.
HOLD_BATCHES = 3
DEFAULT_TIMEOUT_FACTOR = 1.2
#: An existing grid origin further than this many batch lengths from the active
#: window is re-anchored on a pulse of the window (or, failing that, dropped).
MAX_ORIGIN_OFFSET_BATCHES = 1000
#: Evaluations in a row that must report the same rate before a stream gets its first
#: grid: an estimate from the first handful of jittery diffs can be off by 1 Hz.
INITIAL_RATE_CONFIRMATIONS = 2
#: Evaluations in a row in which the estimator must report the same new rate before
#: a grid changes rate. One noisy estimate (heavy jitter) must not re-grid a stream.
RATE_CHANGE_CONFIRMATIONS = 3
#: A gridded stream's rate is re-evaluated at a close only once this many new diffs
#: have entered its ring since the last evaluation: the medians are the costliest
#: thing the batcher does, and a ring that has barely changed cannot say anything new.
RATE_REEVALUATE_DIFFS = DIFF_RING_SIZE
SNAPSHOT_VERSION = 1

_NS = 1_000_000_000
_NS2 = 2 * _NS
_TS = operator.itemgetter(0)
_AT = operator.itemgetter(1)


class CloseReason(StrEnum):
    """Why a window was emitted; stable names for logs and metrics."""

    SLOT_GATE = "slot_gate"
    TIMEOUT = "timeout"
    GAP = "gap"
    FLUSH = "flush"


@dataclass(frozen=True, slots=True)
class Batch[S: Hashable, T]:
    """One closed window.

    ``messages`` maps each stream present in the window to its ``(timestamp_ns,
    item)`` pairs sorted by timestamp (arrival order among equal timestamps).
    ``sequence`` counts emitted batches from 0 and survives snapshot/restore, so a
    host can key replay records on it.
    """

    sequence: int
    window_start_ns: int
    window_end_ns: int
    reason: CloseReason
    messages: dict[S, list[tuple[int, T]]]

    @property
    def message_count(self) -> int:
        return sum(len(v) for v in self.messages.values())

    def stream(self, stream_id: S) -> list[tuple[int, T]]:
        """Messages of one stream (empty list when absent)."""
        return self.messages.get(stream_id, [])

    def items(self, stream_id: S) -> list[T]:
        return [item for _, item in self.messages.get(stream_id, [])]

    def to_state(self) -> dict[str, Any]:
        return {
            "sequence": self.sequence,
            "window_start_ns": self.window_start_ns,
            "window_end_ns": self.window_end_ns,
            "reason": self.reason.value,
            "messages": [
                [sid, [[ts, item] for ts, item in msgs]] for sid, msgs in self.messages.items()
            ],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Batch[Any, Any]:
        try:
            messages = {
                _freeze(sid): [(_int(ts, "batch message ts"), item) for ts, item in msgs]
                for sid, msgs in state["messages"]
            }
            return cls(
                _int(state["sequence"], "batch sequence"),
                _int(state["window_start_ns"], "batch window_start_ns"),
                _int(state["window_end_ns"], "batch window_end_ns"),
                CloseReason(state["reason"]),
                messages,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"batcher snapshot: malformed batch record: {exc}") from exc


_REASON_COUNTER = {reason: f"batches_{reason.value}" for reason in CloseReason}


class _Stats:
    """Counters of the rare paths (never touched per ordinary message)."""

    __slots__ = (
        "batches_flush",
        "batches_gap",
        "batches_slot_gate",
        "batches_timeout",
        "evictions",
        "far_candidates",
        "far_fallthrough",
        "gap_jumps",
        "grids_built",
        "grids_dropped",
        "held_future",
        "hwm_clamped",
        "origins_refused",
        "overflowed",
        "rate_changes",
        "silent_advances",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class _Stream:
    """Registry entry of one stream: lifetime state plus the active window's slice.

    The grid's origin, doubled rate and the active window's index range are copied
    into plain attributes so the per-message slot test is three integer operations.
    """

    __slots__ = (
        "absent",
        "bucket",
        "done",
        "est",
        "eval_mark",
        "gated",
        "grid",
        "hi",
        "last",
        "lo",
        "origin",
        "rate2",
        "sid",
        "vote_rate",
        "votes",
    )

    def __init__(self, sid: Hashable, gated: bool) -> None:
        self.sid = sid
        self.gated = gated
        self.est: StreamPeriodEstimator | None = StreamPeriodEstimator() if gated else None
        self.grid: PulseGrid | None = None
        self.origin = 0
        self.rate2 = 0
        self.lo = 0
        self.hi = 0
        self.last = 0
        self.done = False
        self.bucket: list[tuple[int, Any]] = []
        self.absent = 0
        self.vote_rate = 0
        self.votes = 0
        self.eval_mark = 0  # est.total_diffs at the last rate evaluation

    def fresh_rate(self) -> tuple[bool, int | None]:
        """``(evaluated, rate)``: the estimator's rate, if its ring changed enough.

        A stream without a grid is evaluated whenever its ring has new diffs; one
        with a grid only after ``RATE_REEVALUATE_DIFFS`` new diffs, since all it is
        looking for then is a rate change.
        """
        est = self.est
        assert est is not None
        total = est.total_diffs
        new = total - self.eval_mark
        needed = 1 if self.grid is None else RATE_REEVALUATE_DIFFS
        if est.diff_count < MIN_DIFFS_FOR_GATE or new < needed:
            return False, None
        self.eval_mark = total
        return True, est.rate_hz()

    def set_grid(self, grid: PulseGrid | None) -> None:
        self.grid = grid
        if grid is not None:
            self.origin = grid.origin_ns
            self.rate2 = 2 * grid.rate_hz


type _Pending = tuple[int, Any, Any]


class RateAwareMessageBatcher[S: Hashable, T]:
    """Cuts multi-stream traffic into pulse-aligned windows (see the module docstring).

    Parameters
    ----------
    batch_length_ns:
        Window length in nanoseconds (> 0).
    gated:
        Which streams may gate: a collection of stream ids or a predicate, decided
        once per stream when it is first seen. Required, because it is a property of
        the data: a gated stream is expected to be pulsed; an irregular stream that
        is gated by mistake can happen to snap to an integer rate and hold windows
        open until the timeout.
    timeout_factor:
        Close an incomplete window once the HWM is this many batch lengths past its
        start; in ``(0, HOLD_BATCHES]`` because the HWM never runs further ahead.
    start_ns:
        Start of the first window, e.g. the host's "now". Without it the first
        window opens at the earlier of the first two messages that lie within
        ``3*batch_length`` of each other, and stays provisional until it is emitted
        (see the module docstring).
    """

    def __init__(
        self,
        batch_length_ns: int,
        *,
        gated: Collection[S] | Callable[[S], bool],
        timeout_factor: float = DEFAULT_TIMEOUT_FACTOR,
        start_ns: int | None = None,
    ) -> None:
        self._policy = _gate_policy(gated)
        self._L = _positive_ns(batch_length_ns, "batch_length_ns")
        if not isinstance(timeout_factor, int | float) or isinstance(timeout_factor, bool):
            raise TypeError(f"timeout_factor must be a number, got {timeout_factor!r}")
        if not 0 < timeout_factor <= HOLD_BATCHES:
            raise ValueError(
                f"timeout_factor must be in (0, {HOLD_BATCHES}] (the HWM never runs further "
                f"than {HOLD_BATCHES} batch lengths ahead), got {timeout_factor}"
            )
        self._factor = float(timeout_factor)
        self._pending_L: int | None = None
        self._timeout_ns = 0
        self._hold_ns = 0
        self._derive_lengths()

        self._streams: dict[S, _Stream] = {}
        self._start: int | None = None
        self._end = 0
        self._deadline = 0
        self._hwm_cap = 0  # start + hold: the HWM clamp of the active window
        self._hwm: int | None = None
        # Active-window bookkeeping, maintained incrementally so the per-message
        # close test is two comparisons.
        self._empty = True  # no message in the active window yet
        self._unsat = -1  # gating streams not yet past their last slot; -1: none gate
        self._wake = False  # something may need closing/jumping: run _settle
        self._overflow: list[_Pending] = []
        self._far: list[_Pending] = []
        self._future: list[_Pending] = []
        self._closed: list[Batch[S, T]] = []
        self._seq = 0
        self._stats = _Stats()
        # Before the first window: messages that do not yet agree with another one.
        self._boot: list[tuple[S, int, T]] = []
        # The first window was anchored on messages and nothing has been emitted yet.
        self._provisional = False
        if start_ns is not None:
            start = _ns(start_ns, "start_ns")
            self._hwm = start
            self._open(start)

    # -- configuration and introspection ---------------------------------------

    @property
    def batch_length_ns(self) -> int:
        """Length of the active window."""
        return self._L

    @property
    def pending_batch_length_ns(self) -> int | None:
        return self._pending_L

    @property
    def timeout_factor(self) -> float:
        return self._factor

    @property
    def window(self) -> tuple[int, int] | None:
        """Active window ``(start_ns, end_ns)``, or ``None`` before the first message."""
        if self._start is None:
            return None
        return self._start, self._end

    @property
    def high_water_mark_ns(self) -> int | None:
        return self._hwm

    @property
    def streams(self) -> tuple[S, ...]:
        """Streams currently tracked (evicted ones are gone)."""
        return tuple(self._streams)

    @property
    def stats(self) -> dict[str, int]:
        return self._stats.as_dict()

    @property
    def buffered_count(self) -> int:
        """Messages accepted but not yet in an emitted (or queued) batch."""
        in_window = sum(len(st.bucket) for st in self._streams.values())
        pending = len(self._overflow) + len(self._far) + len(self._future) + len(self._boot)
        return in_window + pending

    def grid_of(self, stream_id: S) -> PulseGrid | None:
        st = self._streams.get(stream_id)
        return None if st is None else st.grid

    def estimator_of(self, stream_id: S) -> StreamPeriodEstimator | None:
        """The rate estimator of a tracked gated stream (``None`` for others)."""
        st = self._streams.get(stream_id)
        return None if st is None else st.est

    def is_gating(self, stream_id: S) -> bool:
        """True when the stream currently has a grid and so can hold a window open."""
        st = self._streams.get(stream_id)
        return st is not None and st.grid is not None

    def blocking_streams(self) -> tuple[S, ...]:
        """Gating streams that have not yet reached their last slot of the active window."""
        return tuple(
            sid for sid, st in self._streams.items() if st.grid is not None and not st.done
        )

    def set_batch_length(self, batch_length_ns: int) -> None:
        """Use a new length from the next window on; the active window keeps its length.

        Grids keep their origin; their slot count is recomputed (14 Hz: 1 s -> 14
        slots, 2 s -> 28). A stream with fewer than one pulse per new batch stops
        gating; a converged one that now reaches a pulse per batch starts gating
        once it shows up in a window. The last value set before a close wins.
        """
        self._pending_L = _positive_ns(batch_length_ns, "batch_length_ns")

    # -- input -------------------------------------------------------------------

    def offer(self, stream_id: S, timestamp_ns: int, item: T) -> int:
        """Route one message; return the number of batches this closed (see :meth:`take`)."""
        ts = timestamp_ns if type(timestamp_ns) is int else _ns(timestamp_ns, "timestamp_ns")
        st = self._streams.get(stream_id)
        if st is None:
            # Streams are registered only once a window exists, so this one test
            # also covers the bootstrap phase.
            if self._start is None:
                return self._bootstrap(stream_id, ts, item)
            st = self._add_stream(stream_id)
        if ts > self._hwm:  # type: ignore[operator]
            if ts <= self._hwm_cap:
                self._hwm = ts
            else:
                self._far_ahead_clock(ts)
        est = st.est
        if est is not None:
            est.observe(ts)
        # The two common cases are inlined; everything else goes through _route.
        if st.grid is not None:
            idx = ((ts - st.origin) * st.rate2 + _NS) // _NS2
            if idx < st.hi:
                if self._empty:
                    self._first_content()
                st.bucket.append((ts, item))
                if idx >= st.last and not st.done:
                    self._mark_done(st)
            else:
                self._route(st, ts, item)
        elif ts < self._end:
            if self._empty:
                self._first_content()
            st.bucket.append((ts, item))
        else:
            self._route(st, ts, item)
        if self._wake or self._hwm >= self._deadline:  # type: ignore[operator]
            return self._settle(False)
        return 0

    def feed(self, messages: Iterable[tuple[S, int, T]]) -> list[Batch[S, T]]:
        """Offer a polled chunk in order, :meth:`settle`, and return all closed batches.

        One call per poll of the transport: the parts of a split pulse that arrive
        in one poll stay in one batch, and a window whose gate the chunk satisfied
        is closed before returning.
        """
        offer = self.offer
        for sid, ts, item in messages:
            offer(sid, ts, item)
        self.settle()
        return self.take()

    def settle(self) -> int:
        """Declare the input drained for now: close a window whose gate is satisfied.

        :meth:`offer` closes a satisfied window only when a message shows up that
        belongs to a later window, so that late parts of a split last pulse still
        join it; a host that polls in chunks calls this (or uses :meth:`feed`) after
        each chunk. Returns the number of batches closed.
        """
        if self._start is None:
            return 0
        return self._settle(True)

    def tick(self, now_ns: int) -> int:
        """Advance the logical clock without a message (e.g. an idle heartbeat).

        Subject to the same clamp as a message timestamp. Once ``now_ns`` reaches
        the active window's end, a satisfied window is closed as by :meth:`settle`.
        Before the first message it does nothing: there is no window to time out.
        """
        now = _ns(now_ns, "now_ns")
        start = self._start
        if start is None:
            return 0
        if now > self._hwm:  # type: ignore[operator]
            if now <= self._hwm_cap:
                self._hwm = now
            else:
                self._clamp_hwm(self._hwm_cap)
        if now >= self._end:
            return self._settle(True)
        if self._wake or self._hwm >= self._deadline:  # type: ignore[operator]
            return self._settle(False)
        return 0

    def take(self) -> list[Batch[S, T]]:
        """Return and forget the batches closed so far, oldest first."""
        closed = self._closed
        self._closed = []
        return closed

    def flush(self) -> list[Batch[S, T]]:
        """Close the active window now and deliver everything still buffered.

        For end of stream or a trigger that must drain (Spark ``availableNow``).
        Overflow, held-back and candidate messages go out in the windows that own
        them (skipping empty windows). The batcher stays usable afterwards.
        """
        if self._start is None and self._boot:
            pool = self._boot
            self._boot = []
            first = min(ts for _, ts, _ in pool)
            self._hwm = first
            self._open(first)
            self._provisional = True
            for p_sid, p_ts, p_item in pool:
                self.offer(p_sid, p_ts, p_item)
        if self._start is not None:
            self._settle(True)  # complete windows keep their real reason
            while True:
                if not self._empty:
                    self._close(CloseReason.FLUSH)
                    continue
                pending = self._overflow + self._future + self._far
                if not pending:
                    break
                self._stats.gap_jumps += 1
                self._advance(self._windows_until(min(pending, key=_TS)))
        self._wake = False
        return self.take()

    # -- core --------------------------------------------------------------------

    def _bootstrap(self, sid: S, ts: int, item: T) -> int:
        """Open the first window once two messages agree on where time is.

        A lone first message may carry a broken timestamp (a wrong epoch, a unit
        error); anchoring the windows on it would strand every later message. So
        messages are pooled until one lies within the hold-back horizon of another;
        the window opens at the earlier of the two, and the pool is replayed through
        :meth:`offer`, the agreeing pair first, so that an outlier meets a window
        that already has content and cannot steer it.
        """
        hold = self._hold_ns
        partner = None
        for pooled in self._boot:
            if abs(pooled[1] - ts) <= hold:
                partner = pooled
                break
        if partner is None:
            self._boot.append((sid, ts, item))
            return 0
        pool = self._boot
        self._boot = []
        anchor = min(partner[1], ts)
        self._hwm = anchor
        self._open(anchor)
        self._provisional = True
        replay = sorted([partner, (sid, ts, item)], key=_AT)
        replay.extend(p for p in pool if p is not partner)
        return sum(self.offer(p_sid, p_ts, p_item) for p_sid, p_ts, p_item in replay)

    def _far_ahead_clock(self, ts: int) -> None:
        """HWM update for a timestamp beyond ``start + 3 batch lengths``.

        One that will be routed into a window (overflow, held back, falling through)
        moves the clock to the cap; one that becomes a gap candidate moves it only
        once it is confirmed (jump) or falls through after all (_first_content).
        """
        if ts <= self._end + self._hold_ns or not (self._empty or self._provisional):
            self._clamp_hwm(self._hwm_cap)

    def _clamp_hwm(self, cap: int) -> None:
        """A timestamp beyond start + 3 batches: move the HWM to the cap, never back."""
        self._stats.hwm_clamped += 1
        if cap > self._hwm:  # type: ignore[operator]
            self._hwm = cap

    def _add_stream(self, sid: S) -> _Stream:
        try:
            gated = bool(self._policy(sid))
        except TypeError as exc:  # e.g. an unhashable id tested against a set
            raise TypeError(f"stream_id {sid!r} cannot be used: {exc}") from exc
        st = _Stream(sid, gated)
        self._streams[sid] = st
        return st

    def _route(self, st: _Stream, ts: int, item: Any) -> None:
        if st.grid is not None:
            idx = ((ts - st.origin) * st.rate2 + _NS) // _NS2
            if idx < st.hi:
                self._put(st, ts, item)
                if idx >= st.last and not st.done:
                    self._mark_done(st)
                return
            if ts <= self._end + self._hold_ns:
                self._overflow.append((ts, st.sid, item))
                self._stats.overflowed += 1
                if not st.done:
                    self._mark_done(st)
                self._wake = True  # maybe a gap: _settle decides
                return
        else:
            end = self._end
            if ts < end:
                self._put(st, ts, item)
                return
            if ts <= end + self._hold_ns:
                self._future.append((ts, st.sid, item))
                self._stats.held_future += 1
                if not self._unsat:
                    self._wake = True  # a satisfied window now has proof it is over
                return
        # Further ahead than the hold-back horizon. While the first window is still
        # provisional its own content is no more trustworthy than this message, so
        # far messages stay candidates (two that agree make it close and jump).
        if not self._empty and not self._provisional:
            self._stats.far_fallthrough += 1
            self._put(st, ts, item)
        else:
            self._far.append((ts, st.sid, item))
            self._stats.far_candidates += 1
            if len(self._far) >= 2:
                self._wake = True

    def _put(self, st: _Stream, ts: int, item: Any) -> None:
        if self._empty:
            self._first_content()
        st.bucket.append((ts, item))

    def _first_content(self) -> None:
        self._empty = False
        if self._far:
            # The window has real content now: waiting gap candidates were outliers
            # and fall through to it like any implausibly far message.
            far = self._far
            self._far = []
            streams = self._streams
            cap = self._start + self._hold_ns  # type: ignore[operator]
            for f_ts, f_sid, f_item in far:
                self._stats.far_fallthrough += 1
                (streams.get(f_sid) or self._add_stream(f_sid)).bucket.append((f_ts, f_item))
                if f_ts > self._hwm:  # type: ignore[operator]
                    self._clamp_hwm(cap)

    def _mark_done(self, st: _Stream) -> None:
        st.done = True
        self._unsat -= 1
        if not self._unsat:
            self._wake = True

    def _settle(self, drained: bool) -> int:
        """Apply the close rules until none fires; return the number of batches emitted.

        ``drained``: the host has no more input for now, so a satisfied gate may
        close without a message waiting for a later window.
        """
        closed = 0
        while True:
            self._wake = False
            if self._gap_pending():
                if not self._empty:
                    self._close(CloseReason.GAP)
                    closed += 1
                else:
                    self._jump()
                continue
            if not self._unsat and (
                drained or self._overflow or self._future or self._hwm >= self._deadline  # type: ignore[operator]
            ):
                self._close(CloseReason.SLOT_GATE)
                closed += 1
                continue
            if self._hwm >= self._deadline:  # type: ignore[operator]
                if not self._empty:
                    self._close(CloseReason.TIMEOUT)
                    closed += 1
                else:
                    self._stats.silent_advances += 1
                    self._advance(1)
                continue
            return closed

    def _jump(self) -> None:
        """Gap recovery on an empty window: go straight to where traffic resumed."""
        self._stats.gap_jumps += 1
        latest = max(p[0] for p in self._overflow + self._far + self._future)
        self._advance(self._windows_until(self._gap_target()))
        # The resumed traffic is now trusted: let it move the logical clock.
        new = min(latest, self._start + self._hold_ns)  # type: ignore[operator]
        if new > self._hwm:  # type: ignore[operator]
            self._hwm = new

    def _gap_pending(self) -> bool:
        if self._overflow and not any(
            st.bucket for st in self._streams.values() if st.grid is not None
        ):
            return True  # gridded traffic is past the window and none landed in it
        return len(self._far) >= 2 and self._far_anchor() is not None

    def _far_anchor(self) -> _Pending | None:
        """Earliest candidate with another candidate within the hold-back horizon."""
        far = sorted(self._far, key=_TS)
        hold = self._hold_ns
        for a, b in itertools.pairwise(far):
            if b[0] - a[0] <= hold:
                return a
        return None

    def _gap_target(self) -> _Pending:
        near = self._overflow + self._future
        if near:
            return min(near, key=_TS)
        anchor = self._far_anchor()
        assert anchor is not None  # guaranteed by _gap_pending
        return anchor

    def _windows_until(self, entry: _Pending) -> int:
        """Whole windows from the active start to the window owning ``entry`` (>= 1)."""
        ts, sid, _ = entry
        st = self._streams.get(sid)
        start = self._start
        assert start is not None
        if st is not None and st.grid is not None:
            g = st.grid
            k = g.windows_ahead(g.pulse_index(ts), start, self._L)
        else:
            k = (ts - start) // self._L
        return k if k > 1 else 1

    def _advance(self, windows: int) -> None:
        """Move an empty active window forward without emitting anything."""
        assert self._start is not None and self._empty
        self._open(self._start + windows * self._L)
        self._reroute()

    def _open(self, start: int) -> None:
        end = start + self._L
        self._start = start
        self._end = end
        self._deadline = start + self._timeout_ns
        self._hwm_cap = start + self._hold_ns
        self._empty = True
        n = 0
        for st in self._streams.values():
            g = st.grid
            if g is not None:
                st.lo, st.hi = g.index_range(start, end)
                st.last = st.hi - 1
                st.done = False
                n += 1
        self._unsat = n if n else -1
        self._wake = False

    def _reroute(self) -> None:
        pending = self._overflow + self._far + self._future
        if not pending:
            return
        self._overflow = []
        self._far = []
        self._future = []
        pending.sort(key=_TS)
        streams = self._streams
        for ts, sid, item in pending:
            self._route(streams.get(sid) or self._add_stream(sid), ts, item)
        self._wake = True

    def _close(self, reason: CloseReason) -> None:
        start, end = self._start, self._end
        assert start is not None
        new_L = self._pending_L
        length = self._L if new_L is None else new_L
        out: dict[S, list[tuple[int, T]]] = {}
        evict: list[S] = []
        for sid, st in self._streams.items():
            bucket = st.bucket
            if bucket:
                st.absent = 0
                if st.gated:
                    self._refresh_grid(st, start, end, length)
                if len(bucket) > 1:
                    bucket.sort(key=_TS)
                out[sid] = bucket
                st.bucket = []
            else:
                st.absent += 1
                if st.absent >= ABSENT_BATCHES_FOR_EVICTION:
                    evict.append(sid)
                elif new_L is not None and st.grid is not None:
                    self._rescale_grid(st, length)
        for sid in evict:
            del self._streams[sid]
        self._stats.evictions += len(evict)
        attr = _REASON_COUNTER[reason]
        setattr(self._stats, attr, getattr(self._stats, attr) + 1)
        self._closed.append(Batch(self._seq, start, end, reason, out))
        self._seq += 1
        self._provisional = False
        if new_L is not None:
            self._L = new_L
            self._pending_L = None
            self._derive_lengths()
        self._open(end)
        self._reroute()

    def _derive_lengths(self) -> None:
        self._timeout_ns = round(self._L * self._factor)
        self._hold_ns = HOLD_BATCHES * self._L

    # -- grids ---------------------------------------------------------------------

    def _refresh_grid(self, st: _Stream, start: int, end: int, length: int) -> None:
        """Build, keep, re-rate or drop a present gated stream's grid at a close."""
        evaluated, rate = st.fresh_rate()
        g = st.grid
        if g is not None:
            if not self._hit_window(st):
                # Not one message on a slot of the window: the stream's clock no
                # longer agrees with the windows (epoch jump, long lag). Gating on
                # it would only force timeouts; demote it. It may earn a new grid.
                self._stats.grids_dropped += 1
                st.set_grid(None)
                st.votes = 0
            elif evaluated and rate is not None and rate != g.rate_hz:
                if _vote(st, rate) < RATE_CHANGE_CONFIRMATIONS:
                    self._rescale_grid(st, length)
                    return
                self._stats.rate_changes += 1
                self._build_grid(st, rate, start, end, length)
                return
            else:
                if evaluated:
                    st.votes = 0
                if abs(g.origin_ns - end) <= MAX_ORIGIN_OFFSET_BATCHES * length:
                    self._rescale_grid(st, length)
                else:  # origin too old to trust: re-anchor on a pulse of this window
                    self._build_grid(st, g.rate_hz, start, end, length)
                return
        if evaluated:
            if rate is None:
                st.votes = 0
                return
            _vote(st, rate)
        if st.votes >= INITIAL_RATE_CONFIRMATIONS:
            self._build_grid(st, st.vote_rate, start, end, length)

    def _build_grid(self, st: _Stream, rate: int, start: int, end: int, length: int) -> None:
        if rate * length < _NS:
            st.set_grid(None)  # fewer than one pulse per batch: cannot fill a slot each window
            return
        origin = self._pick_origin(st, rate, start, end)
        if origin is None or abs(origin - end) > MAX_ORIGIN_OFFSET_BATCHES * length:
            self._stats.origins_refused += 1
            st.set_grid(None)
            return
        st.set_grid(PulseGrid(origin, rate, slots_for(rate, length)))
        st.votes = 0
        self._stats.grids_built += 1

    def _rescale_grid(self, st: _Stream, length: int) -> None:
        g = st.grid
        if g is None:
            return
        if g.rate_hz * length < _NS:
            st.set_grid(None)
            self._stats.grids_dropped += 1
            return
        slots = slots_for(g.rate_hz, length)
        if slots != g.slots_per_batch:
            st.set_grid(PulseGrid(g.origin_ns, g.rate_hz, slots))

    @staticmethod
    def _hit_window(st: _Stream) -> bool:
        lo, hi, origin, rate2 = st.lo, st.hi, st.origin, st.rate2
        return any(lo <= ((ts - origin) * rate2 + _NS) // _NS2 < hi for ts, _ in st.bucket)

    @staticmethod
    def _pick_origin(st: _Stream, rate: int, start: int, end: int) -> int | None:
        """A pulse observed inside the window, nudged by the median phase of the others.

        Taking a real pulse makes the grid line up with pulses rather than with the
        window (phase offsets are free). Correcting it by the median phase residual
        of the window's other pulses keeps one jittery first pulse from shifting the
        whole grid by its jitter.
        """
        inside = [ts for ts, _ in st.bucket if start <= ts < end]
        if not inside:
            return None
        base = inside[0]
        half = _NS // 2
        residuals = sorted(((ts - base) * rate + half) % _NS - half for ts in inside)
        return base + residuals[(len(residuals) - 1) // 2] // rate

    # -- persistence ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Complete state as plain data (lists, dicts, ints, floats, strs, bools, None).

        JSON-serialisable when stream ids and items are; stream order, buffered
        messages, queued batches and counters are all included, so a restored
        batcher behaves exactly like this one.
        """
        streams = []
        for sid, st in self._streams.items():
            g = st.grid
            streams.append(
                {
                    "id": sid,
                    "gated": st.gated,
                    "estimator": None if st.est is None else st.est.to_state(),
                    "grid": None if g is None else [g.origin_ns, g.rate_hz, g.slots_per_batch],
                    "done": st.done,
                    "absent": st.absent,
                    "vote": [st.vote_rate, st.votes],
                    "eval_mark": st.eval_mark,
                    "bucket": [[ts, item] for ts, item in st.bucket],
                }
            )
        return {
            "version": SNAPSHOT_VERSION,
            "batch_length_ns": self._L,
            "pending_batch_length_ns": self._pending_L,
            "timeout_factor": self._factor,
            "window_start_ns": self._start,
            "hwm_ns": self._hwm,
            "sequence": self._seq,
            "streams": streams,
            "overflow": [list(p) for p in self._overflow],
            "far": [list(p) for p in self._far],
            "future": [list(p) for p in self._future],
            "closed": [b.to_state() for b in self._closed],
            "boot": [list(p) for p in self._boot],
            "provisional": self._provisional,
            "stats": self._stats.as_dict(),
        }

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any],
        *,
        gated: Collection[S] | Callable[[S], bool],
    ) -> RateAwareMessageBatcher[S, T]:
        """Rebuild a batcher from :meth:`snapshot` output (also after a JSON round trip).

        ``gated`` is the policy for streams first seen *after* the restore; streams
        in the snapshot keep the decision recorded there. Stream ids that came back
        from JSON as lists are turned back into tuples so they stay hashable.
        """
        if not isinstance(state, Mapping):
            raise ValueError("batcher snapshot must be a mapping")
        version = state.get("version")
        if version != SNAPSHOT_VERSION:
            raise ValueError(
                f"batcher snapshot version {version!r} is not supported "
                f"(expected {SNAPSHOT_VERSION})"
            )
        try:
            self = cls(
                _int(state["batch_length_ns"], "batch_length_ns"),
                gated=gated,
                timeout_factor=state["timeout_factor"],
            )
            pending_len = state["pending_batch_length_ns"]
            if pending_len is not None:
                self.set_batch_length(_int(pending_len, "pending_batch_length_ns"))
            start = state["window_start_ns"]
            hwm = state["hwm_ns"]
            self._seq = _int(state["sequence"], "sequence")
            for rec in state["streams"]:
                self._restore_stream(rec)
            self._overflow = [_pending(p, "overflow") for p in state["overflow"]]
            self._far = [_pending(p, "far") for p in state["far"]]
            self._future = [_pending(p, "future") for p in state["future"]]
            self._closed = [Batch.from_state(b) for b in state["closed"]]
            self._boot = [
                (_freeze(sid), _int(ts, "boot ts"), item) for sid, ts, item in state["boot"]
            ]
            self._provisional = bool(state["provisional"])
            for name, value in state.get("stats", {}).items():
                if name in _Stats.__slots__:
                    setattr(self._stats, name, _int(value, f"stats.{name}"))
        except KeyError as exc:
            raise ValueError(f"batcher snapshot: missing key {exc}") from exc
        except TypeError as exc:
            raise ValueError(f"batcher snapshot: malformed value: {exc}") from exc
        if start is None:
            if self._streams or self.buffered_count != len(self._boot):
                raise ValueError("batcher snapshot: streams or messages without an active window")
            self._hwm = None if hwm is None else _int(hwm, "hwm_ns")
            return self
        self._hwm = _int(hwm, "hwm_ns")
        self._resume_window(_int(start, "window_start_ns"))
        return self

    def _restore_stream(self, rec: Mapping[str, Any]) -> None:
        sid = _freeze(rec["id"])
        st = _Stream(sid, bool(rec["gated"]))
        est_state = rec["estimator"]
        if st.gated:
            if est_state is None:
                raise ValueError(f"batcher snapshot: gated stream {sid!r} has no estimator")
            st.est = StreamPeriodEstimator.from_state(est_state, DIFF_RING_SIZE)
        grid = rec["grid"]
        if grid is not None:
            origin, rate, slots = grid
            st.set_grid(
                PulseGrid(
                    _int(origin, "grid origin"), _int(rate, "grid rate"), _int(slots, "grid slots")
                )
            )
        st.done = bool(rec["done"])
        st.absent = _int(rec["absent"], "absent")
        st.vote_rate, st.votes = (_int(v, "vote") for v in rec["vote"])
        st.eval_mark = _int(rec["eval_mark"], "eval_mark")
        st.bucket = [(_int(ts, "bucket ts"), item) for ts, item in rec["bucket"]]
        if sid in self._streams:
            raise ValueError(f"batcher snapshot: stream {sid!r} listed twice")
        self._streams[sid] = st  # type: ignore[index]

    def _resume_window(self, start: int) -> None:
        """Recompute the derived active-window counters without touching buckets."""
        self._start = start
        self._end = start + self._L
        self._deadline = start + self._timeout_ns
        self._hwm_cap = start + self._hold_ns
        n = unsat = 0
        empty = True
        for st in self._streams.values():
            if st.bucket:
                empty = False
            g = st.grid
            if g is not None:
                st.lo, st.hi = g.index_range(start, self._end)
                st.last = st.hi - 1
                n += 1
                unsat += not st.done
        self._empty = empty
        self._unsat = unsat if n else -1
        self._wake = False


# -- helpers --------------------------------------------------------------------


def _gate_policy(gated: Collection[Any] | Callable[[Any], bool]) -> Callable[[Any], bool]:
    if callable(gated):
        return gated
    if isinstance(gated, str | bytes):
        raise TypeError("gated must be a collection of stream ids or a predicate, not a string")
    if isinstance(gated, Collection):
        members = frozenset(gated)
        return members.__contains__
    raise TypeError(f"gated must be a collection of stream ids or a predicate, got {gated!r}")


def _ns(value: object, name: str) -> int:
    """Accept ints and integer-like scalars (numpy int64); reject floats and bools."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer number of nanoseconds, got a bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be an integer number of nanoseconds, got {type(value).__name__}"
        ) from None


def _positive_ns(value: object, name: str) -> int:
    ns = _ns(value, name)
    if ns <= 0:
        raise ValueError(f"{name} must be > 0, got {ns}")
    return ns


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"batcher snapshot: {name} must be an integer, got {value!r}")
    return value


def _vote(st: _Stream, rate: int) -> int:
    """Count consecutive evaluations agreeing on ``rate``; return the streak length."""
    if rate == st.vote_rate:
        st.votes += 1
    else:
        st.vote_rate = rate
        st.votes = 1
    return st.votes


def _freeze(value: Any) -> Any:
    """JSON turns tuple stream ids into lists; make them hashable again."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _pending(rec: Any, name: str) -> _Pending:
    ts, sid, item = rec
    return _int(ts, f"{name} ts"), _freeze(sid), item
