"""The per-stream planner of the Spark source (sans-IO): from ``(start offset, ring states,
limits)`` to the next end offset, with admission, loss accounting, sparse streams' published-seq
ledgers, epoch transitions and ``Trigger.AvailableNow``.

The offset model it plans in is :mod:`.offsets`' docstring.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

import numpy as np

from tensorpool.spark_source.plan.offsets import (
    EPOCH_CHANGE,
    NOT_STARTED,
    OVERWRITTEN,
    Cut,
    Limits,
    Loss,
    Offsets,
    RingState,
    SizeFn,
    StreamPos,
    split_budget,
    to_runs,
)

#: admit(ready streams) -> Cut per stream id (streams left out: no cut)
AdmitFn = Callable[[Sequence["_Ready"]], Mapping[int, Cut]]
#: align(views, counts) -> per stream id, the most frames of its view it may deliver given
#: what every stream delivers (``counts``, after every other cap); see :meth:`StreamPlanner.plan`
AlignFn = Callable[[Sequence["_Ready"], Sequence[int]], Mapping[int, int]]


# --- descriptor intake ---------------------------------------------------------------------------
class DescriptorFeed(Protocol):
    """Per-stream queues of received ``FrameDescriptor`` s (the driver's attachment)."""

    def pending(self, stream_id: int) -> int:
        """Descriptors of ``stream_id`` waiting to be taken."""
        ...

    def take(
        self, stream_id: int, max_items: int
    ) -> tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int, int, int]]]:
        """Up to ``max_items`` oldest ``(epoch, seq)``, and ``(epoch, lo, hi, count)``: seq
        spans and numbers of descriptors the queue dropped (overflow) since the previous take
        (they precede the returned ones)."""
        ...


