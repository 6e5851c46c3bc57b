"""The rules between options: each a function of the given options that rejects a query
breaking it (naming the option and the rule). Rules a single row states -- types, bounds,
``requires``, ``excludes``, batch/streaming, local-only -- are in :mod:`.table`, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from tensorpool.spark_source.options import fields
from tensorpool.spark_source.options.errors import reject
from tensorpool.spark_source.options.parse import Given
from tensorpool.spark_source.options.policy import (
    AUTO,
)
from tensorpool.spark_source.options.table import Opt
from tensorpool.spark_source.options.values import (
    BATCHING_PULSE,
)


def _pulse(given: Given) -> bool:
    return given.get(Opt.batching) == BATCHING_PULSE


def pulse_is_streaming(given: Given) -> None:
    if _pulse(given) and given.streaming is False:
        reject(
            Opt.batching,
            "'pulse' is for streaming queries (spark.readStream) only: a batch read has no "
            "micro-batches to align",
        )


def pulse_lists_streams(given: Given) -> None:
    """A pulse window is gated by named streams: discovery cannot feed it."""
    if (
        _pulse(given)
        and Opt.hosts not in given
        and fields.parse_stream_pattern(Opt.streams.name, given.raw[Opt.streams]) is not None
    ):
        reject(Opt.streams, "'*' and ranges cannot be combined with batching=pulse; list ids")


def gated_streams_are_read(given: Given) -> None:
    if Opt.gatedStreams in given:
        streams = fields.parse_stream_ids(Opt.streams.name, given.raw[Opt.streams])
        extra = sorted(set(given.get(Opt.gatedStreams)) - set(streams))  # type: ignore[call-overload]
        if extra:
            reject(Opt.gatedStreams, f"stream(s) {extra} are not in streams {list(streams)}")


def stream_metadata_not_pulse(given: Given) -> None:
    """The pulse reader has its own schema."""
    if _pulse(given) and given.get(Opt.includeStreamMetadata):
        reject(Opt.includeStreamMetadata, "cannot be combined with batching=pulse")


def min_frames_fit(given: Given) -> None:
    lo, hi = given.get(Opt.minFramesPerTrigger), given.get(Opt.maxFramesPerTrigger)
    if lo is not None and hi is not None and lo > hi:  # type: ignore[operator]
        reject(
            Opt.minFramesPerTrigger,
            f"{lo} exceeds maxFramesPerTrigger {hi}: no batch could hold it",
        )


def auto_bytes_is_streaming(given: Given) -> None:
    if given.get(Opt.maxBytesPerTrigger) == AUTO and given.streaming is False:
        reject(Opt.maxBytesPerTrigger, "is for streaming queries (spark.readStream) only")


def target_sizes_itself(given: Given) -> None:
    fixed = given.get(Opt.maxBytesPerTrigger)
    if Opt.targetBatchLatencyMs in given and fixed is not None and fixed != AUTO:
        reject(
            Opt.targetBatchLatencyMs,
            "sizes batches itself (maxBytesPerTrigger=auto); drop the fixed maxBytesPerTrigger",
        )


def emergency_above_high_water(given: Given) -> None:
    high, emergency = given.get(Opt.memoryHighWater), given.get(Opt.memoryEmergency)
    if emergency <= high:  # type: ignore[operator]
        reject(Opt.memoryEmergency, f"must be above memoryHighWater ({high:g}), got {emergency:g}")


def descriptors_apart_from_control(given: Given) -> None:
    control = (given.get(Opt.controlChannel), given.get(Opt.controlStreamId))
    if control == (given.get(Opt.descriptorChannel), given.get(Opt.descriptorStreamId)):
        reject(Opt.descriptorStreamId, "must differ from controlStreamId on the same channel")


#: checked in this order, after every row's own checks
RULES: Final[tuple[Callable[[Given], None], ...]] = (
    pulse_lists_streams,
    pulse_is_streaming,
    gated_streams_are_read,
    min_frames_fit,
    stream_metadata_not_pulse,
    auto_bytes_is_streaming,
    target_sizes_itself,
    emergency_above_high_water,
    descriptors_apart_from_control,
)
