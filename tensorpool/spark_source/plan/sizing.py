"""Adaptive micro-batch sizing under a memory bound (seed 004 §6, seed 001 memory bounds, #17).

``maxBytesPerTrigger=auto`` (or ``targetBatchLatencyMs``): the byte budget of each micro-batch
comes from the cost of recent batches instead of a fixed number. Sans-IO: the reader tells
:class:`BatchSizer` when a batch was planned (``partitions()``, bytes) and when the next
trigger came (``latestOffset()``); the clock is passed in, so the rules run under a driven
clock in the unit tests.

Rules
-----
* **latency** -- a batch's latency is measured from its ``partitions()`` to the next
  ``latestOffset()`` (Spark asks for the next offset when the batch is done; with a
  ``processingTime`` trigger the sample is at least the trigger interval, so give a target at
  or above it). Latency is modelled as ``overhead + cost x bytes``, fitted to the last
  :data:`WINDOW` batches (:meth:`BatchSizer.model`: a micro-batch has a large fixed cost --
  task start, checkpoint writes -- so a cost per byte alone would shrink small batches for
  ever), and the budget is ``(targetBatchLatencyMs - overhead) / cost``, grown at most
  :data:`MAX_GROWTH` times the largest recent batch per step (a small batch says little about
  a large one). When the overhead alone exceeds the target no size meets it, and the budget
  grows for throughput (up to the high water). Never below the batch that keeps up with the
  producers (:meth:`BatchSizer.keep_up`: ``overhead + cost x b <= b / arrival rate``, the
  rate measured from what the query owes at each trigger): a smaller batch would meet the
  target only while the backlog grows.
* **high water** (seed 001 ``high_water_mark``, 0.8) -- no batch is planned above
  ``memoryHighWater x maxBatchMemory``: a latency budget above it is shrunk to it (counted
  ``highWater``; progress ``pressure: "high"``). ``maxBatchMemory`` is thus a hard bound with
  headroom for the frames' Arrow overhead.
* **emergency** (seed 001 ``emergency_threshold``, 0.95) -- the bytes the query owes (committed
  frames not yet planned, every stream) above ``memoryEmergency x maxBatchMemory``: the oldest
  frames are shed until what is owed is back at the high water (counted ``shedMemory``;
  progress ``pressure: "emergency"``). The query thus never falls more than
  ``maxBatchMemory`` of frames behind: it skips ahead, as seed 001's emergency flush does,
  instead of reading ever older frames until the ring overwrites them (which would be loss).

Before the first measured batch the budget is :data:`INITIAL_BYTES` (capped by the high water).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from tensorpool.spark_source.options.policy import (
    DEFAULT_EMERGENCY,
    DEFAULT_HIGH_WATER,
    DEFAULT_MAX_BATCH_MEMORY,
    DEFAULT_TARGET_MS,
)
from tensorpool.spark_source.plan.offsets import split_budget

#: batches whose cost the budget is computed from
WINDOW: Final = 8
#: a budget never grows past this multiple of the largest recent batch in one step
MAX_GROWTH: Final = 4.0
#: the budget before any batch was measured
INITIAL_BYTES: Final = 1 << 20

NORMAL: Final = "normal"
HIGH: Final = "high"
EMERGENCY: Final = "emergency"


@dataclass(frozen=True, slots=True)
class SizingConfig:
    target_ns: int
    max_memory: int = DEFAULT_MAX_BATCH_MEMORY
    high_water: float = DEFAULT_HIGH_WATER
    emergency: float = DEFAULT_EMERGENCY

    @property
    def high_bytes(self) -> int:
        return max(1, int(self.max_memory * self.high_water))

    @property
    def emergency_bytes(self) -> int:
        return max(1, int(self.max_memory * self.emergency))


@dataclass(slots=True)
class BatchSizer:
    cfg: SizingConfig
    samples: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    pending: tuple[int, int] | None = None  # (bytes, planned at) of the batch being run
    last_budget: int = 0
    pressure: str = NORMAL
    high_water: int = 0  # budgets shrunk to the high water
    emergencies: int = 0  # plans that shed for the emergency threshold
    #: bytes/s the producers add to what the query owes (EWMA over triggers)
    arrival_bps: float | None = None
    _owed: tuple[int, int] | None = None  # (owed bytes, at) of the previous trigger
    _taken: int = 0  # bytes planned since then

    def planned(self, nbytes: int, now_ns: int) -> None:
        """``partitions()`` of a batch holding ``nbytes`` (empty batches are not measured)."""
        self.pending = (nbytes, now_ns) if nbytes > 0 else None
        self._taken += nbytes

    def owed(self, owed_bytes: int, now_ns: int) -> None:
        """A trigger's unread backlog: with the bytes planned since the previous one, how fast
        the producers add to it."""
        prev = self._owed
        if prev is not None and now_ns > prev[1]:
            arrived = max(0, owed_bytes - (prev[0] - self._taken))
            rate = arrived * 1e9 / (now_ns - prev[1])
            a = self.arrival_bps
            self.arrival_bps = rate if a is None else 0.5 * a + 0.5 * rate
        self._owed = (owed_bytes, now_ns)
        self._taken = 0

    def triggered(self, now_ns: int) -> None:
        """``latestOffset()``: the batch planned before is done; its latency is a sample."""
        if self.pending is not None:
            nbytes, t0 = self.pending
            self.pending = None
            if now_ns > t0:
                self.samples.append((nbytes, now_ns - t0))

    def model(self) -> tuple[float, float] | None:
        """``(overhead_ns, ns_per_byte)``: latency = overhead + cost x bytes, fitted to the
        recent batches (least squares; with one size only, or a fit that makes no sense, the
        overhead is the fastest batch and the cost what the others took beyond it)."""
        if not self.samples:
            return None
        bs = np.array([b for b, _ in self.samples], np.float64)
        ts = np.array([t for _, t in self.samples], np.float64)
        if len(bs) >= 2 and bs.var() > 0:
            c = float(((bs - bs.mean()) * (ts - ts.mean())).mean() / bs.var())
            a = float(ts.mean() - c * bs.mean())
            if c > 0 and a >= 0:
                return a, c
        a = float(ts.min())
        return a, float((ts - a).sum() / bs.sum())

    def keep_up(self, a: float, c: float) -> int:
        """The smallest batch that keeps up with the producers: ``T(b) <= b / rate`` with
        ``T(b) = a + c x b`` (a smaller one meets the target only while the backlog grows,
        which ends in loss or shedding); 0 when the rate is unknown."""
        r = self.arrival_bps
        if not r:
            return 0
        per_byte = c * r / 1e9  # batch seconds per arriving byte-second
        if per_byte >= 1:
            return self.cfg.high_bytes  # cannot keep up at any size: the largest batches
        return int(a / 1e9 * r / (1 - per_byte))

    def cost_ns_per_byte(self) -> float | None:
        m = self.model()
        return None if m is None else m[1]

    def budget(self) -> int:
        """The byte budget of the next batch (latency rule, then the high water)."""
        m = self.model()
        if m is None:
            b = INITIAL_BYTES
        else:
            a, c = m
            grow = int(MAX_GROWTH * max(nb for nb, _ in self.samples))
            # the overhead alone over the target: no size meets it, size for throughput
            b = grow if c <= 0 or a >= self.cfg.target_ns else int((self.cfg.target_ns - a) / c)
            b = max(1, min(max(b, self.keep_up(a, c)), grow))
        high = self.cfg.high_bytes
        if b > high:
            b = high
            if m is not None:
                self.high_water += 1
            self.pressure = HIGH
        else:
            self.pressure = NORMAL
        self.last_budget = b
        return b

    def emergency_keep(self, owed_bytes: int) -> int | None:
        """Bytes to keep of what the query owes when over the emergency threshold (then shed
        the oldest down to the high water), else None."""
        if owed_bytes <= self.cfg.emergency_bytes:
            return None
        self.emergencies += 1
        self.pressure = EMERGENCY
        return self.cfg.high_bytes


def shed_oldest(lens: Sequence[np.ndarray], keep: int) -> list[int]:
    """Leading frames to shed per stream so that at most ``keep`` bytes remain in all.

    ``keep`` is shared among the streams in proportion to what each is owed
    (:func:`~tensorpool.spark_source.plan.offsets.split_budget`, deterministic); each stream
    sheds its oldest frames down to its share.
    """
    totals = [int(x.sum()) for x in lens]
    shares = split_budget(keep, totals)
    out: list[int] = []
    for sz, total, share in zip(lens, totals, shares, strict=True):
        if total <= share:
            out.append(0)
            continue
        csum = np.cumsum(sz)
        out.append(int(np.searchsorted(csum, total - share, side="left")) + 1)
    return out


__all__ = [
    "DEFAULT_EMERGENCY",
    "DEFAULT_HIGH_WATER",
    "DEFAULT_MAX_BATCH_MEMORY",
    "DEFAULT_TARGET_MS",
    "EMERGENCY",
    "HIGH",
    "INITIAL_BYTES",
    "NORMAL",
    "BatchSizer",
    "SizingConfig",
    "shed_oldest",
]
