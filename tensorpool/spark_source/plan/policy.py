"""The source's event-time, admission and sizing policies, put together for the reader (#17).

:class:`SourcePolicy` is what :class:`~tensorpool.spark_source.spark.stream.TensorPoolStreamReader`
holds on the Spark driver when any policy option is given. Per trigger, the reader calls
:meth:`~SourcePolicy.begin` (ring scans, clocks), passes :meth:`~SourcePolicy.admit` to
:meth:`~tensorpool.spark_source.plan.planner.StreamPlanner.plan` as its ``admit`` hook and
:meth:`~SourcePolicy.limits` as its limits, then :meth:`~SourcePolicy.finish` (tokens spent,
watermarks). Sans-IO like its parts: clocks and event times come in as numbers.

Replay: every decision is recorded in the end offset as seq boundaries (``seq`` for frames
held back by alignment or rate, ``skipTo`` for shed / late-dropped frames, ``lateTo`` for
frames delivered with ``is_late``) so :func:`~tensorpool.spark_source.plan.offsets.batch_ranges`
gives a replayed batch exactly the frames it had, without asking any policy again.

Per stream the checks run in this order (seed 004 §5 first, then §2):

1. lag (shed, ``shedLag``), 2. jitter (measured, flagged), 3. late (drop or flag, ``late``),
4. the memory emergency (shed oldest, ``shedMemory``), 5. rate (hold); then the per-trigger
limits ``maxFramesPerTrigger`` and the byte budget (fixed, or the adaptive one of
:mod:`.sizing`) in the planner; then 6. alignment (hold) by what every stream will deliver
after all of those (:meth:`SourcePolicy.align`, passed to the planner as its ``align`` hook).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from tensorpool.spark_source.options.policy import LATE_DROP, PolicyOptions
from tensorpool.spark_source.plan.admission import StreamAdmission, TokenBucket, lag_count
from tensorpool.spark_source.plan.eventtime import (
    NO_WATERMARK,
    Aligner,
    count_at_or_below,
    late_reference,
    late_runs,
    running_max,
)
from tensorpool.spark_source.plan.offsets import Cut, Limits, RingState, StreamPos, runs_seqs
from tensorpool.spark_source.plan.sizing import BatchSizer, SizingConfig, shed_oldest

log = logging.getLogger("tensorpool.spark_source")

_MS = 1_000_000


def _least(cap: int | None, n: int) -> int:
    return n if cap is None else min(cap, n)


def _times(st: RingState, seqs: np.ndarray, shift: int) -> np.ndarray | None:
    """Wall-clock event times of ``seqs`` from the scan (None: the scan has no stamps)."""
    if st.stamps is None:
        return None
    return st.stamps[np.asarray(seqs, np.int64) & (st.nslots - 1)].astype(np.int64) + shift


class SourcePolicy:
    """Driver-side state of the policies of one streaming query (see the module doc)."""

    def __init__(self, popts: PolicyOptions) -> None:
        self.p = popts
        self.aligner = Aligner(popts.skew_ms * _MS, popts.idle_ms * _MS)
        self.streams: dict[int, StreamAdmission] = {}
        self.sizer = (
            BatchSizer(
                SizingConfig(
                    popts.target_ms * _MS, popts.max_batch_memory, popts.high_water, popts.emergency
                )
            )
            if popts.auto_bytes
            else None
        )
        self._now_mono = 0
        self._now_wall = 0
        self._shift: dict[int, int] = {}
        self._seeded = False
        self._watermarks: dict[int, int] = {}
        # this trigger's admit(): per stream, event times made non-decreasing, frames skipped
        self._mono: dict[int, np.ndarray] = {}
        self._skip: dict[int, int] = {}
        self._newest: dict[int, int] = {}  # newest event time in each ring (this trigger)
        self._bound: int | None = None  # the last alignment bound (progress)

    def _stream(self, sid: int, restarted: bool = False) -> StreamAdmission:
        s = self.streams.get(sid)
        if s is None:
            bucket = None
            if self.p.max_fps is not None:
                # #31.1: a restart from the checkpoint starts empty -- the replayed batch has
                # spent its tokens already; a new query starts with a burst
                full = -1.0 if not restarted else 0.0
                bucket = TokenBucket(self.p.max_fps, self.p.max_burst, full)
            s = self.streams[sid] = StreamAdmission(bucket)
        return s

    # --- per trigger ------------------------------------------------------------------------------
    def begin(
        self,
        start: Mapping[int, StreamPos],
        states: Mapping[int, RingState | None],
        shift: Mapping[int, int],
        now_mono: int,
        now_wall: int,
    ) -> None:
        """A trigger: the rings as scanned, each stream's stamp-to-wall-clock shift, clocks."""
        self._now_mono, self._now_wall = now_mono, now_wall
        self._shift = dict(shift)
        if not self._seeded:
            self._seeded = True
            self._watermarks = {s: p.event_ns for s, p in start.items() if p.event_ns}
            self.aligner.seed(self._watermarks.values())
        for sid, pos in start.items():  # every stream earns tokens at every trigger (#31.1)
            bucket = self._stream(sid, restarted=bool(pos.frames)).bucket
            if bucket is not None:
                bucket.tick(now_mono)
        if self.sizer is not None:
            self.sizer.triggered(now_mono)
            owed = 0
            for sid, pos in start.items():
                st = states.get(sid)
                if st is None or st.epoch != pos.epoch or st.empty:
                    continue
                lens = st.lens_of(st.present(pos.seq, st.head))
                owed += 0 if lens is None else int(lens.sum())
            self.sizer.owed(owed, now_mono)
        self._newest = {}
        for sid in start:
            st = states.get(sid)
            self.aligner.observe(sid, None if st is None else st.head, now_mono)
            if st is not None and not st.empty and st.stamps is not None:
                stamp = int(st.stamps[(st.head - 1) & (st.nslots - 1)])
                self._newest[sid] = stamp + self._shift.get(sid, 0)
        self._mono = {}
        self._skip = {}

    def limits(self, limits: Limits) -> Limits:
        """The trigger's limits with the adaptive byte budget (maxBytesPerTrigger=auto)."""
        if self.sizer is None:
            return limits
        return Limits(limits.max_frames, self.sizer.budget())

    def admit(self, ready: Sequence[Any]) -> dict[int, Cut]:
        """The ``admit`` hook of :meth:`StreamPlanner.plan`: one :class:`Cut` per stream."""
        p, now_wall = self.p, self._now_wall
        wm = self._watermarks
        live = self.aligner.live(self._now_mono) if p.late is not None else []
        max_lag = None if p.max_lag_ms is None else p.max_lag_ms * _MS
        cuts: dict[int, Cut] = {}
        rest_lens: list[np.ndarray] = []
        mono = self._mono
        sizing = self.sizer is not None
        for r in ready:
            seqs = r.present
            raw = _times(r.state, seqs, self._shift.get(r.sid, 0)) if len(seqs) else None
            if raw is None:
                cuts[r.sid] = Cut()
                rest_lens.append(np.zeros(0, np.int64))
                continue
            carried = wm.get(r.sid)  # #31.2: from the stream's watermark, not this batch
            times = mono[r.sid] = running_max(raw, carried)
            adm = self._stream(r.sid)
            k_lag = lag_count(times, now_wall, max_lag)  # 1. lag
            if p.admission:
                adm.enter(r.state.epoch)
                adm.jitter.observe(seqs, raw)  # 2. jitter
            k_late, cap = 0, None  # 3. late: each frame's own stamp (see .eventtime)
            if p.late is not None:
                others = [wm[s] for s in live if s != r.sid and s in wm]
                ref = late_reference(
                    times, carried, min(others) if others else None, self.aligner.global_ns
                )[k_lag:]
                known = ref != NO_WATERMARK
                late = known & (raw[k_lag:] < np.where(known, ref, 0) - p.allowed_lateness_ms * _MS)
                k_late, stop = late_runs(late)
                if stop < len(late):  # the next late run waits for the next batch
                    cap = stop
            drop = p.late == LATE_DROP
            skip = k_lag + (k_late if drop else 0)
            if cap is not None and drop:
                cap -= k_late
            cuts[r.sid] = Cut(skip, 0 if drop else k_late, cap, k_lag, 0, k_late)
            if sizing:
                lens = r.state.lens_of(seqs[skip:])
                rest_lens.append(np.zeros(len(seqs) - skip, np.int64) if lens is None else lens)
        if self.sizer is not None:  # 4. the memory emergency: shed the oldest
            keep = self.sizer.emergency_keep(int(sum(int(x.sum()) for x in rest_lens)))
            if keep is not None:
                for r, extra in zip(ready, shed_oldest(rest_lens, keep), strict=True):
                    if extra:
                        c = cuts[r.sid]
                        unflag = min(c.flag, extra)
                        cuts[r.sid] = replace(
                            c,
                            skip=c.skip + extra,
                            flag=c.flag - unflag,
                            late=c.late - unflag,
                            shed_memory=extra,
                        )
        for r in ready:
            c = cuts[r.sid]
            self._skip[r.sid] = c.skip
            bucket = self._stream(r.sid).bucket
            if bucket is not None and r.sid in mono:  # 5. rate
                cuts[r.sid] = replace(c, cap=_least(c.cap, bucket.available()))
        return cuts

    def align(self, views: Sequence[Any], counts: Sequence[int]) -> dict[int, int]:
        """The ``align`` hook of :meth:`StreamPlanner.plan` (6. alignment, #27.1): per stream,
        the frames of its view at or below the minimum over the other live streams of what
        each will have delivered with ``counts``, + ``maxEventTimeSkewMs``."""
        delivered: dict[int, int | None] = {**self._newest, **self._watermarks}
        eff: dict[int, np.ndarray] = {}
        for v, n in zip(views, counts, strict=True):
            times = self._mono.get(v.sid)
            if times is None:
                continue
            skip = self._skip.get(v.sid, 0)
            eff[v.sid] = t = times[skip : skip + len(v.present)]
            if n:
                delivered[v.sid] = int(t[n - 1])
            elif skip < len(times):  # delivers nothing: no older than its oldest waiting
                delivered[v.sid] = int(times[skip])
        now = self._now_mono
        self._bound = self.aligner.bound(delivered, now)
        bounds = self.aligner.bounds(delivered, now, eff)
        return {sid: count_at_or_below(t, bounds[sid]) for sid, t in eff.items()}

    def finish(
        self,
        start: Mapping[int, StreamPos],
        end: dict[int, StreamPos],
        runs: Mapping[int, np.ndarray],
        states: Mapping[int, RingState | None],
    ) -> None:
        """After the plan: spend tokens, record each stream's watermark in ``end`` (in place)
        and advance the global one."""
        for sid, e in list(end.items()):
            s = start.get(sid)
            n = (e.frames or 0) - ((s.frames or 0) if s is not None else 0)
            if n <= 0 or s is None or s.epoch != e.epoch:
                continue
            adm = self._stream(sid)
            if adm.bucket is not None:
                adm.bucket.take(n)
            st = states.get(sid)
            rr = runs.get(sid)
            if st is None or rr is None or not len(rr):
                continue
            # #31.3: every delivered frame, not a sample: a stamp may step back within a batch
            t = _times(st, runs_seqs(rr), self._shift.get(sid, 0))
            if t is None:
                continue
            newest = max(int(t.max()), e.event_ns)
            if newest != e.event_ns:
                end[sid] = replace(e, event_ns=newest)
            self._watermarks[sid] = newest
        self.aligner.advance(self._watermarks, self._now_mono)
        self._check_jitter()

    def planned(self, nbytes: int, now_mono: int) -> None:
        """``partitions()`` planned a batch of ``nbytes`` (adaptive sizing's latency clock)."""
        if self.sizer is not None:
            self.sizer.planned(nbytes, now_mono)

    def _check_jitter(self) -> None:
        limit = self.p.max_jitter_ms
        if limit is None:
            return
        for sid, adm in self.streams.items():
            pct = adm.jitter.percentiles()
            over = pct is not None and pct[1] > limit
            if over and not adm.flagged:
                assert pct is not None
                log.warning(
                    "tensorpool: stream %d: inter-arrival jitter p99 %.1f ms exceeds maxJitterMs "
                    "%d (p50 %.1f ms): its producer stutters",
                    sid,
                    pct[1],
                    limit,
                    pct[0],
                )
            adm.flagged = over

    # --- progress ---------------------------------------------------------------------------------
    def report(self, streams: Sequence[int]) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
        """Per-stream and source-wide entries for ``reportLatestOffset`` (progress)."""
        now = self._now_mono
        per: dict[int, dict[str, Any]] = {}
        for sid in streams:
            wm = self._watermarks.get(sid)
            entry: dict[str, Any] = {"watermarkMs": None if wm is None else wm // _MS}
            if self.p.event_time:
                entry["idle"] = self.aligner.idle(sid, now)
            adm = self.streams.get(sid)
            if self.p.admission:
                pct = None if adm is None else adm.jitter.percentiles()
                entry["jitterP50Ms"] = None if pct is None else round(pct[0], 3)
                entry["jitterP99Ms"] = None if pct is None else round(pct[1], 3)
                entry["jitterExceeded"] = bool(adm is not None and adm.flagged)
            if adm is not None and adm.bucket is not None:
                entry["tokens"] = int(adm.bucket.tokens)
            per[sid] = entry
        g = self.aligner.global_ns
        src: dict[str, Any] = {
            "watermarkMs": None if g is None else g // _MS,
            "liveStreams": self.aligner.live(now),
        }
        if self.p.align:
            b = self._bound
            src["alignBoundMs"] = None if b is None or b < 0 else b // _MS
        if self.sizer is not None:
            z = self.sizer
            m = z.model()
            src.update(
                batchBudgetBytes=z.last_budget,
                targetBatchLatencyMs=self.p.target_ms,
                lastBatchLatencyMs=None if not z.samples else z.samples[-1][1] // _MS,
                overheadMs=None if m is None else round(m[0] / _MS, 1),
                arrivalBytesPerS=None if z.arrival_bps is None else int(z.arrival_bps),
                costNsPerByte=None if m is None else round(m[1], 4),
                pressure=z.pressure,
                highWater=z.high_water,
                emergencies=z.emergencies,
            )
        return per, src


__all__ = ["SourcePolicy"]
