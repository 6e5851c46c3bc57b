"""Options of the source's event-time, admission and sizing policies (#17), parsed strictly.

Kept apart from :mod:`~tensorpool.spark_source.options` (which calls :func:`parse_policy`)
so the policies' options live in one place; the same rules apply: a bad value fails
``load()`` with the option's name first, and an option that only applies together with
another one says so instead of being ignored. It imports nothing of the package (``options``
imports it): errors are made by the ``fail`` the caller passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

LATE_DROP: Final = "drop"
LATE_FLAG: Final = "flag"
AUTO: Final = "auto"
IS_LATE: Final = "is_late"
DEFAULT_IDLE_STREAM_TIMEOUT_MS: Final = 5000
#: adaptive sizing defaults (seed 001: 100 MB buffers, high water 0.8, emergency 0.95); the
#: Python data source's driver process cannot see executor memory, so the bound is fixed
DEFAULT_TARGET_MS: Final = 1000
DEFAULT_MAX_BATCH_MEMORY: Final = 64 << 20
DEFAULT_HIGH_WATER: Final = 0.8
DEFAULT_EMERGENCY: Final = 0.95
#: fail(option name, message) -> the exception to raise (options.TensorPoolOptionError)
FailFn = Callable[[str, str], Exception]
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


def parse_bool(raw: str) -> bool | None:
    """The one spelling of a boolean Spark option (``true/1/yes``, ``false/0/no``); None when
    it is neither, for the caller to name the option in its error."""
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    return None


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


class _Parse:
    """Typed readers of one option map that fail through ``fail``."""

    def __init__(self, opts: dict[str, str], fail: FailFn) -> None:
        self.opts = opts
        self.fail = fail

    def int(self, name: str, default: int | None, lo: int, hi: int) -> int | None:
        raw = self.opts.get(name)
        if raw is None:
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            raise self.fail(name, f"must be an integer, got {raw!r}") from None
        if not lo <= value <= hi:
            raise self.fail(name, f"must be in {lo}..{hi}, got {value}")
        return value

    def float(self, name: str, default: float, lo: float, hi: float) -> float:
        raw = self.opts.get(name)
        if raw is None:
            return default
        try:
            value = float(raw.strip())
        except ValueError:
            raise self.fail(name, f"must be a number, got {raw!r}") from None
        if not (lo < value <= hi) or math.isnan(value):
            raise self.fail(name, f"must be in ({lo:g}, {hi:g}], got {raw!r}")
        return value

    def bool(self, name: str, default: bool) -> bool:
        raw = self.opts.get(name)
        if raw is None:
            return default
        value = parse_bool(raw)
        if value is None:
            raise self.fail(name, f"must be true or false, got {raw!r}")
        return value

    def needs(self, names: tuple[str, ...], what: str) -> None:
        for name in names:
            if name in self.opts:
                raise self.fail(name, f"only applies with {what}")


def parse_policy(
    opts: dict[str, str], streaming: bool | None, pulse: bool, fail: FailFn
) -> PolicyOptions | None:
    """The policy options of ``opts`` (canonical names); None when none is given.
    ``pulse``: ``batching=pulse`` was chosen."""
    read = _Parse(opts, fail)
    given = [n for n in POLICY_OPTIONS if n in opts]
    auto = opts.get("maxBytesPerTrigger", "").strip().lower() == AUTO
    if not given and not auto:
        return None
    names = given + (["maxBytesPerTrigger"] if auto else [])
    if streaming is False:
        raise fail(names[0], "is for streaming queries (spark.readStream) only")
    if pulse:
        raise fail(
            names[0],
            "cannot be combined with batching=pulse: a pulse window closes only when every "
            "gated stream has passed its end (the minimum rule at window granularity) and is "
            "exactly one micro-batch; use batching=none for per-frame event time and admission",
        )
    align = read.bool("alignEventTime", False)
    if not align:
        read.needs(("maxEventTimeSkewMs",), "alignEventTime=true")
    late = opts.get("lateFrames")
    if late is not None:
        late = late.strip().lower()
        if late not in (LATE_DROP, LATE_FLAG):
            raise fail("lateFrames", f"must be {LATE_DROP!r} or {LATE_FLAG!r}, got {late!r}")
    else:
        read.needs(("allowedLatenessMs",), "lateFrames")
    if not align and late is None:
        read.needs(("idleStreamTimeoutMs",), "alignEventTime=true or lateFrames")
    fps = None
    if "maxFramesPerSecond" in opts:
        fps = read.float("maxFramesPerSecond", 0.0, 0.0, 1e9)
    else:
        read.needs(("maxBurstFrames",), "maxFramesPerSecond")
    burst = read.int("maxBurstFrames", max(1, math.ceil(fps or 1)), 1, 2**62)
    sizing = auto or "targetBatchLatencyMs" in opts
    if not sizing:
        read.needs(
            ("maxBatchMemory", "memoryHighWater", "memoryEmergency"),
            "maxBytesPerTrigger=auto or targetBatchLatencyMs",
        )
    elif "maxBytesPerTrigger" in opts and not auto:
        raise fail(
            "targetBatchLatencyMs",
            "sizes batches itself (maxBytesPerTrigger=auto); drop the fixed maxBytesPerTrigger",
        )
    high = read.float("memoryHighWater", DEFAULT_HIGH_WATER, 0.0, 1.0)
    emergency = read.float("memoryEmergency", DEFAULT_EMERGENCY, 0.0, 1.0)
    if emergency <= high:
        raise fail(
            "memoryEmergency", f"must be above memoryHighWater ({high:g}), got {emergency:g}"
        )
    return PolicyOptions(
        align=align,
        skew_ms=read.int("maxEventTimeSkewMs", 0, 0, _MAX_MS),  # type: ignore[arg-type]
        idle_ms=read.int(  # type: ignore[arg-type]
            "idleStreamTimeoutMs", DEFAULT_IDLE_STREAM_TIMEOUT_MS, 1, _MAX_MS
        ),
        late=late,
        allowed_lateness_ms=read.int("allowedLatenessMs", 0, 0, _MAX_MS),  # type: ignore[arg-type]
        max_fps=fps,
        max_burst=burst,  # type: ignore[arg-type]
        max_lag_ms=read.int("maxLagMs", None, 1, _MAX_MS),
        max_jitter_ms=read.int("maxJitterMs", None, 1, _MAX_MS),
        auto_bytes=sizing,
        target_ms=read.int("targetBatchLatencyMs", DEFAULT_TARGET_MS, 1, _MAX_MS),  # type: ignore[arg-type]
        max_batch_memory=read.int(  # type: ignore[arg-type]
            "maxBatchMemory", DEFAULT_MAX_BATCH_MEMORY, 1024, 2**62
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
