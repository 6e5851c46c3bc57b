"""Options of the ``tensorpool`` Spark format: parsed once, validated fully, frozen.

Spark hands a data source a case-insensitive string map. Everything a user can get wrong is
caught here, at ``load()`` / ``save()`` time, by :func:`parse_source_options` or
:func:`parse_sink_options`, and reported as a :class:`TensorPoolOptionError` whose message
starts with the offending option's name (in the spelling the docs use). Unknown options are
errors too: a typo such as ``maxFramePerTrigger`` would otherwise silently disable admission
control. The parsed objects are frozen dataclasses of plain values, so they pickle into every
executor task unchanged.

Offsets in ``startingOffsets`` / ``endingOffsets`` JSON follow the source's offset model (see
:mod:`tensorpool.spark_source.plan.offsets`): ``{"<stream>": {"epoch": E, "seq": S}}`` where
``S`` is the next sequence number to read; a stream may also be given as ``"earliest"`` /
``"latest"``.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from tensorpool.client.settings import ClientSettings
from tensorpool.config_util import aeron_dir_problem
from tensorpool.endpoints import (
    IPC_CONTROL,
    IPC_DESCRIPTORS,
    MAX_AERON_STREAM_ID,
    MAX_DATA_STREAM_ID,
    Endpoints,
    channel_problem,
    check_endpoints,
    config_aeron_dir,
    default_aeron_dir,
    default_shm_base_dir,
)
from tensorpool.fsafety import unsafe_root_reason
from tensorpool.spark_source.policy_options import (
    POLICY_OPTIONS,
    PolicyOptions,
    parse_bool,
    parse_policy,
)
from tensorpool.transport.config import TransportConfig

if TYPE_CHECKING:
    from tensorpool.spark_source.flight_hosts import RemoteHosts

EARLIEST: Final = "earliest"
LATEST: Final = "latest"
EMBEDDED: Final = "embedded"
#: Largest data stream id (``streams``, ``stream``). Wire stream ids go up to
#: ``tensorpool.endpoints.MAX_DATA_STREAM_ID`` (2^32-2), but the schema's ``stream_id`` column is
#: a Spark ``int`` (int32), so the Spark source and sink accept the ids that column can hold.
MAX_STREAM_ID: Final = min(MAX_DATA_STREAM_ID, 2**31 - 1)
MAX_SEQ: Final = 2**63 - 1
#: ``batching`` values: ``none`` = micro-batches of whatever arrived (admission control);
#: ``pulse`` = one closed pulse-aligned window per micro-batch
#: (tensorpool.spark_source.spark.pulse).
BATCHING_NONE: Final = "none"
BATCHING_PULSE: Final = "pulse"
#: Longest ``batchLengthS`` accepted: a window must fit in a ring several times over anyway.
MAX_BATCH_LENGTH_S: Final = 3600.0
#: ``earliestMarginMs`` default (#16.1): the longest planning-to-read delay measured for a batch
#: read's first action on a cold 2-core host (3.3 s: Spark starts its Python workers), with
#: headroom. See :mod:`tensorpool.spark_source.plan.margin`.
DEFAULT_EARLIEST_MARGIN_MS: Final = 5000
#: ``*OffsetsByTimestamp`` sentinels, Kafka's ListOffsets values (#16.4)
TIMESTAMP_LATEST: Final = -1
TIMESTAMP_EARLIEST: Final = -2
#: ``startingOffsetsByTimestampStrategy``: no frame at or after the time -> fail / start latest
TIMESTAMP_STRATEGY_ERROR: Final = "error"
TIMESTAMP_STRATEGY_LATEST: Final = "latest"
#: ``staleStreamTimeoutMs`` default: 10 announce-freshness windows of the default 3 s --
#: long enough for a producer restart, short enough that a dead query is noticed (#16.2).
DEFAULT_STALE_STREAM_TIMEOUT_MS: Final = 30_000
ON_STALE_FAIL: Final = "fail"
ON_STALE_WARN: Final = "warn"
#: ``maxTriggerDelay`` default, Kafka's (15 minutes).
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60 * 1000
_DURATION_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


class TensorPoolOptionError(ValueError):
    """An option of the ``tensorpool`` format is unknown or invalid (the message names it)."""


# --- option names (docs spelling) ---------------------------------------------------------------
_CONNECTION = (
    "aeronDir",
    "controlChannel",
    "controlStreamId",
    "descriptorChannel",
    "descriptorStreamId",
    "shmBaseDir",
    "allowedBaseDirs",
    "driver",
    "attachTimeoutMs",
)
SOURCE_OPTIONS: Final = (
    "streams",
    *_CONNECTION,
    "freshnessMs",
    "startingOffsets",
    "earliestMarginMs",
    "endingOffsets",
    "maxFramesPerTrigger",
    "maxBytesPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "includeTensorMetadata",
    "batching",
    "batchLengthS",
    "gatedStreams",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "includeStreamMetadata",
    "staleStreamTimeoutMs",
    "onStaleStream",
    "minFramesPerTrigger",
    "maxTriggerDelay",
    # streams on other hosts through `tensorpool serve` (#18; spark_source/rings/remote.py)
    "hosts",
    "flightToken",
    "flightTlsRootCerts",
    "preferLocalReads",
    "flightRetryMs",
    # #17: event time, admission, adaptive sizing
    *POLICY_OPTIONS,
)
SINK_OPTIONS: Final = (
    "stream",
    *_CONNECTION,
    "headerNslots",
    "maxFrameBytes",
    "instanceId",
    "announcePeriodMs",
    "publisherIdleTimeoutMs",
    "commitTimeoutMs",
    "sinkId",
    "checkpointLocation",  # Spark passes it to streaming sinks; it keys batchId idempotency
)
_CANONICAL: Final = {name.lower(): name for name in (*SOURCE_OPTIONS, *SINK_OPTIONS)}


def _fail(name: str, message: str) -> TensorPoolOptionError:
    return TensorPoolOptionError(f"{name}: {message}")


def _normalise(options: Mapping[str, str], allowed: tuple[str, ...], what: str) -> dict[str, str]:
    """Map user keys to canonical names; reject unknown keys (naming the closest valid set)."""
    allowed_lower = {n.lower(): n for n in allowed}
    out: dict[str, str] = {}
    for key, value in options.items():
        name = allowed_lower.get(str(key).lower())
        if name is None:
            # Spark lower-cases option keys before we see them; name it as received.
            if str(key).lower() in _CANONICAL:
                hint = f" (it is a {'sink' if what == 'source' else 'source'} option)"
            else:
                close = difflib.get_close_matches(str(key).lower(), list(allowed_lower), 1)
                hint = f" (did you mean {allowed_lower[close[0]]}?)" if close else ""
            raise _fail(
                str(key),
                f"unknown option for the tensorpool {what}{hint}; valid options: "
                + ", ".join(allowed),
            )
        out[name] = "" if value is None else str(value)
    return out


def _int(opts: dict[str, str], name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise _fail(name, f"must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise _fail(name, f"must be in {lo}..{hi}, got {value}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    value = parse_bool(raw)
    if value is None:
        raise _fail(name, f"must be true or false, got {raw!r}")
    return value


def _channel(opts: dict[str, str], name: str, default: str) -> str:
    raw = opts.get(name, default).strip()
    problem = channel_problem(raw)  # the one channel validator (tensorpool.endpoints, #14.1)
    if problem is not None:
        raise _fail(name, problem)
    return raw


def _abs_dir(name: str, raw: str, *, creates: bool = False) -> str:
    """An absolute, normalised directory; ``creates``: files are made there, so refuse
    system and shared roots (#13.1)."""
    path = raw.strip()
    if not os.path.isabs(path):
        raise _fail(name, f"must be an absolute path, got {raw!r}")
    if creates:
        reason = unsafe_root_reason(path)
        if reason is not None:
            raise _fail(name, f"refusing {reason}")
    return os.path.normpath(path)


def parse_stream_ids(name: str, raw: str) -> tuple[int, ...]:
    """``"1"`` or ``"1, 2,3"`` -> sorted unique ids (sorted: offsets need a stable key order)."""
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not p for p in parts):
        raise _fail(name, f"expected stream ids such as '1' or '1,2', got {raw!r}")
    ids: list[int] = []
    for p in parts:
        try:
            sid = int(p)
        except ValueError:
            raise _fail(name, f"stream id {p!r} is not an integer") from None
        if not 1 <= sid <= MAX_STREAM_ID:
            raise _fail(name, f"stream id {sid} must be in 1..{MAX_STREAM_ID}")
        ids.append(sid)
    if len(set(ids)) != len(ids):
        raise _fail(name, f"duplicate stream id in {raw!r}")
    return tuple(sorted(ids))


