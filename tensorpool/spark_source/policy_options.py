"""Options of the source's event-time, admission and sizing policies (#17), parsed strictly.

Kept apart from :mod:`~tensorpool.spark_source.options` (which calls :func:`parse_policy`)
so the policies' options live in one place; the same rules apply: a bad value fails
``load()`` with the option's name first, and an option that only applies together with
another one says so instead of being ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from tensorpool.spark_source.options import BATCHING_PULSE, _bool, _fail, _int

LATE_DROP: Final = "drop"
LATE_FLAG: Final = "flag"
AUTO: Final = "auto"
IS_LATE: Final = "is_late"
DEFAULT_IDLE_STREAM_TIMEOUT_MS: Final = 5000
DEFAULT_TARGET_MS: Final = 1000
DEFAULT_MAX_BATCH_MEMORY: Final = 64 << 20
DEFAULT_HIGH_WATER: Final = 0.8
DEFAULT_EMERGENCY: Final = 0.95
_MAX_MS: Final = 2**31

POLICY_OPTIONS: Final = (
    "alignEventTime",
    "maxEventTimeSkewMs",
    "idleStreamTimeoutMs",
    "lateFrames",
    "allowedLatenessMs",
    "maxFramesPerSecond",
    "maxBurstFrames",
    "maxLagMs",
    "maxJitterMs",
    "targetBatchLatencyMs",
    "maxBatchMemory",
    "memoryHighWater",
    "memoryEmergency",
)


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """The parsed policy options (None / False: that policy is off)."""

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


def _float(opts: dict[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise _fail(name, f"must be a number, got {raw!r}") from None
    if not (lo < value <= hi) or math.isnan(value):
        raise _fail(name, f"must be in ({lo:g}, {hi:g}], got {raw!r}")
    return value


def _needs(opts: dict[str, str], names: tuple[str, ...], what: str) -> None:
    for name in names:
        if name in opts:
            raise _fail(name, f"only applies with {what}")


def parse_policy(
    opts: dict[str, str], streaming: bool | None, batching: str
) -> PolicyOptions | None:
    """The policy options of ``opts`` (canonical names); None when none is given."""
    given = [n for n in POLICY_OPTIONS if n in opts]
    auto = opts.get("maxBytesPerTrigger", "").strip().lower() == AUTO
    if not given and not auto:
        return None
    names = given + (["maxBytesPerTrigger"] if auto else [])
    if streaming is False:
        raise _fail(names[0], "is for streaming queries (spark.readStream) only")
    if batching == BATCHING_PULSE:
        raise _fail(
            names[0],
            "cannot be combined with batching=pulse: a pulse window closes only when every "
            "gated stream has passed its end (the minimum rule at window granularity) and is "
            "exactly one micro-batch; use batching=none for per-frame event time and admission",
        )
    align = _bool(opts, "alignEventTime", False)
    if not align:
        _needs(opts, ("maxEventTimeSkewMs",), "alignEventTime=true")
    late = opts.get("lateFrames")
    if late is not None:
        late = late.strip().lower()
        if late not in (LATE_DROP, LATE_FLAG):
            raise _fail("lateFrames", f"must be {LATE_DROP!r} or {LATE_FLAG!r}, got {late!r}")
    else:
        _needs(opts, ("allowedLatenessMs",), "lateFrames")
    if not align and late is None:
        _needs(opts, ("idleStreamTimeoutMs",), "alignEventTime=true or lateFrames")
    fps = None
    if "maxFramesPerSecond" in opts:
        fps = _float(opts, "maxFramesPerSecond", 0.0, 0.0, 1e9)
    else:
        _needs(opts, ("maxBurstFrames",), "maxFramesPerSecond")
    burst = _int(opts, "maxBurstFrames", max(1, math.ceil(fps or 1)), 1, 2**62)
    sizing = auto or "targetBatchLatencyMs" in opts
    if not sizing:
        _needs(
            opts,
            ("maxBatchMemory", "memoryHighWater", "memoryEmergency"),
            "maxBytesPerTrigger=auto or targetBatchLatencyMs",
        )
    elif "maxBytesPerTrigger" in opts and not auto:
        raise _fail(
            "targetBatchLatencyMs",
            "sizes batches itself (maxBytesPerTrigger=auto); drop the fixed maxBytesPerTrigger",
        )
    high = _float(opts, "memoryHighWater", DEFAULT_HIGH_WATER, 0.0, 1.0)
    emergency = _float(opts, "memoryEmergency", DEFAULT_EMERGENCY, 0.0, 1.0)
    if emergency <= high:
        raise _fail(
            "memoryEmergency", f"must be above memoryHighWater ({high:g}), got {emergency:g}"
        )
    return PolicyOptions(
        align=align,
        skew_ms=_int(opts, "maxEventTimeSkewMs", 0, 0, _MAX_MS),  # type: ignore[arg-type]
        idle_ms=_int(  # type: ignore[arg-type]
            opts, "idleStreamTimeoutMs", DEFAULT_IDLE_STREAM_TIMEOUT_MS, 1, _MAX_MS
        ),
        late=late,
        allowed_lateness_ms=_int(opts, "allowedLatenessMs", 0, 0, _MAX_MS),  # type: ignore[arg-type]
        max_fps=fps,
        max_burst=burst,  # type: ignore[arg-type]
        max_lag_ms=_int(opts, "maxLagMs", None, 1, _MAX_MS),
        max_jitter_ms=_int(opts, "maxJitterMs", None, 1, _MAX_MS),
        auto_bytes=sizing,
        target_ms=_int(opts, "targetBatchLatencyMs", DEFAULT_TARGET_MS, 1, _MAX_MS),  # type: ignore[arg-type]
        max_batch_memory=_int(  # type: ignore[arg-type]
            opts, "maxBatchMemory", DEFAULT_MAX_BATCH_MEMORY, 1024, 2**62
        ),
        high_water=high,
        emergency=emergency,
    )


__all__ = [
    "AUTO",
    "IS_LATE",
    "LATE_DROP",
    "LATE_FLAG",
    "POLICY_OPTIONS",
    "PolicyOptions",
    "parse_policy",
]
