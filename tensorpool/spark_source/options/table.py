"""The option table: one row per option of ``format("tensorpool")``, the only place an option
is declared.

A row says what the generic parser (:mod:`.parse`) needs to read and check the option on its
own: its type and bounds, its default, where it applies (source or sink; batch or streaming
reads; local rings only, or also ``hosts``), which options it needs or cannot be combined with,
and where ``docs/spark.md`` documents it. Rules between the values of several options are the
list in :mod:`.rules`. The member name is the option's spelling in the docs; code outside this
package names an option as ``Opt.maxFramesPerTrigger``, never by a string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Final

from tensorpool.endpoints import (
    DEFAULT_CONTROL_STREAM_ID,
    DEFAULT_DESCRIPTOR_STREAM_ID,
    DEFAULT_SHM_BASE_DIR,
    IPC_CONTROL,
    IPC_DESCRIPTORS,
    MAX_AERON_STREAM_ID,
)
from tensorpool.spark_source.options import fields as f
from tensorpool.spark_source.options.policy import (
    DEFAULT_EMERGENCY,
    DEFAULT_HIGH_WATER,
    DEFAULT_IDLE_STREAM_TIMEOUT_MS,
    DEFAULT_MAX_BATCH_MEMORY,
    DEFAULT_TARGET_MS,
    LATE_DROP,
    LATE_FLAG,
)
from tensorpool.spark_source.options.values import (
    BATCHING_NONE,
    BATCHING_PULSE,
    DEFAULT_EARLIEST_MARGIN_MS,
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    DEFAULT_STALE_STREAM_TIMEOUT_MS,
    LATEST,
    MAX_BATCH_LENGTH_S,
    MAX_SEQ,
    ON_STALE_FAIL,
    ON_STALE_WARN,
    TIMESTAMP_STRATEGY_ERROR,
    TIMESTAMP_STRATEGY_LATEST,
)

# --- kinds: how the generic parser reads a value --------------------------------------------
INT: Final = "int"  # an integer in [lo, hi]
FLOAT: Final = "float"  # a number in (lo, hi]
BOOL: Final = "bool"  # true/1/yes, false/0/no
CHOICE: Final = "choice"  # one of ``choices``, case-insensitive
DURATION: Final = "duration"  # Kafka's "500ms", "10s", "15m", "1h" or plain ms
BYTES: Final = "bytes"  # an integer in [lo, hi] or ``auto``
TEXT: Final = "text"  # read by the row's ``parse`` on its own
STREAM_SCOPED: Final = "stream-scoped"  # read with the streams it names (kept as text)

# --- scope ------------------------------------------------------------------------------------
SOURCE: Final = frozenset({"source"})
SINK: Final = frozenset({"sink"})
BOTH: Final = SOURCE | SINK
ANY: Final = "any"
STREAMING: Final = "streaming"  # refused by spark.read
BATCH: Final = "batch"  # refused by spark.readStream

# --- docs anchors (sections of docs/spark.md that hold the option tables) -------------------
READING: Final = "reading"
WRITING: Final = "writing"
PULSE: Final = "pulse-aligned-micro-batches-batchingpulse"

#: policy rows (#17): event time, admission, adaptive sizing; none given = no policy object
POLICY: Final = "policy"

_PULSE_ONE_WINDOW: Final = "a micro-batch is exactly one window"
_PULSE_POLICY: Final = (
    "a pulse window closes only when every gated stream has passed its end (the minimum rule "
    "at window granularity) and is exactly one micro-batch; use batching=none for per-frame "
    "event time and admission"
)
_HOSTS: Final = "'hosts' (streams served by tensorpool serve)"
_SIZING: Final = ("maxBytesPerTrigger=auto", "targetBatchLatencyMs")
_MAX_MS: Final = 2**31


def _at_least_1ms(seconds: float, raw: str) -> str | None:
    return f"must be at least 0.001 s, got {raw!r}" if round(seconds * 1e9) < 1_000_000 else None


def _power_of_two(n: int, _raw: str) -> str | None:
    return f"must be a power of two, got {n}" if n & (n - 1) else None


@dataclass(frozen=True, eq=False)  # eq=False: rows that look alike stay distinct members
class Row:
    """One option. ``default`` is the typed value an absent option has (None: unset)."""

    kind: str
    default: object = None
    scope: frozenset[str] = SOURCE
    lo: float = 0
    hi: float = 0
    choices: tuple[str, ...] = ()
    unit: str = ""  # FLOAT: what the number counts, for messages ("seconds")
    parse: Callable[[str, str], object] | None = None  # TEXT: (name, raw) -> value
    check: Callable[..., str | None] | None = None  # (value, raw) -> what is wrong, or None
    mode: str = ANY
    local_only: bool = False  # needs the Spark driver host's SHM or Aeron: refused with hosts
    #: alternatives, each ``"name"`` (given) or ``"name=value"``; one must hold
    requires: tuple[str, ...] = ()
    requires_text: str = ""  # how the message names them (default: the alternatives)
    #: conditions (same form) the option cannot be combined with, and why
    excludes: tuple[str, ...] = ()
    excludes_why: str = ""
    required: str = ""  # required: what to give, for the message
    group: str = ""
    anchor: str = READING
    #: a default that depends on other values: what the docs' default column says about it
    default_doc: str = ""


def _int(default: int | None, lo: int, hi: int, **kw: object) -> Row:
    return Row(INT, default, lo=lo, hi=hi, **kw)  # type: ignore[arg-type]


_NOT_PULSE: Final = (f"batching={BATCHING_PULSE}",)


def _policy(row: Row) -> Row:
    """A #17 policy row: streaming only, not with batching=pulse."""
    return replace(
        row, mode=STREAMING, excludes=_NOT_PULSE, excludes_why=_PULSE_POLICY, group=POLICY
    )