#: ``streams="*"``: every stream id the source can represent.
ALL_STREAMS: Final = "*"


def parse_stream_pattern(name: str, raw: str) -> tuple[int, int] | None:
    """``"*"`` or ``"lo-hi"`` -> the inclusive id range to discover; None for an id list.

    Like Kafka's ``subscribePattern``: the query reads every stream announced on the control
    channel whose id is in the range, including streams that appear while it runs.
    """
    text = raw.strip()
    if text == ALL_STREAMS:
        return (1, MAX_STREAM_ID)
    lo_s, dash, hi_s = text.partition("-")
    if not dash or "," in text or not lo_s.strip():  # ids ("-1" is a bad id, not a range)
        return None
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise _fail(
            name, f"expected '*', a range such as '1000-1999' or ids, got {raw!r}"
        ) from None
    for sid in (lo, hi):
        if not 1 <= sid <= MAX_STREAM_ID:
            raise _fail(name, f"stream id {sid} must be in 1..{MAX_STREAM_ID}")
    if lo > hi:
        raise _fail(name, f"range {raw!r} is empty (the first id must not exceed the last)")
    return (lo, hi)


# --- offsets specs ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a query starts or ends, per stream: ``"earliest"``, ``"latest"`` or (epoch, seq)."""

    default: str | None  # EARLIEST / LATEST for every stream, or None when given per stream
    per_stream: tuple[tuple[int, str | tuple[int, int]], ...] = ()

    def for_stream(self, stream_id: int) -> str | tuple[int, int]:
        for sid, spec in self.per_stream:
            if sid == stream_id:
                return spec
        assert self.default is not None
        return self.default


