"""The parsed objects, built from the typed values :func:`.parse.read` checked."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from tensorpool.spark_source.options import fields
from tensorpool.spark_source.options.errors import reject
from tensorpool.spark_source.options.parse import Given, read
from tensorpool.spark_source.options.policy import (
    AUTO,
    PolicyOptions,
)
from tensorpool.spark_source.options.rules import RULES
from tensorpool.spark_source.options.table import POLICY, Opt
from tensorpool.spark_source.options.values import (
    BATCHING_PULSE,
    EARLIEST,
    LATEST,
    Connection,
    FlightAccess,
    RemoteHosts,
    SinkOptions,
    SourceOptions,
)


def _checked(options: Mapping[str, str], side: str, streaming: bool | None = None) -> Given:
    """The rows' checks, then the rules between options."""
    given = read(options, side, streaming)
    for rule in RULES:
        rule(given)
    return given


def parse_source_options(
    options: Mapping[str, str], *, streaming: bool | None = None
) -> SourceOptions:
    """Validate reader options. ``streaming`` None = not yet known (``schema()`` time)."""
    given = _checked(options, "source", streaming)
    g: Any = given.get  # typed by the table's rows
    remote = _remote(given)
    pattern = None
    if remote is not None:
        streams = tuple(sid for sid, _ in remote.stream_host)
    else:
        pattern = fields.parse_stream_pattern(Opt.streams.name, given.raw[Opt.streams])
        streams = (
            ()
            if pattern is not None
            else fields.parse_stream_ids(Opt.streams.name, given.raw[Opt.streams])
        )

    def offsets(opt: Opt, default: str) -> Any:
        return fields.parse_offset_spec(opt.name, given.raw.get(opt), default, streams, pattern)

    def times(opt: Opt, *, end: bool = False) -> Any:
        return fields.parse_timestamps(opt.name, given.raw.get(opt), streams, pattern, end=end)

    starting = offsets(Opt.startingOffsets, LATEST if streaming else EARLIEST)
    if streaming is False and starting.names(LATEST):
        reject(
            Opt.startingOffsets,
            "'latest' is not allowed for batch queries (the result would always be empty); "
            "use 'earliest' or JSON offsets",
        )
    ending = offsets(Opt.endingOffsets, g(Opt.endingOffsets))
    if ending.names(EARLIEST):
        reject(Opt.endingOffsets, "'earliest' makes no sense as an end; use 'latest' or JSON")
    policy = _policy(given)
    return SourceOptions(
        streams=streams,
        connection=_connection(given),
        freshness_ms=g(Opt.freshnessMs),
        starting=starting,
        ending=ending,
        max_frames_per_trigger=g(Opt.maxFramesPerTrigger),
        max_bytes_per_trigger=None
        if policy is not None and policy.auto_bytes
        else g(Opt.maxBytesPerTrigger),
        min_partitions=g(Opt.minPartitions),
        fail_on_data_loss=g(Opt.failOnDataLoss),
        include_tensor_metadata=g(Opt.includeTensorMetadata),
        batching=g(Opt.batching),
        batch_length_ns=round(g(Opt.batchLengthS) * 1e9),
        gated_streams=(g(Opt.gatedStreams) or streams) if g(Opt.batching) == BATCHING_PULSE else (),
        stale_stream_timeout_ms=g(Opt.staleStreamTimeoutMs),
        on_stale_stream=g(Opt.onStaleStream),
        min_frames_per_trigger=g(Opt.minFramesPerTrigger),
        max_trigger_delay_ms=g(Opt.maxTriggerDelay),
        stream_pattern=pattern,
        starting_by_timestamp=times(Opt.startingOffsetsByTimestamp),
        ending_by_timestamp=times(Opt.endingOffsetsByTimestamp, end=True),
        timestamp_strategy=g(Opt.startingOffsetsByTimestampStrategy),
        include_stream_metadata=g(Opt.includeStreamMetadata),
        earliest_margin_ms=g(Opt.earliestMarginMs),
        remote=remote,
        policy=policy,
    )


