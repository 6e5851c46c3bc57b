"""Per-stream pulse-rate estimation from message timestamps.

A pulsed source (a neutron detector at 14 Hz, a beam monitor at 5 Hz) stamps each
message with the time of its pulse. Consecutive timestamps therefore differ by a
whole number of pulse periods: one when nothing was lost, two or more after a
missed pulse, zero when one pulse was split into several messages. The estimator
keeps the last few positive differences and turns them into an integer rate in Hz,
the form in which facility sources publish their rates.

Algorithm (seed 000, "StreamPeriodEstimator"):

1. a ring of the last :data:`DIFF_RING_SIZE` positive inter-arrival differences;
   a difference ``<= 0`` (out-of-order message or split message) is ignored;
2. the median difference is a first guess (``seed``) of the period; it is right as
   long as single-period gaps are the majority;
3. every difference is divided by its pulse count ``k = round(diff / seed)``,
   keeping only ``k >= 1``; the median of these per-pulse values is the period;
4. ``1e9 / period`` is snapped to the nearest integer rate when it lies within a
   small tolerance of it, otherwise the stream has no usable rate yet.

Limits: the median of single differences carries the jitter of two timestamps, so
with large jitter (beyond ~15 ms at 14 Hz) one estimate can snap to a neighbouring
integer; the batcher therefore only builds or changes a grid after repeated agreeing
estimates. Split parts must carry the same timestamp (as split pulses do); parts
stamped slightly apart make up half of the differences and defeat the median seed.

Nothing here reads a clock: timestamps are passed in as integer nanoseconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = [
    "DIFF_RING_SIZE",
    "MIN_DIFFS_FOR_GATE",
    "SNAP_TOLERANCE_ABS_HZ",
    "SNAP_TOLERANCE_REL",
    "StreamPeriodEstimator",
]

#: Positive inter-arrival differences kept per stream (seed: "N=32").
DIFF_RING_SIZE = 32

#: Differences needed before a rate is reported at all. With fewer, one missed or
#: split pulse could dominate the medians and lock the stream on a wrong rate.
MIN_DIFFS_FOR_GATE = 4

#: A raw rate snaps to integer ``R`` only if ``|raw - R| <= max(REL * R, ABS)``.
#: At high rates the nearest integer is always within 0.5 Hz, so the relative
#: bound never vetoes; at low rates the absolute floor stops e.g. a 0.85 Hz or a
#: 1.5 Hz source from being treated as 1 Hz or 2 Hz, which would place its
#: pulses in the wrong slots for ever.
SNAP_TOLERANCE_REL = 0.05
SNAP_TOLERANCE_ABS_HZ = 0.05

_NS_PER_S = 1_000_000_000


class StreamPeriodEstimator:
    """Infers a stream's pulse period from the gaps between its timestamps.

    ``observe`` is on the per-message hot path and does only a subtraction and a
    ring append; the medians are computed on demand (once per batch close), so the
    estimate costs nothing per message.
    """

    __slots__ = ("_diffs", "_last_ns", "_total")

    def __init__(self, ring_size: int = DIFF_RING_SIZE) -> None:
        if ring_size < MIN_DIFFS_FOR_GATE:
            raise ValueError(
                f"ring_size must be >= MIN_DIFFS_FOR_GATE ({MIN_DIFFS_FOR_GATE}), got {ring_size}"
            )
        self._diffs: deque[int] = deque(maxlen=ring_size)
        self._last_ns: int | None = None
        self._total = 0  # diffs ever recorded, so callers can tell how fresh the ring is

    def observe(self, ts_ns: int) -> None:
        """Record one timestamp.

        The reference point is the newest timestamp seen, so an out-of-order
        message yields a negative difference and is ignored instead of producing
        two bogus short gaps; a split message (same timestamp) yields zero and is
        ignored too.
        """
        last = self._last_ns
        if last is None:
            self._last_ns = ts_ns
            return
        diff = ts_ns - last
        if diff > 0:
            self._diffs.append(diff)
            self._last_ns = ts_ns
            self._total += 1

    @property
    def last_ns(self) -> int | None:
        """Newest timestamp observed (a real pulse time), or ``None``."""
        return self._last_ns

    @property
    def diff_count(self) -> int:
        return len(self._diffs)

    @property
    def total_diffs(self) -> int:
        """Positive differences recorded since creation (not capped by the ring)."""
        return self._total

    @property
    def diffs(self) -> tuple[int, ...]:
        return tuple(self._diffs)

    def period_ns(self) -> float | None:
        """Median per-pulse period, or ``None`` before ``MIN_DIFFS_FOR_GATE`` diffs."""
        diffs = self._diffs
        if len(diffs) < MIN_DIFFS_FOR_GATE:
            return None
        ordered = sorted(diffs)
        seed = _median(ordered)
        # k = round(d / seed) as int(d / seed + 0.5): d and seed are positive.
        per_pulse = [d / k for d in ordered if (k := int(d / seed + 0.5))]
        # Every diff near the median has k == 1, so per_pulse is never empty.
        per_pulse.sort()
        return _median(per_pulse)

    def raw_rate_hz(self) -> float | None:
        period = self.period_ns()
        if period is None:
            return None
        return _NS_PER_S / period

    def rate_hz(self) -> int | None:
        """Integer rate in Hz, or ``None`` while not converged or not integral.

        Sub-Hz sources never get a rate (they round to 0 or fail the snap), which
        is what makes them ride along ungridded.
        """
        raw = self.raw_rate_hz()
        if raw is None:
            return None
        rate = round(raw)
        if rate < 1:
            return None
        if abs(raw - rate) > max(SNAP_TOLERANCE_REL * rate, SNAP_TOLERANCE_ABS_HZ):
            return None
        return rate

    # -- persistence -------------------------------------------------------------

    def to_state(self) -> dict[str, object]:
        return {"last_ns": self._last_ns, "diffs": list(self._diffs), "total": self._total}

    @classmethod
    def from_state(
        cls, state: dict[str, object], ring_size: int = DIFF_RING_SIZE
    ) -> StreamPeriodEstimator:
        est = cls(ring_size)
        last = state.get("last_ns")
        est._last_ns = None if last is None else _as_int(last, "last_ns")
        raw = state.get("diffs", [])
        if not isinstance(raw, Iterable):
            raise ValueError("estimator state 'diffs' must be a list of positive integers")
        for d in raw:
            value = _as_int(d, "diffs")
            if value <= 0:
                raise ValueError(f"estimator state 'diffs' holds a non-positive value {value}")
            est._diffs.append(value)
        est._total = _as_int(state.get("total", len(est._diffs)), "total")
        return est


def _median(ordered: list[float] | list[int]) -> float:
    """Median of an already sorted, non-empty list (statistics.median re-sorts and is slow)."""
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"estimator state {name!r} must be an integer, got {value!r}")
    return value