class Opt(Enum):
    """The table. Order matters only for messages: the first broken row is reported."""

    # --- what to read / write ---
    streams = Row(STREAM_SCOPED, required="the stream id(s) to read, e.g. option('streams', '1,2')")
    stream = Row(
        TEXT,
        scope=SINK,
        parse=f.parse_stream_ids,
        required="the stream id to publish on, e.g. option('stream', '7')",
        anchor=WRITING,
    )
    # --- connection (source and sink) ---
    aeronDir = Row(
        TEXT,
        scope=BOTH,
        parse=f.aeron_dir,
        default_doc="/dev/shm/tensorpool-aeron-<uid>",
    )
    controlChannel = Row(TEXT, IPC_CONTROL, scope=BOTH, parse=f.channel)
    controlStreamId = _int(DEFAULT_CONTROL_STREAM_ID, 1, MAX_AERON_STREAM_ID, scope=BOTH)
    descriptorChannel = Row(TEXT, IPC_DESCRIPTORS, scope=BOTH, parse=f.channel)
    descriptorStreamId = _int(DEFAULT_DESCRIPTOR_STREAM_ID, 1, MAX_AERON_STREAM_ID, scope=BOTH)
    shmBaseDir = Row(TEXT, DEFAULT_SHM_BASE_DIR, scope=BOTH, parse=f.shm_dir)
    allowedBaseDirs = Row(TEXT, (), scope=BOTH, parse=f.abs_dirs, default_doc="shmBaseDir")
    driver = Row(BOOL, False, scope=BOTH, local_only=True)
    attachTimeoutMs = _int(10_000, 1, 3_600_000, scope=BOTH)
    # --- source ---
    freshnessMs = _int(3000, 10, 3_600_000)
    startingOffsets = Row(STREAM_SCOPED, default_doc="stream: `latest`; batch: `earliest`")
    earliestMarginMs = _int(DEFAULT_EARLIEST_MARGIN_MS, 0, 3_600_000)
    endingOffsets = Row(STREAM_SCOPED, LATEST, mode=BATCH)
    maxFramesPerTrigger = _int(
        None,
        1,
        MAX_SEQ,
        excludes=_NOT_PULSE,
        excludes_why=f"{_PULSE_ONE_WINDOW} (one partition per stream)",
    )
    maxBytesPerTrigger = Row(
        BYTES,
        lo=1,
        hi=MAX_SEQ,
        excludes=_NOT_PULSE,
        excludes_why=f"{_PULSE_ONE_WINDOW} (one partition per stream)",
    )
    minPartitions = _int(
        None,
        1,
        100_000,
        excludes=_NOT_PULSE,
        excludes_why=f"{_PULSE_ONE_WINDOW} (one partition per stream)",
        default_doc="one per stream",
    )
    failOnDataLoss = Row(BOOL, True)
    includeTensorMetadata = Row(BOOL, True)
    batching = Row(
        CHOICE,
        BATCHING_NONE,
        choices=(BATCHING_NONE, BATCHING_PULSE),
        local_only=True,
        anchor=PULSE,
    )
    batchLengthS = Row(
        FLOAT,
        1.0,
        lo=0,
        hi=MAX_BATCH_LENGTH_S,
        unit="seconds",
        check=_at_least_1ms,
        requires=(f"batching={BATCHING_PULSE}",),
        anchor=PULSE,
    )
    gatedStreams = Row(
        TEXT,
        parse=f.parse_stream_ids,
        requires=(f"batching={BATCHING_PULSE}",),
        anchor=PULSE,
        default_doc="all of `streams`",
    )
    startingOffsetsByTimestamp = Row(STREAM_SCOPED, local_only=True, excludes=_NOT_PULSE)
    endingOffsetsByTimestamp = Row(STREAM_SCOPED, mode=BATCH, local_only=True)
    startingOffsetsByTimestampStrategy = Row(
        CHOICE,
        TIMESTAMP_STRATEGY_ERROR,
        choices=(TIMESTAMP_STRATEGY_ERROR, TIMESTAMP_STRATEGY_LATEST),
        requires=("startingOffsetsByTimestamp",),
    )
    includeStreamMetadata = Row(BOOL, False, local_only=True)
    staleStreamTimeoutMs = _int(DEFAULT_STALE_STREAM_TIMEOUT_MS, 0, 2**31, mode=STREAMING)
    onStaleStream = Row(
        CHOICE, ON_STALE_FAIL, choices=(ON_STALE_FAIL, ON_STALE_WARN), mode=STREAMING
    )
    minFramesPerTrigger = _int(
        None, 1, MAX_SEQ, mode=STREAMING, excludes=_NOT_PULSE, excludes_why=_PULSE_ONE_WINDOW
    )
    maxTriggerDelay = Row(
        DURATION,
        DEFAULT_MAX_TRIGGER_DELAY_MS,
        requires=("minFramesPerTrigger",),
        default_doc="15m",
    )
    # --- streams on other hosts through `tensorpool serve` (#18) ---
    hosts = Row(STREAM_SCOPED)
    flightToken = Row(
        TEXT,
        parse=f.text,
        requires=("hosts",),
        requires_text=_HOSTS,
        default_doc="env `TENSORPOOL_SERVE_TOKEN`",
    )
    flightTlsRootCerts = Row(TEXT, parse=f.file_bytes, requires=("hosts",), requires_text=_HOSTS)
    preferLocalReads = Row(BOOL, True, requires=("hosts",), requires_text=_HOSTS)
    flightRetryMs = _int(15_000, 0, 3_600_000, requires=("hosts",), requires_text=_HOSTS)
    # --- #17: event time, admission, adaptive sizing ---
    alignEventTime = _policy(Row(BOOL, False))
    maxEventTimeSkewMs = _policy(_int(0, 0, _MAX_MS, requires=("alignEventTime=true",)))
    idleStreamTimeoutMs = _policy(
        _int(
            DEFAULT_IDLE_STREAM_TIMEOUT_MS,
            1,
            _MAX_MS,
            requires=("alignEventTime=true", "lateFrames"),
        )
    )
    lateFrames = _policy(Row(CHOICE, choices=(LATE_DROP, LATE_FLAG)))
    allowedLatenessMs = _policy(_int(0, 0, _MAX_MS, requires=("lateFrames",)))
    maxFramesPerSecond = _policy(Row(FLOAT, lo=0.0, hi=1e9))
    maxBurstFrames = _policy(
        _int(None, 1, 2**62, requires=("maxFramesPerSecond",), default_doc="⌈`maxFramesPerSecond`⌉")
    )
    maxLagMs = _policy(_int(None, 1, _MAX_MS))
    maxJitterMs = _policy(_int(None, 1, _MAX_MS))
    targetBatchLatencyMs = _policy(_int(DEFAULT_TARGET_MS, 1, _MAX_MS))
    maxBatchMemory = _policy(_int(DEFAULT_MAX_BATCH_MEMORY, 1024, 2**62, requires=_SIZING))
    memoryHighWater = _policy(Row(FLOAT, DEFAULT_HIGH_WATER, lo=0.0, hi=1.0, requires=_SIZING))
    memoryEmergency = _policy(Row(FLOAT, DEFAULT_EMERGENCY, lo=0.0, hi=1.0, requires=_SIZING))
    # --- sink ---
    headerNslots = _int(1024, 1, 1 << 24, scope=SINK, check=_power_of_two, anchor=WRITING)
    maxFrameBytes = _int(1 << 20, 1, 1 << 31, scope=SINK, anchor=WRITING)
    instanceId = Row(
        TEXT,
        scope=SINK,
        parse=f.path_component,
        anchor=WRITING,
        default_doc="spark-sink-<stream>",
    )
    announcePeriodMs = _int(1000, 10, 60_000, scope=SINK, anchor=WRITING)
    publisherIdleTimeoutMs = _int(600_000, 0, 2**31, scope=SINK, anchor=WRITING)
    commitTimeoutMs = _int(60_000, 1, 3_600_000, scope=SINK, anchor=WRITING)
    sinkId = Row(TEXT, scope=SINK, parse=f.text, anchor=WRITING, default_doc="checkpointLocation")
    #: Spark passes it to streaming sinks; it keys batchId idempotency when sinkId is not given
    checkpointLocation = Row(TEXT, scope=SINK, parse=f.text, anchor=WRITING)

    @property
    def row(self) -> Row:
        return self.value

    def __str__(self) -> str:
        return self.name
