"""SLA admission of the Spark source per stream: lag, jitter, rate (seed 004 §5, #17).

Sans-IO: callers pass event times (ns, wall clock) and ``now_ns``; the state is a token bucket
and a jitter window per stream, kept by the reader on the driver across triggers.

Order of the checks, as seed 004's ``StreamAdmissionController.try_admit``:

1. **lag** -- a frame whose age at admission (``now - event time``) exceeds ``maxLagMs`` is
   *shed* (counted ``shedLag``). Frames are planned oldest first and event time is
   non-decreasing in seq (:func:`~tensorpool.spark_source.plan.eventtime.running_max`), so the shed
   frames are a prefix of what is pending and the offsets record them as a seq boundary.
2. **jitter** -- the inter-arrival time of each stream's frames (their stamps, seq order) is
   measured; ``jitter`` is ``|interval - median interval|`` over the last
   :data:`JITTER_WINDOW` intervals, reported as p50/p99. Above ``maxJitterMs`` the stream is
   *flagged* (progress, one warning per episode), not throttled: seed 004 rejects an event
   that arrives later than the budget after the last one, which for a pull-based source is
   the stream going quiet -- Spark cannot make a producer stutter less, the operator can.
3. **rate** -- a token bucket per stream across triggers (:class:`TokenBucket`): a sustained
   ``maxFramesPerSecond`` whatever the trigger interval, saving at most ``maxBurstFrames``
   from one trigger to the next; a trigger admits at most the tokens it holds. Frames over
   the rate are *deferred* (they stay in the ring for the next trigger -- seed 004's
   ``PreferThrottle``), not shed: whether waiting frames then age out is the lag check's job.

Shed frames are the source's decision, not loss: they never fail a query, whatever
``failOnDataLoss`` says, and are counted apart (``shedLag`` / ``shedMemory``, never ``lost``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np

#: intervals kept per stream for the jitter percentiles
JITTER_WINDOW: Final = 1024
_NS_PER_S: Final = 1_000_000_000


def lag_count(times: np.ndarray, now_ns: int, max_lag_ns: int | None) -> int:
    """Leading frames (non-decreasing ``times``) older than ``max_lag_ns`` at ``now_ns``."""
    if max_lag_ns is None or not len(times):
        return 0
    return int(np.searchsorted(times, now_ns - max_lag_ns, side="left"))


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens a second, a sustained rate whatever the trigger interval (#31.1).

    At each trigger ``t_k`` (:meth:`tick`) the stream holds ``min(left, burst) + rate x (t_k -
    t_(k-1))``: what the previous trigger left unspent is saved up to ``burst``, and what the
    interval since then earned is added in full. With a backlog every trigger spends what it
    holds, so the frames admitted by the triggers after ``t_i`` up to ``t_j`` are ``rate x (t_j
    - t_i)`` within one frame, however far apart the triggers are; after an idle pause one
    trigger admits at most ``burst`` plus what its own interval earned. A new query starts with
    ``burst`` (seed 004's controller); ``tokens=0`` starts empty (a restarted one).
    """

    rate: float
    burst: int
    tokens: float = -1.0
    last_ns: int | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = float(self.burst)

    def tick(self, now_ns: int) -> None:
        """A trigger at ``now_ns``: save what is left (up to ``burst``), add what was earned."""
        if self.last_ns is not None and now_ns > self.last_ns:
            earned = (now_ns - self.last_ns) * self.rate / _NS_PER_S
            self.tokens = min(float(self.burst), self.tokens) + earned
        if self.last_ns is None or now_ns > self.last_ns:
            self.last_ns = now_ns

    def available(self) -> int:
        """Whole tokens held since the last :meth:`tick`."""
        return int(self.tokens)

    def take(self, n: int) -> None:
        """``n`` frames were admitted (at most :meth:`available`)."""
        self.tokens = max(0.0, self.tokens - n)


@dataclass(slots=True)
class JitterMeter:
    """Inter-arrival intervals of one stream, from its frames' stamps, last seq measured."""

    intervals: np.ndarray = field(default_factory=lambda: np.zeros(JITTER_WINDOW, np.int64))
    count: int = 0  # intervals recorded in total (the window holds the last JITTER_WINDOW)
    last_seq: int = -1
    last_ns: int | None = None
    _pct: tuple[float, float] | None = None  # cached until new intervals arrive

    def observe(self, seqs: np.ndarray, times: np.ndarray) -> None:
        """Frames seen in a plan (ascending seqs); ones measured before are skipped, so frames
        deferred to the next trigger are not counted twice."""
        if not len(seqs):
            return
        start = int(np.searchsorted(seqs, self.last_seq, side="right"))
        if start >= len(seqs):
            return
        t = times[start:]
        d = np.diff(t) if self.last_ns is None else np.diff(t, prepend=self.last_ns)
        self.last_seq = int(seqs[-1])
        self.last_ns = int(t[-1])
        if not len(d):
            return
        d = d[-JITTER_WINDOW:]
        k = len(d)
        i = self.count % JITTER_WINDOW
        first = min(k, JITTER_WINDOW - i)
        self.intervals[i : i + first] = d[:first]
        if k > first:
            self.intervals[: k - first] = d[first:]
        self.count += k
        self._pct = None

    def percentiles(self) -> tuple[float, float] | None:
        """(p50, p99) of ``|interval - median interval|`` in ms; None before two frames."""
        n = min(self.count, JITTER_WINDOW)
        if n == 0:
            return None
        if self._pct is None:  # nearest-rank percentiles by partition: O(n), no sort
            w = self.intervals[:n]
            med = np.partition(w, n // 2)[n // 2]
            dev = np.abs(w - med)
            k50, k99 = (n - 1) // 2, round(0.99 * (n - 1))
            part = np.partition(dev, (k50, k99))
            self._pct = (float(part[k50]) / 1e6, float(part[k99]) / 1e6)
        return self._pct


@dataclass(slots=True)
class StreamAdmission:
    """One stream's admission state (bucket, jitter window, flag episode)."""

    bucket: TokenBucket | None
    jitter: JitterMeter = field(default_factory=JitterMeter)
    flagged: bool = False
    epoch: int | None = None  # the epoch the seq-keyed meters measure

    def enter(self, epoch: int) -> None:
        """#31.4: a new epoch restarts seq at 0 and is a new producer: its jitter is measured
        afresh (the old epoch's last arrival and seq mean nothing to it). The bucket stays: the
        rate is the stream's, whichever producer feeds it."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.jitter = JitterMeter()


__all__ = ["JITTER_WINDOW", "JitterMeter", "StreamAdmission", "TokenBucket", "lag_count"]