class _Ledger:
    """What one epoch of one stream is known to have published (sparse-stream loss counts).

    ``known`` holds published seqs at or above the planning position (from descriptors and
    from ring scans). The record is *complete* (every published seq is in it) over
    ``[lo, hi]`` minus ``holes`` (intervals whose descriptors the intake dropped).
    """

    __slots__ = ("desc_hi", "described", "hi", "holes", "known", "lo", "new", "started")

    def __init__(self) -> None:
        self.started = False
        self.described = False
        self.lo = 0
        self.hi = -1
        self.desc_hi = -1
        self.holes: list[tuple[int, int]] = []
        self.known = np.empty(0, np.int64)
        self.new: list[int] = []

    def anchor(self, lo: int, hi: int) -> None:
        """Coverage starts here: at ``lo`` when the query begins reading the epoch at ``lo``
        (nothing missing before that is its concern), at the ring head after a restart."""
        # Never move the start of coverage up: Spark calls initialOffset more than once
        # (pyspark 4.3 calls it twice on a fresh query, and logs the first result), and the
        # record has been complete since the first anchor.
        self.lo = min(self.lo, lo) if (self.described or self.started) else lo
        self.hi = max(self.hi, hi)
        self.started = True

    def describe(self, seq: int) -> None:
        self.new.append(seq)
        if not self.described:
            self.described = True
            if not self.started:
                self.lo = seq
        if seq > self.desc_hi:
            self.desc_hi = seq
        if seq > self.hi:
            self.hi = seq

    def dropped(self, lo: int, hi: int) -> None:
        if not self.described:
            self.described = True
            if not self.started:
                self.lo = lo
        self.holes.append((lo, hi))
        self.desc_hi = max(self.desc_hi, hi)
        self.hi = max(self.hi, hi)

    def add_known(self, seqs: np.ndarray) -> None:
        if len(seqs):
            self.known = np.union1d(self.known, seqs)

    def _settle(self) -> np.ndarray:
        if self.new:
            self.known = np.union1d(self.known, np.asarray(self.new, np.int64))
            self.new = []
        return self.known

    def known_in(self, lo: int, hi: int) -> np.ndarray:
        k = self._settle()
        return k[np.searchsorted(k, lo) : np.searchsorted(k, hi)]

    def uncovered(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Parts of ``[lo, hi)`` where the record is incomplete."""
        out: list[tuple[int, int]] = []
        if lo < self.lo:
            out.append((lo, min(hi, self.lo)))
        a, b = max(lo, self.lo), min(hi, self.hi + 1)
        for h0, h1 in self.holes:
            x, y = max(a, h0), min(b, h1 + 1)
            if x < y:
                out.append((x, y))
        if hi > self.hi + 1:
            out.append((max(lo, self.hi + 1), hi))
        return out

    def retire(self, below: int) -> None:
        """Forget what lies below the planning position."""
        k = self._settle()
        self.known = k[np.searchsorted(k, below) :]
        self.holes = [h for h in self.holes if h[1] >= below]


@dataclass(slots=True)
class Plan:
    end: Offsets
    losses: list[Loss]
    unknown_epoch_loss: list[Loss]
    frames: int  # frames admitted (to read) in this plan
    possible: list[Loss] = field(default_factory=list)  # sparse, uncounted (upper bounds)
    runs: dict[int, np.ndarray] = field(default_factory=dict)  # admitted seqs per stream
    drained: dict[int, int] = field(default_factory=dict)  # descriptors taken per stream
    dropped: dict[int, int] = field(default_factory=dict)  # descriptors the intake dropped


@dataclass(slots=True)
class _Ready:
    sid: int
    state: RingState
    first: int
    head: int
    present: np.ndarray


class StreamPlanner:
    """Per-query driver state: turns ``(start, ring states, limits)`` into the next end offset.

    Remembers, per stream, the highest head seen in each epoch (to size the loss when an epoch
    ends before it was fully read), the ``Trigger.AvailableNow`` target, the published-seq
    ledgers of sparse streams and the runs of the last few plans (for ``partitions``).
    """

    REMEMBER: Final = 16

    def __init__(self, streams: Sequence[int], start_at: Mapping[int, str] | None = None) -> None:
        self.streams = tuple(sorted(streams))
        self._seen: dict[int, tuple[int, int]] = {}  # stream -> (epoch, highest head seen)
        self.target: dict[int, tuple[int, int]] | None = None
        # where a stream that was not there when the query started begins ("earliest"/"latest")
        self.start_at = dict(start_at or {})
        self._ledgers: dict[int, dict[int, _Ledger]] = {}
        self._sparse: set[tuple[int, int]] = set()
        self._planned: OrderedDict[tuple[int, int, int, int], np.ndarray] = OrderedDict()
        self.intake_dropped = 0

    def observe(self, stream_id: int, state: RingState) -> None:
        """Remember the highest head of the newest epoch (older epochs are never re-entered)."""
        prev = self._seen.get(stream_id)
        if (
            prev is None
            or state.epoch > prev[0]
            or (state.epoch == prev[0] and state.head > prev[1])
        ):
            self._seen[stream_id] = (state.epoch, state.head)
        if state.gapped:
            self._sparse.add((stream_id, state.epoch))

    def seen_head(self, stream_id: int, epoch: int) -> int | None:
        prev = self._seen.get(stream_id)
        return prev[1] if prev is not None and prev[0] == epoch else None

    def is_sparse(self, stream_id: int, epoch: int) -> bool:
        return (stream_id, epoch) in self._sparse

    def set_target(self, states: Mapping[int, RingState | None]) -> None:
        """``prepareForTriggerAvailableNow``: never plan past what exists right now."""
        self.target = {sid: (st.epoch, st.head) for sid, st in states.items() if st is not None}

    def add_streams(self, streams: Sequence[int]) -> None:
        """Plan these streams too (discovered, #16.4); a start offset that lacks one gives it
        :data:`NOT_STARTED` (:func:`grow_offsets`), so it begins at its earliest frame unless
        ``start_at`` says otherwise."""
        self.streams = tuple(sorted({*self.streams, *streams}))

    # --- ledgers ---------------------------------------------------------------------------------
    def _ledger(self, sid: int, epoch: int) -> _Ledger:
        per = self._ledgers.setdefault(sid, {})
        led = per.get(epoch)
        if led is None:
            led = per[epoch] = _Ledger()
        return led

    def begin(self, stream_id: int, state: RingState, first: int) -> None:
        """The query starts reading ``state.epoch`` at ``first`` (initial offset, a stream that
        appeared, a new epoch): what the ring holds from there is the baseline."""
        self.observe(stream_id, state)
        led = self._ledger(stream_id, state.epoch)
        led.anchor(first, max(first, state.head) - 1)
        if state.gapped:
            led.add_known(state.present(first, state.head))

    def absorb(
        self,
        stream_id: int,
        items: Sequence[tuple[int, int]],
        drops: Sequence[tuple[int, int, int, int]],
    ) -> None:
        """Fold taken descriptors (and overflow holes, which precede them) into the ledgers."""
        per = self._ledgers.setdefault(stream_id, {})
        floor = min(per) if per else 0
        for epoch, lo, hi, _n in drops:
            if epoch >= floor:
                self._ledger(stream_id, epoch).dropped(lo, hi)
        for epoch, seq in items:
            if epoch >= floor:
                self._ledger(stream_id, epoch).describe(seq)

    def _fill(
        self, feed: DescriptorFeed | None, sid: int, epoch: int, upto: int, chunk: int, plan: Plan
    ) -> None:
        """Take descriptors until those of every seq below ``upto`` are in (or none are left).

        Starts with the admitted count and doubles: when nothing was lost in the range that
        is exactly the admitted frames' descriptors; later ones stay queued.
        """
        if feed is None:
            return
        k = max(1, chunk)
        while feed.pending(sid) > 0:
            per = self._ledgers.get(sid, {})
            led = per.get(epoch)
            if (led is not None and led.desc_hi >= upto - 1) or any(e > epoch for e in per):
                return
            items, drops = feed.take(sid, k)
            if drops:
                n = sum(d[3] for d in drops)
                plan.dropped[sid] = plan.dropped.get(sid, 0) + n
                self.intake_dropped += n
            self.absorb(sid, items, drops)
            plan.drained[sid] = plan.drained.get(sid, 0) + len(items)
            if not items:
                return
            k *= 2

    def planned_runs(self, stream_id: int, epoch: int, first: int, end: int) -> np.ndarray | None:
        """The seqs a recent plan of this process admitted for ``[first, end)``, if any."""
        return self._planned.get((stream_id, epoch, first, end))

    def _remember(self, key: tuple[int, int, int, int], runs: np.ndarray) -> None:
        self._planned[key] = runs
        self._planned.move_to_end(key)
        while len(self._planned) > self.REMEMBER:
            self._planned.popitem(last=False)

    def _classify(
        self, sid: int, st: RingState, a: int, b: int, admitted: np.ndarray, plan: Plan
    ) -> int:
        """Count frames of ``[a, b)`` that were published and are gone; returns the exact count."""
        if not self.is_sparse(sid, st.epoch):
            cnt, lo, hi = st.maybe_overwritten(a, b)
            if cnt:
                plan.losses.append(Loss(sid, st.epoch, lo, cnt, OVERWRITTEN, st.nslots, hi))
            return cnt
        led = self._ledger(sid, st.epoch)
        gone = np.setdiff1d(led.known_in(a, b), admitted, assume_unique=True)
        if len(gone):
            plan.losses.append(
                Loss(sid, st.epoch, int(gone[0]), len(gone), OVERWRITTEN, st.nslots, int(gone[-1]))
            )
        total, plo, phi = 0, None, None
        for u0, u1 in led.uncovered(a, b):
            cnt, lo, hi = st.maybe_overwritten(u0, u1)
            cnt -= int(np.count_nonzero((gone >= u0) & (gone < u1)))
            if cnt > 0:
                total += cnt
                plo = lo if plo is None else min(plo, lo)
                phi = hi if phi is None else max(phi, hi)
        if total:
            plan.possible.append(
                Loss(sid, st.epoch, plo or a, None, OVERWRITTEN, st.nslots, phi, at_most=total)
            )
        return len(gone)

    # --- planning --------------------------------------------------------------------------------
    def plan(
        self,
        start: Mapping[int, StreamPos],
        states: Mapping[int, RingState | None],
        limits: Limits,
        sizes: SizeFn | None = None,
        late: Mapping[int, int] | None = None,
        feed: DescriptorFeed | None = None,
        admit: AdmitFn | None = None,
        align: AlignFn | None = None,
    ) -> Plan:
        """The next end offset. ``admit`` cuts each stream's pending frames (#17); ``align``
        then caps them by what every stream will deliver once the per-trigger limits are
        applied (#27.1, the minimum rule): caps only ever shrink, so the loop ends, and at its
        end every admitted frame is within what ``align`` allows for the final counts."""
        plan = Plan({}, [], [], 0)
        ready = []
        for sid in self.streams:
            r = self._prepare(
                sid, start[sid], states.get(sid), (late or {}).get(sid, 0), feed, plan
            )
            if r is not None:
                ready.append(r)
        cuts, wants = self._admit(ready, limits, sizes, admit, align)
        for r, n in zip(ready, wants, strict=True):
            self._advance(r, n, cuts.get(r.sid, Cut()), feed, plan)
        return plan

    def _prepare(
        self,
        sid: int,
        pos: StreamPos,
        st: RingState | None,
        add_late: int,
        feed: DescriptorFeed | None,
        plan: Plan,
    ) -> _Ready | None:
        """One stream's start of a plan: its end offset as it stays, or a stream that begins
        or changes epoch (planned here), or its pending frames (returned)."""
        end = plan.end
        base = pos.frames or 0
        # the old epoch's head must be read before a new epoch's scan replaces it
        old_head = self.seen_head(sid, pos.epoch)
        if st is not None:
            self.observe(sid, st)
        stay = replace(pos, lost_late=pos.lost_late + add_late, frames=base)
        if st is None or st.epoch < pos.epoch:
            # Not mapped (producer gone / not yet announced) or an older incarnation still
            # announcing: nothing new for this stream.
            end[sid] = stay
            return None
        head = st.head
        tgt = None if self.target is None else self.target.get(sid)
        if tgt is not None:
            if st.epoch > tgt[0]:
                # Data after the AvailableNow target lives in a newer epoch: stop here.
                if pos.epoch >= tgt[0]:
                    end[sid] = stay
                    return None
            elif st.epoch == tgt[0]:
                head = min(head, tgt[1])
        if pos.epoch == NOT_STARTED:
            # The stream was not announced when the query started: it begins now, where
            # startingOffsets says, and nothing before that point counts as lost.
            first = st.oldest if self.start_at.get(sid, "earliest") == "earliest" else st.head
            first = min(first, head)
            self.begin(sid, st, first)
            end[sid] = replace(
                pos, epoch=st.epoch, seq=first, lost_late=pos.lost_late + add_late, frames=base
            )
            return None
        if st.epoch > pos.epoch:
            lost = self._transition(sid, pos, st, old_head, feed, plan)
            first = min(st.head if st.empty else st.oldest, head)
            # frames of the new epoch already gone when we first saw it
            cnt, lo, hi = st.maybe_overwritten(0, first)
            if cnt and st.gapped:
                plan.possible.append(
                    Loss(sid, st.epoch, lo, None, OVERWRITTEN, st.nslots, hi, at_most=cnt)
                )
            elif cnt:
                plan.losses.append(Loss(sid, st.epoch, lo, cnt, OVERWRITTEN, st.nslots, hi))
                lost += cnt
            self.begin(sid, st, first)
            self._ledgers[sid] = {
                e: v for e, v in self._ledgers.get(sid, {}).items() if e >= st.epoch
            }
            end[sid] = replace(
                pos,
                epoch=st.epoch,
                seq=first,
                lost=pos.lost + lost,
                lost_late=pos.lost_late + add_late,
                frames=base,
            )
            return None
        led = self._ledger(sid, st.epoch)
        if not led.started:
            # First plan of this process for a checkpointed position (a restart): the
            # descriptor record is complete only for frames published from now on.
            led.anchor(st.head, st.head - 1)
            if st.gapped:
                led.add_known(st.present(pos.seq, st.head))
        end[sid] = stay
        return _Ready(sid, st, pos.seq, head, st.present(pos.seq, head))

    def _admit(
        self,
        ready: list[_Ready],
        limits: Limits,
        sizes: SizeFn | None,
        admit: AdmitFn | None,
        align: AlignFn | None,
    ) -> tuple[Mapping[int, Cut], list[int]]:
        """The policies' cuts (#17), then each stream's share of the limits, shrunk by the
        minimum rule (#27.1) until it holds for the final counts."""
        # #17: the source's policies cut each stream's pending frames (prefixes, see Cut)
        cuts = admit(ready) if admit is not None and ready else {}
        no_cut = Cut()
        views = list(ready)
        if cuts:
            views = []
            for r in ready:
                c = cuts.get(r.sid, no_cut)
                stop = None if c.cap is None else c.skip + c.cap
                views.append(_Ready(r.sid, r.state, r.first, r.head, r.present[c.skip : stop]))
        wants = self._shares(views, limits, sizes)
        while align is not None and views:
            caps = align(views, wants)
            shrunk = False
            for i, v in enumerate(views):
                k = caps.get(v.sid)
                if k is not None and k < len(v.present):
                    views[i] = replace(v, present=v.present[:k])
                    shrunk = True
            if not shrunk:
                break
            wants = self._shares(views, limits, sizes)
        return cuts, wants

    def _advance(self, r: _Ready, n: int, c: Cut, feed: DescriptorFeed | None, plan: Plan) -> None:
        """Move one stream's end offset past the ``n`` frames it delivers after its cut."""
        sid, st, present = r.sid, r.state, r.present
        used = c.skip + n  # frames of present consumed: skipped, then delivered
        if used >= len(present):
            end_seq = max(r.head, r.first)
        else:
            end_seq = int(present[used - 1]) + 1 if used else r.first
        admitted = present[c.skip : used]
        lost = 0
        if end_seq > r.first:
            self._fill(feed, sid, st.epoch, end_seq, used, plan)
            lost = self._classify(sid, st, r.first, end_seq, present[:used], plan)
        led = self._ledger(sid, st.epoch)
        led.retire(end_seq)
        if self.is_sparse(sid, st.epoch):
            led.add_known(present[used:])
        runs = to_runs(admitted)
        plan.runs[sid] = runs
        first = int(present[c.skip - 1]) + 1 if c.skip else r.first
        self._remember((sid, st.epoch, first, end_seq), runs)
        end = plan.end
        e = end[sid]
        if end_seq == r.first:
            plan.frames += n
            return  # nothing consumed: the stream's offset stays as it was
        flagged = min(c.flag, n)
        end[sid] = replace(
            e,
            epoch=st.epoch,
            seq=end_seq,
            lost=e.lost + lost,
            frames=(e.frames or 0) + n,
            late=e.late + c.late - (c.flag - flagged),
            shed_lag=e.shed_lag + c.shed_lag,
            shed_memory=e.shed_memory + c.shed_memory,
            skip_to=first if c.skip else 0,
            late_to=int(present[c.skip + flagged - 1]) + 1 if flagged else 0,
        )
        plan.frames += n

    def _transition(
        self,
        sid: int,
        pos: StreamPos,
        st: RingState,
        old_head: int | None,
        feed: DescriptorFeed | None,
        plan: Plan,
    ) -> int:
        """Account for the unread rest of ``pos.epoch`` when ``st.epoch`` replaced it."""
        if old_head is None:
            plan.unknown_epoch_loss.append(Loss(sid, pos.epoch, pos.seq, None, EPOCH_CHANGE))
            return 0
        if old_head <= pos.seq:
            return 0
        if not self.is_sparse(sid, pos.epoch):
            lost = old_head - pos.seq
            plan.losses.append(Loss(sid, pos.epoch, pos.seq, lost, EPOCH_CHANGE))
            return lost
        self._fill(feed, sid, pos.epoch, old_head, 1, plan)
        led = self._ledger(sid, pos.epoch)
        known = led.known_in(pos.seq, old_head)
        if len(known):
            plan.losses.append(Loss(sid, pos.epoch, int(known[0]), len(known), EPOCH_CHANGE))
        holes = led.uncovered(pos.seq, old_head)
        if holes:
            span = sum(b - a for a, b in holes)
            plan.possible.append(
                Loss(sid, pos.epoch, holes[0][0], None, EPOCH_CHANGE, 0, holes[-1][1] - 1, span)
            )
        return len(known)

    def _shares(self, views: list[_Ready], limits: Limits, sizes: SizeFn | None) -> list[int]:
        """Frames each stream delivers under ``maxFramesPerTrigger`` and the byte budget."""
        wants = [len(v.present) for v in views]
        if limits.max_frames is not None:
            wants = split_budget(limits.max_frames, wants)
        if limits.max_bytes is not None and any(wants):
            wants = self._cut_bytes(views, wants, limits.max_bytes, sizes)
        return wants

    @staticmethod
    def _cut_bytes(
        ready: list[_Ready], wants: list[int], max_bytes: int, sizes: SizeFn | None
    ) -> list[int]:
        per_stream: list[np.ndarray] = []
        for r, n in zip(ready, wants, strict=True):
            seqs = r.present[:n]
            lens = r.state.lens_of(seqs)
            if lens is None:
                lens = (
                    np.asarray(sizes(r.sid, r.state.epoch, seqs), np.int64)
                    if sizes is not None
                    else np.zeros(len(seqs), np.int64)
                )
            per_stream.append(lens)
        totals = [int(s.sum()) for s in per_stream]
        shares = split_budget(max_bytes, totals)
        out: list[int] = []
        for sz, share in zip(per_stream, shares, strict=True):
            out.append(int(np.searchsorted(np.cumsum(sz), share, side="right")))
        if not any(out):
            # Progress guarantee (as Spark's file sources do with maxBytes): a frame larger
            # than the whole budget is admitted alone rather than stalling the query.
            for i, n in enumerate(wants):
                if n:
                    out[i] = 1
                    break
        return out


__all__ = ["AdmitFn", "AlignFn", "DescriptorFeed", "Plan", "StreamPlanner"]