def _json_stream_key(
    name: str, key: str, streams: tuple[int, ...], pattern: tuple[int, int] | None
) -> int:
    """A per-stream JSON option's key: a stream id the query reads (or may discover)."""
    try:
        sid = int(key)
    except ValueError:
        raise _fail(name, f"key {key!r} is not a stream id") from None
    if pattern is not None:
        if not pattern[0] <= sid <= pattern[1]:
            raise _fail(name, f"stream {sid} is not in streams {pattern[0]}-{pattern[1]}")
    elif sid not in streams:
        raise _fail(name, f"stream {sid} is not in streams {list(streams)}")
    return sid


def parse_offset_spec(
    name: str,
    raw: str | None,
    default: str,
    streams: tuple[int, ...],
    pattern: tuple[int, int] | None = None,
) -> OffsetSpec:
    """``pattern`` (discovered streams): JSON may name any id in it; the rest use ``default``."""
    if raw is None:
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() in (EARLIEST, LATEST):
        return OffsetSpec(text.lower())
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        raise _fail(
            name,
            "must be 'earliest', 'latest' or JSON like "
            '{"1": {"epoch": 3, "seq": 100}}' + f", got {raw!r}",
        ) from None
    if not isinstance(doc, dict):
        raise _fail(name, "JSON must be an object keyed by stream id")
    entries: list[tuple[int, str | tuple[int, int]]] = []
    for key, value in doc.items():
        sid = _json_stream_key(name, key, streams, pattern)
        if isinstance(value, str) and value.lower() in (EARLIEST, LATEST):
            entries.append((sid, value.lower()))
            continue
        if not isinstance(value, dict):
            raise _fail(name, f"stream {sid}: expected {{'epoch': E, 'seq': S}}, got {value!r}")
        extra = set(value) - {"epoch", "seq", "lost"}
        if extra:
            raise _fail(name, f"stream {sid}: unknown field(s) {sorted(extra)}")
        epoch, seq = value.get("epoch"), value.get("seq")
        for what, v in (("epoch", epoch), ("seq", seq)):
            if type(v) is not int or not 0 <= v <= MAX_SEQ:
                raise _fail(name, f"stream {sid}: {what} must be an integer >= 0, got {v!r}")
        entries.append((sid, (epoch, seq)))  # type: ignore[arg-type]
    if pattern is not None:
        return OffsetSpec(default, tuple(sorted(entries)))
    missing = sorted(set(streams) - {sid for sid, _ in entries})
    if missing:
        raise _fail(name, f"no offset for stream(s) {missing}; give every stream in 'streams'")
    return OffsetSpec(None, tuple(sorted(entries)))


