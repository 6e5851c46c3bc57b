"""The parsed options: frozen dataclasses of plain values the rest of the package reads.

They pickle into every executor task unchanged. No code outside this package looks an option
up by name: it reads these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import (
    MAX_DATA_STREAM_ID,
    Endpoints,
    check_endpoints,
    config_aeron_dir,
    default_aeron_dir,
    default_shm_base_dir,
)
from tensorpool.spark_source.options.policy import PolicyOptions
from tensorpool.transport.config import TransportConfig

if TYPE_CHECKING:
    import pyarrow.flight as flight

EARLIEST: Final = "earliest"
LATEST: Final = "latest"
EMBEDDED: Final = "embedded"
#: ``streams="*"``: every stream id the source can represent.
ALL_STREAMS: Final = "*"
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
#: seconds a planning call (scan) may take before the driver gives up on a host (#18)
CALL_TIMEOUT_S: Final = 10.0
#: seconds a call retries a server that does not answer (restarting) before it fails
RETRY_S: Final = 15.0


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

    def names(self, spec: str) -> bool:
        """``spec`` (EARLIEST / LATEST) is where some stream starts or ends."""
        return self.default == spec or any(s == spec for _, s in self.per_stream)


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


@dataclass(frozen=True, slots=True)
class FlightAccess:
    """How to reach the servers: token and TLS roots (picklable: it travels in partitions)."""

    token: str | None = None
    tls_root_certs: bytes | None = None  # PEM; None = plain gRPC
    timeout_s: float = CALL_TIMEOUT_S
    #: how long a call keeps retrying an unavailable server (a restart) before it fails
    retry_s: float = RETRY_S

    def location(self, address: str) -> str:
        return f"grpc+tls://{address}" if self.tls_root_certs is not None else f"grpc://{address}"

    def call_options(self, timeout_s: float | None = None) -> flight.FlightCallOptions:
        import pyarrow.flight as flight

        headers = []
        if self.token is not None:
            headers.append((b"authorization", b"Bearer " + self.token.encode()))
        return flight.FlightCallOptions(headers=headers, timeout=timeout_s)


@dataclass(frozen=True, slots=True)
class RemoteHosts:
    """``hosts`` + ``streams="host/id,..."``: which server serves which stream."""

    hosts: tuple[tuple[str, str], ...]  # (name as written in 'streams', "host:port")
    stream_host: tuple[tuple[int, str], ...]  # (stream id, host name), sorted by stream id
    access: FlightAccess
    prefer_local_reads: bool = True

    def address_of(self, sid: int) -> str:
        name = dict(self.stream_host)[sid]
        return dict(self.hosts)[name]

    def by_address(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for sid, name in self.stream_host:
            out.setdefault(dict(self.hosts)[name], []).append(sid)
        return out


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
