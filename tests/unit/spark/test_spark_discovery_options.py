"""#16.4 stream discovery, sans-IO: the ``streams`` pattern option and offsets over a grown set.

End to end (real Spark, real producers): tests/integration/spark/test_spark_discovery.py.
"""

from __future__ import annotations

import json

import pytest

from tensorpool.spark_source.options import (
    MAX_STREAM_ID,
    TensorPoolOptionError,
    parse_source_options,
)
from tensorpool.spark_source.plan.offsets import (
    NOT_STARTED,
    Limits,
    RingState,
    StreamPos,
    batch_ranges,
    decode_offsets,
    encode_offsets,
    grow_offsets,
)
from tensorpool.spark_source.plan.planner import StreamPlanner


def test_streams_star_and_ranges_are_patterns():
    """#16.4 ``streams="*"`` discovers every id, ``"lo-hi"`` an inclusive range; an id list
    is still a fixed list."""
    star = parse_source_options({"streams": "*"}, streaming=True)
    assert star.stream_pattern == (1, MAX_STREAM_ID) and star.streams == ()
    rng = parse_source_options({"streams": " 1000-1999 "}, streaming=True)
    assert rng.stream_pattern == (1000, 1999) and rng.streams == ()
    one = parse_source_options({"streams": "7-7"}, streaming=False)
    assert one.stream_pattern == (7, 7)
    fixed = parse_source_options({"streams": "1,2"}, streaming=True)
    assert fixed.stream_pattern is None and fixed.streams == (1, 2)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("5-1", "streams: range '5-1' is empty"),
        ("a-b", "streams: expected '*', a range"),
        ("0-5", "streams: stream id 0 must be in"),
        ("1-2-3", "streams: expected '*', a range"),
        ("-1", "streams: stream id -1 must be in"),
        ("1-5,7", "streams: stream id '1-5' is not an integer"),
    ],
)
def test_bad_stream_patterns_name_the_option(raw: str, message: str):
    """#16.4 a malformed pattern fails load() with a one-line message naming ``streams``."""
    with pytest.raises(TensorPoolOptionError) as info:
        parse_source_options({"streams": raw}, streaming=True)
    assert str(info.value).startswith(message)


def test_offsets_json_of_a_pattern_names_streams_in_the_range():
    """#16.4 startingOffsets JSON with a pattern: any stream in the range (not all of them:
    the rest use the default), none outside it; pulse batching needs a fixed list."""
    start = json.dumps({"1005": {"epoch": 2, "seq": 9}})
    opts = parse_source_options({"streams": "1000-1999", "startingOffsets": start}, streaming=True)
    assert opts.starting.for_stream(1005) == (2, 9)
    assert opts.starting.for_stream(1006) == "latest"
    with pytest.raises(TensorPoolOptionError, match=r"^startingOffsets: stream 5 is not in"):
        parse_source_options(
            {"streams": "1000-1999", "startingOffsets": '{"5": "earliest"}'}, streaming=True
        )
    with pytest.raises(TensorPoolOptionError, match=r"^streams: .*batching=pulse"):
        parse_source_options({"streams": "*", "batching": "pulse"}, streaming=True)


def test_a_grown_stream_set_joins_from_the_earliest_frame():
    """#16.4 a start offset with fewer streams than the query (a stream discovered since, or a
    checkpoint of a smaller set): the new stream starts NOT_STARTED, its first plan moves it to
    its oldest frame (reading nothing of it, so nothing before is lost), the next reads from
    there; the old stream is planned as before."""
    planner = StreamPlanner([1], {1: "latest"})
    checkpoint = decode_offsets(json.loads(json.dumps(encode_offsets({1: StreamPos(4, 10)}))))
    planner.add_streams([2])
    start = grow_offsets(checkpoint, planner.streams)
    assert start == {1: StreamPos(4, 10), 2: StreamPos(NOT_STARTED, 0)}
    states = {1: RingState(4, 0, 15, 64), 2: RingState(7, 3, 18, 16)}
    plan = planner.plan(start, states, Limits())
    assert plan.end[1] == StreamPos(4, 15, frames=5)
    assert plan.end[2].epoch == 7 and plan.end[2].seq == 3
    assert plan.losses == [] and plan.unknown_epoch_loss == []
    assert [(r.stream_id, r.first, r.end) for r in batch_ranges(start, plan.end)] == [(1, 10, 15)]
    # the next trigger reads stream 2 from its earliest frame
    states = {1: RingState(4, 0, 15, 64), 2: RingState(7, 3, 19, 16)}
    nxt = planner.plan(plan.end, states, Limits())
    assert nxt.end[2] == StreamPos(7, 19, frames=16) and nxt.losses == []
    assert [(r.stream_id, r.first, r.end) for r in batch_ranges(plan.end, nxt.end)] == [(2, 3, 19)]