def parse_timestamps(
    name: str,
    raw: str | None,
    streams: tuple[int, ...],
    pattern: tuple[int, int] | None = None,
    *,
    end: bool = False,
) -> tuple[tuple[int, int], ...]:
    """``{"1": 1700000000000, "2": -1}`` -> sorted ``(stream, ms)`` (#16.4).

    Milliseconds since the Unix epoch, or Kafka's sentinels ``-1`` (latest) and ``-2``
    (earliest; not an end). Streams left out start/end as ``startingOffsets`` /
    ``endingOffsets`` say (Kafka: the timestamp option takes precedence where it is given).
    """
    if raw is None:
        return ()
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not doc:
        raise _fail(
            name,
            'must be JSON like {"1": 1700000000000, "2": -1} (stream id -> ms since the epoch, '
            f"-1 latest, -2 earliest), got {raw!r}",
        )
    out: list[tuple[int, int]] = []
    for key, value in doc.items():
        sid = _json_stream_key(name, key, streams, pattern)
        lowest = TIMESTAMP_LATEST if end else TIMESTAMP_EARLIEST
        if type(value) is not int or not lowest <= value <= MAX_SEQ // 1_000_000:
            what = "-1 (latest)" if end else "-1 (latest), -2 (earliest)"
            raise _fail(
                name, f"stream {sid}: expected ms since the epoch >= 0 or {what}, got {value!r}"
            )
        out.append((sid, value))
    return tuple(sorted(out))


