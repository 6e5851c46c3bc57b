"""``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``: a wall-clock time -> a seq.

The times are milliseconds since the Unix epoch, the unit of Kafka's options, and they are
compared with the frames' *event time*: the producer's ``timestamp_ns`` from the slot header,
taken to wall-clock time exactly as the ``timestamp`` column does
(:func:`~tensorpool.spark_source.rings.mapped_rings.wall_clock_offset_ns`: a CLOCK_MONOTONIC
stamp is shifted by this host's CLOCK_REALTIME - CLOCK_MONOTONIC, a REALTIME_SYNCED stamp is taken
as is). So a time read off the ``timestamp`` column of one query selects the same frame in the
next.

Resolution follows Kafka's ``offsetsForTimes``: a time selects the *first frame whose event time
is >= the time* (the lowest such seq among the committed frames of the ring); ``-2`` means
earliest and ``-1`` latest (Kafka's ListOffsets sentinels, also used in Spark's
``startingOffsets`` JSON). A start older than every frame in the ring resolves to ``earliest``
(like Kafka after retention: frames before the ring's oldest are not counted as lost -- whether
there were any is unknowable). A start newer than every frame has no match: the query fails
(``startingOffsetsByTimestampStrategy=error``, Kafka's default) or starts at ``latest``
(``=latest``). An end with no match is ``latest`` (Kafka's rule for ``endingOffsetsByTimestamp``).

Sans-Spark: only numpy and the mapped ring, so it is unit-testable with a real ring file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tensorpool.spark_source.options import (
    EARLIEST,
    LATEST,
    TIMESTAMP_EARLIEST,
    TIMESTAMP_LATEST,
    TIMESTAMP_STRATEGY_LATEST,
    Opt,
    reject,
)

if TYPE_CHECKING:
    from tensorpool.spark_source.options import SourceOptions
    from tensorpool.spark_source.rings.mapped_rings import MappedStream, RegionSpec


def first_seq_at_or_after(m: MappedStream, wall_ms: int) -> tuple[int | None, int, int]:
    """``(seq, oldest, newest_wall_ms)``: the lowest committed seq whose event time is
    ``>= wall_ms`` (None: no such frame), the oldest committed seq, and the newest frame's
    event time in ms (-1 for an empty ring; both for messages)."""
    from tensorpool.spark_source.rings.mapped_rings import wall_clock_offset_ns

    scan = m.ring.scan()
    ok = scan.committed
    if not ok.any():
        return None, 0, -1
    seqs = scan.seq[ok]
    stamps = scan.fields["timestamp_ns"][ok].astype(np.int64)
    wall_ns = stamps + wall_clock_offset_ns(m.spec.clock_domain)
    hit = wall_ns >= wall_ms * 1_000_000
    newest_ms = int(wall_ns[int(np.argmax(seqs))] // 1_000_000)
    oldest = int(seqs.min())
    if not hit.any():
        return None, oldest, newest_ms
    return int(seqs[hit].min()), oldest, newest_ms


def resolve_start(
    m: MappedStream, stream_id: int, wall_ms: int, strategy: str
) -> str | tuple[int, int]:
    """Where a query starting at ``wall_ms`` begins on this stream: EARLIEST, LATEST or
    ``(epoch, seq)`` (the form ``startingOffsets`` takes)."""
    if wall_ms == TIMESTAMP_EARLIEST:
        return EARLIEST
    if wall_ms == TIMESTAMP_LATEST:
        return LATEST
    seq, oldest, newest_ms = first_seq_at_or_after(m, wall_ms)
    if seq is None:
        if strategy == TIMESTAMP_STRATEGY_LATEST:
            return LATEST
        held = "the ring is empty" if newest_ms < 0 else f"its newest frame is at {newest_ms} ms"
        reject(
            Opt.startingOffsetsByTimestamp,
            f"stream {stream_id} has no frame at or after {wall_ms} ms "
            f"({held}); give an earlier time, or set startingOffsetsByTimestampStrategy=latest "
            "to start at the next frame",
        )
    if seq <= oldest:
        return EARLIEST  # the time is at or before what the ring holds (see module doc)
    return (m.spec.epoch, seq)


def resolve_end(m: MappedStream, wall_ms: int) -> str | tuple[int, int]:
    """The exclusive end of a batch read ending at ``wall_ms``: frames before that time."""
    if wall_ms == TIMESTAMP_LATEST:
        return LATEST
    seq, _oldest, _newest = first_seq_at_or_after(m, wall_ms)
    return LATEST if seq is None else (m.spec.epoch, seq)


def _given(pairs: tuple[tuple[int, int], ...], sid: int) -> int | None:
    for s, ms in pairs:
        if s == sid:
            return ms
    return None


def starting_for(opts: SourceOptions, sid: int, region: RegionSpec | None) -> str | tuple[int, int]:
    """The start of ``sid``: its ``startingOffsetsByTimestamp`` resolved against the ring of
    ``region`` (the stream's mapped epoch), else ``startingOffsets``. A stream not mapped yet
    (``region`` None) starts as ``startingOffsets`` says when it appears."""
    from tensorpool.spark_source.rings import mapped_rings

    ms = _given(opts.starting_by_timestamp, sid)
    if ms is None or region is None:
        return opts.starting.for_stream(sid)
    m = mapped_rings.mapped(region, opts.connection.base_dirs)
    return resolve_start(m, sid, ms, opts.timestamp_strategy)


def ending_for(opts: SourceOptions, sid: int, region: RegionSpec) -> str | tuple[int, int]:
    """The (exclusive) end of ``sid`` in a batch read: ``endingOffsetsByTimestamp`` resolved,
    else ``endingOffsets``."""
    from tensorpool.spark_source.rings import mapped_rings

    ms = _given(opts.ending_by_timestamp, sid)
    if ms is None:
        return opts.ending.for_stream(sid)
    return resolve_end(mapped_rings.mapped(region, opts.connection.base_dirs), ms)


__all__ = [
    "ending_for",
    "first_seq_at_or_after",
    "resolve_end",
    "resolve_start",
    "starting_for",
]
