"""The admission policy's options (#17): event time, admission control, adaptive sizing.

A leaf of :mod:`~tensorpool.spark_source.options` that imports nothing of the package or of
the transport: :mod:`~tensorpool.spark_source.plan` reads it, and planning reaches no Arrow,
Aeron or transport module (#27.2, ``tests/unit/test_layering.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: ``lateFrames`` values and the column ``flag`` adds (#17)
LATE_DROP: Final = "drop"
LATE_FLAG: Final = "flag"
IS_LATE: Final = "is_late"
#: ``maxBytesPerTrigger=auto``: adaptive sizing (#17)
AUTO: Final = "auto"
DEFAULT_IDLE_STREAM_TIMEOUT_MS: Final = 5000
#: adaptive sizing defaults (seed 001: 100 MB buffers, high water 0.8, emergency 0.95); the
#: Python data source's driver process cannot see executor memory, so the bound is fixed
DEFAULT_TARGET_MS: Final = 1000
DEFAULT_MAX_BATCH_MEMORY: Final = 64 << 20
DEFAULT_HIGH_WATER: Final = 0.8
DEFAULT_EMERGENCY: Final = 0.95


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """The event-time, admission and sizing options (#17); None / False: that policy is off."""

    align: bool = False
    skew_ms: int = 0
    idle_ms: int = DEFAULT_IDLE_STREAM_TIMEOUT_MS
    late: str | None = None  # LATE_DROP / LATE_FLAG
    allowed_lateness_ms: int = 0
    max_fps: float | None = None
    max_burst: int = 0
    max_lag_ms: int | None = None
    max_jitter_ms: int | None = None
    auto_bytes: bool = False  # maxBytesPerTrigger=auto or targetBatchLatencyMs
    target_ms: int = DEFAULT_TARGET_MS
    max_batch_memory: int = DEFAULT_MAX_BATCH_MEMORY
    high_water: float = DEFAULT_HIGH_WATER
    emergency: float = DEFAULT_EMERGENCY

    @property
    def event_time(self) -> bool:
        return self.align or self.late is not None

    @property
    def admission(self) -> bool:
        limits = (self.max_fps, self.max_lag_ms, self.max_jitter_ms)
        return any(x is not None for x in limits)


__all__ = [
    "AUTO",
    "DEFAULT_EMERGENCY",
    "DEFAULT_HIGH_WATER",
    "DEFAULT_IDLE_STREAM_TIMEOUT_MS",
    "DEFAULT_MAX_BATCH_MEMORY",
    "DEFAULT_TARGET_MS",
    "IS_LATE",
    "LATE_DROP",
    "LATE_FLAG",
    "PolicyOptions",
]