# --- connection ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Connection(Endpoints):
    """How to reach the producer's control plane and which SHM paths may be mapped.

    The endpoints (and their defaults) are the deployment's
    :class:`~tensorpool.endpoints.Endpoints` (#14.1); the options set control and descriptor,
    QoS and metadata follow the control channel.
    """

    aeron_dir: str | None = field(default_factory=default_aeron_dir)
    """None = embedded media driver; "" (or a blank ``aeronDir``) = the tensorpool default
    directory, as in every config (:func:`~tensorpool.endpoints.config_aeron_dir`)."""
    shm_base_dir: str = field(default_factory=default_shm_base_dir)
    allowed_base_dirs: tuple[str, ...] = ()
    driver: bool = False
    attach_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        check_endpoints(self)

    def client_settings(
        self, *, freshness_ms: int = 3000, announce_period_ms: int = 1000
    ) -> ClientSettings:
        """ClientSettings for the attachment; freshness = periods x announce period."""
        period = max(1, min(announce_period_ms, freshness_ms))
        return ClientSettings(
            transport=TransportConfig(
                aeron_dir=None if self.aeron_dir is None else config_aeron_dir(self.aeron_dir)
            ),
            channels=self.endpoints,
            shm_base_dir=self.shm_base_dir,
            allowed_base_dirs=self.allowed_base_dirs,
            announce_period_ns=period * 1_000_000,
            freshness_periods=max(1, -(-freshness_ms // period)),
        )

    @property
    def base_dirs(self) -> tuple[str, ...]:
        return self.allowed_base_dirs or (self.shm_base_dir,)


def _connection(opts: dict[str, str]) -> Connection:
    raw_dir = opts.get("aeronDir")
    if raw_dir is None or not raw_dir.strip():
        aeron_dir: str | None = config_aeron_dir("")  # where the tensorpool commands look
    elif raw_dir.strip().lower() == EMBEDDED:
        aeron_dir = None
    else:
        reason = aeron_dir_problem(raw_dir.strip())  # #26.5: the one aeron_dir check
        if reason is not None:
            raise _fail("aeronDir", f"refusing {reason}")
        aeron_dir = os.path.normpath(raw_dir.strip())
    shm = _abs_dir("shmBaseDir", opts["shmBaseDir"], creates=True) if "shmBaseDir" in opts else None
    allowed: tuple[str, ...] = ()
    if opts.get("allowedBaseDirs", "").strip():
        allowed = tuple(
            _abs_dir("allowedBaseDirs", p) for p in opts["allowedBaseDirs"].split(",") if p.strip()
        )
    kw: dict[str, object] = {}
    if shm is not None:
        kw["shm_base_dir"] = shm
    for sid_name, attr in (
        ("controlStreamId", "control_stream_id"),
        ("descriptorStreamId", "descriptor_stream_id"),
    ):
        value = _int(opts, sid_name, None, 1, MAX_AERON_STREAM_ID)
        if value is not None:
            kw[attr] = value
    control_channel = _channel(opts, "controlChannel", IPC_CONTROL)
    conn = Connection(
        aeron_dir=aeron_dir,
        control_channel=control_channel,
        qos_channel=control_channel,
        metadata_channel=control_channel,
        descriptor_channel=_channel(opts, "descriptorChannel", IPC_DESCRIPTORS),
        allowed_base_dirs=allowed,
        driver=_bool(opts, "driver", False),
        attach_timeout_ms=_int(opts, "attachTimeoutMs", 10_000, 1, 3_600_000),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )
    if (conn.control_channel, conn.control_stream_id) == (
        conn.descriptor_channel,
        conn.descriptor_stream_id,
    ):
        raise _fail("descriptorStreamId", "must differ from controlStreamId on the same channel")
    return conn


# --- source -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SourceOptions:
    streams: tuple[int, ...]
    connection: Connection
    freshness_ms: int
    starting: OffsetSpec
    ending: OffsetSpec
    max_frames_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_tensor_metadata: bool
    batching: str = BATCHING_NONE
    batch_length_ns: int = 1_000_000_000
    gated_streams: tuple[int, ...] = ()  # with batching=pulse: never empty (default: all)
    #: ``*OffsetsByTimestamp`` (#16.4): (stream, ms since the epoch or -1/-2), sorted
    starting_by_timestamp: tuple[tuple[int, int], ...] = ()
    ending_by_timestamp: tuple[tuple[int, int], ...] = ()
    timestamp_strategy: str = TIMESTAMP_STRATEGY_ERROR
    #: ``includeStreamMetadata`` (#16.4): the ``metadata map<string,string>`` column
    include_stream_metadata: bool = False
    #: health (#16.2): fail (or warn) when a stream has no live producer for this long; 0 = never
    stale_stream_timeout_ms: int = DEFAULT_STALE_STREAM_TIMEOUT_MS
    on_stale_stream: str = ON_STALE_FAIL
    #: admission control (#16.4): hold a trigger until this many frames, at most max_trigger_delay
    min_frames_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    #: ``streams="*"`` / ``"lo-hi"``: inclusive id range discovered from announces (then
    #: ``streams`` starts empty and the reader grows it); None: ``streams`` is the fixed list.
    stream_pattern: tuple[int, int] | None = None
    #: ``startingOffsets=earliest`` on a live ring skips the frames the producer overwrites
    #: within this many ms (#16.1, :mod:`~tensorpool.spark_source.plan.margin`); 0 = the oldest
    #: frame
    earliest_margin_ms: int = DEFAULT_EARLIEST_MARGIN_MS
    #: ``hosts`` (#18): the streams are read through ``tensorpool serve`` on those hosts
    remote: RemoteHosts | None = None
    #: #17: event time, admission and adaptive sizing (None: none of those options given)
    policy: PolicyOptions | None = None


def _batching(
    opts: dict[str, str], streams: tuple[int, ...], streaming: bool | None
) -> tuple[str, int, tuple[int, ...]]:
    """``batching`` / ``batchLengthS`` / ``gatedStreams``: pulse-aligned micro-batches."""
    mode = opts.get("batching", BATCHING_NONE).strip().lower()
    if mode not in (BATCHING_NONE, BATCHING_PULSE):
        raise _fail(
            "batching",
            f"must be {BATCHING_NONE!r} or {BATCHING_PULSE!r}, got {opts['batching']!r}",
        )
    if mode == BATCHING_NONE:
        for name in ("batchLengthS", "gatedStreams"):
            if name in opts:
                raise _fail(name, "only applies with batching=pulse")
        return mode, 1_000_000_000, ()
    if streaming is False:
        raise _fail(
            "batching",
            "'pulse' is for streaming queries (spark.readStream) only: a batch read has no "
            "micro-batches to align",
        )
    for name in ("maxFramesPerTrigger", "maxBytesPerTrigger", "minPartitions"):
        if name in opts:
            raise _fail(
                name,
                "cannot be combined with batching=pulse: a micro-batch is exactly one window "
                "(one partition per stream)",
            )
    raw = opts.get("batchLengthS", "1.0")
    try:
        seconds = float(raw.strip())
    except ValueError:
        raise _fail("batchLengthS", f"must be a number of seconds, got {raw!r}") from None
    if not 0 < seconds <= MAX_BATCH_LENGTH_S:  # also rejects nan
        raise _fail("batchLengthS", f"must be in (0, {MAX_BATCH_LENGTH_S:g}] seconds, got {raw!r}")
    length_ns = round(seconds * 1e9)
    if length_ns < 1_000_000:
        raise _fail("batchLengthS", f"must be at least 0.001 s, got {raw!r}")
    gated = streams
    if "gatedStreams" in opts:
        gated = parse_stream_ids("gatedStreams", opts["gatedStreams"])
        extra = sorted(set(gated) - set(streams))
        if extra:
            raise _fail("gatedStreams", f"stream(s) {extra} are not in streams {list(streams)}")
    return mode, length_ns, gated


def _duration_ms(opts: dict[str, str], name: str, default: int) -> int:
    """Kafka's duration syntax: ``"500"`` (ms), ``"500ms"``, ``"10s"``, ``"15m"``, ``"1h"``."""
    raw = opts.get(name)
    if raw is None:
        return default
    text = raw.strip().lower()
    num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(num) :].strip() or "ms"
    try:
        value = int(num.strip())
    except ValueError:
        value = -1
    if unit not in _DURATION_UNITS or value < 0:
        raise _fail(name, f"must be a duration such as '500ms', '10s' or '15m', got {raw!r}")
    ms = value * _DURATION_UNITS[unit]
    if ms > 2**31:
        raise _fail(name, f"must be at most {2**31} ms, got {raw!r}")
    return ms


def _health_and_min(
    opts: dict[str, str], streaming: bool | None
) -> tuple[int, str, int | None, int]:
    """``staleStreamTimeoutMs`` / ``onStaleStream`` / ``minFramesPerTrigger`` /
    ``maxTriggerDelay``: micro-batch options (#16.2, #16.4)."""
    stale = _int(opts, "staleStreamTimeoutMs", DEFAULT_STALE_STREAM_TIMEOUT_MS, 0, 2**31)
    on_stale = opts.get("onStaleStream", ON_STALE_FAIL).strip().lower()
    if on_stale not in (ON_STALE_FAIL, ON_STALE_WARN):
        raise _fail(
            "onStaleStream",
            f"must be {ON_STALE_FAIL!r} or {ON_STALE_WARN!r}, got {opts['onStaleStream']!r}",
        )
    min_frames = _int(opts, "minFramesPerTrigger", None, 1, MAX_SEQ)
    delay = _duration_ms(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS)
    if "maxTriggerDelay" in opts and min_frames is None:
        raise _fail("maxTriggerDelay", "only applies with minFramesPerTrigger")
    if streaming is False:
        for name in ("staleStreamTimeoutMs", "onStaleStream", "minFramesPerTrigger"):
            if name in opts:
                raise _fail(name, "is for streaming queries (spark.readStream) only")
    if min_frames is not None and opts.get("batching", "").strip().lower() == BATCHING_PULSE:
        raise _fail(
            "minFramesPerTrigger",
            "cannot be combined with batching=pulse: a micro-batch is exactly one window",
        )
    max_frames = _int(opts, "maxFramesPerTrigger", None, 1, MAX_SEQ)
    if min_frames is not None and max_frames is not None and min_frames > max_frames:
        raise _fail(
            "minFramesPerTrigger",
            f"{min_frames} exceeds maxFramesPerTrigger {max_frames}: no batch could hold it",
        )
    return stale, on_stale, min_frames, delay  # type: ignore[return-value]


def parse_source_options(
    options: Mapping[str, str], *, streaming: bool | None = None
) -> SourceOptions:
    """Validate reader options. ``streaming`` None = not yet known (``schema()`` time)."""
    opts = _normalise(options, SOURCE_OPTIONS, "source")
    if "streams" not in opts:
        raise _fail("streams", "required: the stream id(s) to read, e.g. option('streams', '1,2')")
    remote = _remote(opts)  # hosts (#18): streams="camA/1,camB/2"
    if remote is not None:
        pattern, streams = None, tuple(sid for sid, _ in remote.stream_host)
    else:
        pattern = parse_stream_pattern("streams", opts["streams"])
        streams = () if pattern is not None else parse_stream_ids("streams", opts["streams"])
    if pattern is not None and opts.get("batching", "").strip().lower() == BATCHING_PULSE:
        raise _fail("streams", "'*' and ranges cannot be combined with batching=pulse; list ids")
    default_start = LATEST if streaming else EARLIEST
    starting = parse_offset_spec(
        "startingOffsets", opts.get("startingOffsets"), default_start, streams, pattern
    )
    ending = parse_offset_spec("endingOffsets", opts.get("endingOffsets"), LATEST, streams, pattern)
    if streaming and "endingOffsets" in opts:
        raise _fail("endingOffsets", "is for batch queries (spark.read) only")
    if ending.default == EARLIEST or any(s == EARLIEST for _, s in ending.per_stream):
        raise _fail("endingOffsets", "'earliest' makes no sense as an end; use 'latest' or JSON")
    batching, batch_length_ns, gated = _batching(opts, streams, streaming)
    stale_ms, on_stale, min_frames, delay_ms = _health_and_min(opts, streaming)
    by_ts = _by_timestamp(opts, streams, pattern, streaming, batching)
    policy = parse_policy(opts, streaming, batching == BATCHING_PULSE, _fail)
    return SourceOptions(
        streams=streams,
        connection=_connection(opts),
        freshness_ms=_int(opts, "freshnessMs", 3000, 10, 3_600_000),  # type: ignore[arg-type]
        starting=starting,
        ending=ending,
        max_frames_per_trigger=_int(opts, "maxFramesPerTrigger", None, 1, MAX_SEQ),
        max_bytes_per_trigger=None
        if policy is not None and policy.auto_bytes
        else _int(opts, "maxBytesPerTrigger", None, 1, MAX_SEQ),
        min_partitions=_int(opts, "minPartitions", None, 1, 100_000),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_tensor_metadata=_bool(opts, "includeTensorMetadata", True),
        batching=batching,
        batch_length_ns=batch_length_ns,
        gated_streams=gated,
        stale_stream_timeout_ms=stale_ms,
        on_stale_stream=on_stale,
        min_frames_per_trigger=min_frames,
        max_trigger_delay_ms=delay_ms,
        stream_pattern=pattern,
        starting_by_timestamp=by_ts[0],
        ending_by_timestamp=by_ts[1],
        timestamp_strategy=by_ts[2],
        include_stream_metadata=by_ts[3],
        earliest_margin_ms=_int(  # type: ignore[arg-type]
            opts, "earliestMarginMs", DEFAULT_EARLIEST_MARGIN_MS, 0, 3_600_000
        ),
        remote=remote,
        policy=policy,
    )


#: options that need the SHM or Aeron of the Spark driver's host: refused with ``hosts`` (#18)
_LOCAL_ONLY: Final = (
    "batching",
    "includeStreamMetadata",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "driver",
)


def _remote(opts: dict[str, str]) -> RemoteHosts | None:
    """``hosts`` / ``flightToken`` / ``flightTlsRootCerts`` / ``preferLocalReads`` (#18)."""
    from tensorpool.spark_source.flight_hosts import FlightAccess, RemoteHosts, parse_hosts

    if "hosts" not in opts:
        for name in ("flightToken", "flightTlsRootCerts", "preferLocalReads", "flightRetryMs"):
            if name in opts:
                raise _fail(name, "only applies with 'hosts' (streams served by tensorpool serve)")
        return None
    for name in _LOCAL_ONLY:
        if name in opts and not (name == "batching" and opts[name].strip().lower() == "none"):
            raise _fail(name, "is not available with 'hosts' (remote streams) yet")
    try:
        hosts, stream_host = parse_hosts(opts["hosts"], opts["streams"])
    except ValueError as exc:
        name, _, message = str(exc).partition(": ")
        raise _fail(name, message) from None
    certs = None
    if "flightTlsRootCerts" in opts:
        path = opts["flightTlsRootCerts"]
        try:
            with open(path, "rb") as f:
                certs = f.read()
        except OSError as exc:
            raise _fail("flightTlsRootCerts", f"cannot read {path}: {exc.strerror}") from None
    token = opts.get("flightToken") or os.environ.get("TENSORPOOL_SERVE_TOKEN") or None
    return RemoteHosts(
        hosts,
        stream_host,
        FlightAccess(
            token=token,
            tls_root_certs=certs,
            retry_s=_int(opts, "flightRetryMs", 15_000, 0, 3_600_000) / 1000,  # type: ignore[operator]
        ),
        _bool(opts, "preferLocalReads", True),
    )


def _by_timestamp(
    opts: dict[str, str],
    streams: tuple[int, ...],
    pattern: tuple[int, int] | None,
    streaming: bool | None,
    batching: str,
) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], str, bool]:
    """``*OffsetsByTimestamp``, its strategy and ``includeStreamMetadata`` (#16.4)."""
    start_name, end_name = "startingOffsetsByTimestamp", "endingOffsetsByTimestamp"
    start = parse_timestamps(start_name, opts.get(start_name), streams, pattern)
    end = parse_timestamps(end_name, opts.get(end_name), streams, pattern, end=True)
    strategy_name = "startingOffsetsByTimestampStrategy"
    strategy = opts.get(strategy_name, TIMESTAMP_STRATEGY_ERROR).strip().lower()
    if strategy not in (TIMESTAMP_STRATEGY_ERROR, TIMESTAMP_STRATEGY_LATEST):
        raise _fail(
            strategy_name,
            f"must be {TIMESTAMP_STRATEGY_ERROR!r} or {TIMESTAMP_STRATEGY_LATEST!r}, "
            f"got {opts[strategy_name]!r}",
        )
    if strategy_name in opts and start_name not in opts:
        raise _fail(strategy_name, f"only applies with {start_name}")
    if streaming and end_name in opts:
        raise _fail(end_name, "is for batch queries (spark.read) only")
    include_meta = _bool(opts, "includeStreamMetadata", False)
    if batching == BATCHING_PULSE:  # the pulse reader has its own start and schema
        for name, given in ((start_name, bool(start)), ("includeStreamMetadata", include_meta)):
            if given:
                raise _fail(name, "cannot be combined with batching=pulse")
    return start, end, strategy, include_meta