def _remote(given: Given) -> RemoteHosts | None:
    """``hosts`` and what reaches them (#18): ``streams="camA/1,camB/2"``."""
    if Opt.hosts not in given:
        return None
    hosts, stream_host = fields.parse_hosts(given.raw[Opt.hosts], given.raw[Opt.streams])
    token = given.get(Opt.flightToken) or os.environ.get("TENSORPOOL_SERVE_TOKEN") or None
    access = FlightAccess(
        token=token,  # type: ignore[arg-type]
        tls_root_certs=given.get(Opt.flightTlsRootCerts),  # type: ignore[arg-type]
        retry_s=given.get(Opt.flightRetryMs) / 1000,  # type: ignore[operator]
    )
    return RemoteHosts(hosts, stream_host, access, given.get(Opt.preferLocalReads))  # type: ignore[arg-type]


def _policy(given: Given) -> PolicyOptions | None:
    """The #17 policies; None when none of their options is given."""
    auto = given.get(Opt.maxBytesPerTrigger) == AUTO
    if not auto and not any(o.row.group == POLICY and o in given for o in Opt):
        return None
    g: Any = given.get
    fps = g(Opt.maxFramesPerSecond)
    burst = g(Opt.maxBurstFrames)
    return PolicyOptions(
        align=g(Opt.alignEventTime),
        skew_ms=g(Opt.maxEventTimeSkewMs),
        idle_ms=g(Opt.idleStreamTimeoutMs),
        late=g(Opt.lateFrames),
        allowed_lateness_ms=g(Opt.allowedLatenessMs),
        max_fps=fps,
        max_burst=max(1, math.ceil(fps or 1)) if burst is None else burst,
        max_lag_ms=g(Opt.maxLagMs),
        max_jitter_ms=g(Opt.maxJitterMs),
        auto_bytes=auto or Opt.targetBatchLatencyMs in given,
        target_ms=g(Opt.targetBatchLatencyMs),
        max_batch_memory=g(Opt.maxBatchMemory),
        high_water=g(Opt.memoryHighWater),
        emergency=g(Opt.memoryEmergency),
    )


def _connection(given: Given) -> Connection:
    g: Any = given.get
    kw: dict[str, Any] = {}
    if Opt.shmBaseDir in given:  # else the host's default (tmp where there is no /dev/shm)
        kw["shm_base_dir"] = g(Opt.shmBaseDir)
    control_channel = g(Opt.controlChannel)
    return Connection(
        aeron_dir=g(Opt.aeronDir) if Opt.aeronDir in given else fields.aeron_dir("", ""),
        control_channel=control_channel,
        control_stream_id=g(Opt.controlStreamId),
        qos_channel=control_channel,
        metadata_channel=control_channel,
        descriptor_channel=g(Opt.descriptorChannel),
        descriptor_stream_id=g(Opt.descriptorStreamId),
        allowed_base_dirs=g(Opt.allowedBaseDirs),
        driver=g(Opt.driver),
        attach_timeout_ms=g(Opt.attachTimeoutMs),
        **kw,
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    given = _checked(options, "sink")
    g: Any = given.get
    ids = g(Opt.stream)
    if len(ids) != 1:
        reject(Opt.stream, f"exactly one stream id, got {given.raw[Opt.stream]!r}")
    stream = ids[0]
    return SinkOptions(
        stream=stream,
        connection=_connection(given),
        header_nslots=g(Opt.headerNslots),
        max_frame_bytes=g(Opt.maxFrameBytes),
        instance_id=g(Opt.instanceId) or f"spark-sink-{stream}",
        announce_period_ms=g(Opt.announcePeriodMs),
        publisher_idle_timeout_ms=g(Opt.publisherIdleTimeoutMs),
        commit_timeout_ms=g(Opt.commitTimeoutMs),
        sink_id=g(Opt.sinkId) or g(Opt.checkpointLocation) or None,
    )
