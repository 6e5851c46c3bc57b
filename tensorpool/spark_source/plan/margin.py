"""Where ``startingOffsets=earliest`` starts on a live ring: the oldest frame that will still be
there when the tasks read it (#16.1).

The oldest frame of a full ring is the next one the producer overwrites: at 100 Hz it is gone
about 10 ms after the plan, long before Spark starts a task (a second or more). So ``earliest``
skips the frames the producer is expected to overwrite within ``earliestMarginMs``
(default ``options.DEFAULT_EARLIEST_MARGIN_MS``), forecast from the frames' own timestamps: the
rate over the ring's time span, if the stream is publishing now. A stream whose newest frame
is older than :data:`IDLE_INTERVALS` of its frame intervals (at least :data:`IDLE_FLOOR_NS`)
is idle -- stopped, or a burst that filled the ring -- and skips nothing; a ring that is not
full skips only what the forecast would wrap onto.

Frame ``s`` is overwritten when the producer reaches seq ``s + nslots`` (Wire §10.2.1: its
slot is ``s & (nslots - 1)``; a relay's sparse seqs advance at its source's pace and the rule
holds in seq space), so with a forecast advance of ``A`` seqs the first safe seq is
``head - nslots + A``. When the ring holds less than the margin (``A >= nslots``) nothing is
safe for the whole margin: the read then keeps the newest quarter of the ring (they survive
three quarters of the ring's time span) and the caller logs a warning that names the ring's
time span.

Stamps on another clock than the stream's clock domain (in the future by more than a second,
e.g. event times written through the sink) cannot be compared with now: such a stream is taken
as publishing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Final

import numpy as np

from tensorpool.client.announce import CLOCK_MONOTONIC
from tensorpool.spark_source.plan.offsets import RingState

#: Never skip more than this fraction of a ring's slots (the newest quarter is kept).
MAX_SKIP_FRACTION: Final = 0.75
_FUTURE_SLACK_NS: Final = 1_000_000_000
#: A stream whose newest frame is older than this many of its frame intervals (and than
#: IDLE_FLOOR_NS) is idle: a burst that filled the ring and stopped needs no margin.
IDLE_INTERVALS: Final = 20
IDLE_FLOOR_NS: Final = 20_000_000


@dataclass(frozen=True, slots=True)
class SafeStart:
    """Where ``earliest`` starts: ``seq``; ``skipped`` frames of the ring left out."""

    seq: int
    skipped: int
    rate_hz: float  # frames per second the forecast assumed (0: idle)
    ring_span_s: float | None  # seconds the ring holds at that rate (None: idle)
    capped: bool  # the ring holds less than the margin: only its newest quarter is read


def now_for(clock_domain: int) -> int:
    """Now on the clock of a stream's stamps (CLOCK_MONOTONIC is host-wide)."""
    return time.monotonic_ns() if clock_domain == CLOCK_MONOTONIC else time.time_ns()


def safe_earliest(st: RingState, now_ns: int, margin_ns: int) -> SafeStart:
    """The first seq of ``st`` the producer should not overwrite within ``margin_ns``.

    Uses ``st.stamps`` (each slot's ``timestamp_ns``, as scanned); without them, the oldest.
    """
    stamps = st.stamps
    whole = SafeStart(st.oldest, 0, 0.0, None, False)
    if margin_ns <= 0 or stamps is None or st.empty:
        return whole
    seqs = st.present(st.oldest, st.head)
    if len(seqs) < 2:
        return whole
    ts = np.asarray(stamps, np.int64)[seqs & (st.nslots - 1)]
    t_old, t_new = int(ts.min()), int(ts.max())
    span = t_new - t_old
    if span <= 0:
        return whole
    seq_rate = (int(seqs[-1]) - int(seqs[0])) / span  # seqs per ns while it was publishing
    rate = (len(seqs) - 1) * 1e9 / span  # frames per second
    if t_new <= now_ns + _FUTURE_SLACK_NS:  # on the stream's clock: is it publishing now?
        idle_after = max(IDLE_FLOOR_NS, IDLE_INTERVALS * span / (len(seqs) - 1))
        if now_ns - t_new > idle_after:
            return whole  # stopped (or between bursts): nothing will overwrite the ring soon
    advance = seq_rate * margin_ns
    if advance <= 0:
        return whole
    limit = st.head - max(1, st.nslots - int(st.nslots * MAX_SKIP_FRACTION))
    want = st.head - st.nslots + math.ceil(advance)
    capped = want > limit
    start = max(st.oldest, min(want, limit))
    skipped = len(seqs) - len(st.present(start, st.head))
    span_s = st.nslots / rate if rate > 0 else None
    return SafeStart(start, skipped, rate, span_s, capped)


def describe(sid: int, margin_ms: int, choice: SafeStart) -> str:
    """Log line for a start that skipped frames (or had to be capped)."""
    span = f"{choice.ring_span_s:.2f} s" if choice.ring_span_s is not None else "?"
    if choice.capped:
        return (
            f"tensorpool: stream {sid}: the ring holds only about {span} of frames at "
            f"{choice.rate_hz:.0f} Hz, less than earliestMarginMs={margin_ms}: 'earliest' reads "
            f"its newest quarter from seq {choice.seq} ({choice.skipped} older frame(s) skipped); "
            "frames may still be overwritten before the tasks read them. Give the ring more "
            "slots, lower earliestMarginMs, or read it with spark.readStream"
        )
    return (
        f"tensorpool: stream {sid}: 'earliest' starts at seq {choice.seq}, skipping the "
        f"{choice.skipped} oldest frame(s) the producer ({choice.rate_hz:.0f} Hz) overwrites "
        f"within earliestMarginMs={margin_ms}"
    )


__all__ = [
    "IDLE_FLOOR_NS",
    "IDLE_INTERVALS",
    "MAX_SKIP_FRACTION",
    "SafeStart",
    "describe",
    "now_for",
    "safe_earliest",
]