# --- sink ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SinkOptions:
    stream: int
    connection: Connection
    header_nslots: int
    max_frame_bytes: int
    instance_id: str
    announce_period_ms: int
    publisher_idle_timeout_ms: int
    commit_timeout_ms: int
    sink_id: str | None  # batchId idempotency key; None = not idempotent


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _normalise(options, SINK_OPTIONS, "sink")
    if "stream" not in opts:
        raise _fail("stream", "required: the stream id to publish on, e.g. option('stream', '7')")
    ids = parse_stream_ids("stream", opts["stream"])
    if len(ids) != 1:
        raise _fail("stream", f"exactly one stream id, got {opts['stream']!r}")
    stream = ids[0]
    nslots = _int(opts, "headerNslots", 1024, 1, 1 << 24)
    assert nslots is not None
    if nslots & (nslots - 1):
        raise _fail("headerNslots", f"must be a power of two, got {nslots}")
    max_bytes = _int(opts, "maxFrameBytes", 1 << 20, 1, 1 << 31)
    instance = opts.get("instanceId", f"spark-sink-{stream}").strip()
    if not instance or "/" in instance or instance in (".", ".."):
        raise _fail("instanceId", f"must be a single path component, got {instance!r}")
    sink_id = opts.get("sinkId") or opts.get("checkpointLocation") or None
    return SinkOptions(
        stream=stream,
        connection=_connection(opts),
        header_nslots=nslots,
        max_frame_bytes=max_bytes,  # type: ignore[arg-type]
        instance_id=instance,
        announce_period_ms=_int(opts, "announcePeriodMs", 1000, 10, 60_000),  # type: ignore[arg-type]
        publisher_idle_timeout_ms=_int(opts, "publisherIdleTimeoutMs", 600_000, 0, 2**31),  # type: ignore[arg-type]
        commit_timeout_ms=_int(opts, "commitTimeoutMs", 60_000, 1, 3_600_000),  # type: ignore[arg-type]
        sink_id=sink_id,
    )


__all__ = [
    "ALL_STREAMS",
    "BATCHING_NONE",
    "BATCHING_PULSE",
    "EARLIEST",
    "EMBEDDED",
    "LATEST",
    "SINK_OPTIONS",
    "SOURCE_OPTIONS",
    "Connection",
    "OffsetSpec",
    "SinkOptions",
    "SourceOptions",
    "TensorPoolOptionError",
    "parse_offset_spec",
    "parse_sink_options",
    "parse_source_options",
    "parse_stream_ids",
    "parse_stream_pattern",
    "parse_timestamps",
]
