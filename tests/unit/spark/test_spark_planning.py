"""Sans-IO parts of the Spark source: options, offsets, admission control, loss, conversion.

No SparkSession here (these run in milliseconds); the behaviour they pin down is exercised end
to end by the other modules of this directory.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pytest

from tensorpool.spark_source.convert import column_to_numpy, stack, to_numpy
from tensorpool.spark_source.options import (
    TensorPoolOptionError,
    parse_sink_options,
    parse_source_options,
)
from tensorpool.spark_source.plan.offsets import (
    Limits,
    OffsetError,
    Range,
    RingState,
    StreamPos,
    batch_ranges,
    decode_offsets,
    encode_offsets,
    split_budget,
    split_ranges,
)
from tensorpool.spark_source.plan.planner import StreamPlanner


def test_offsets_json_has_a_stable_key_order():
    """issue 6 §4 offsets: streams by ascending id, fields epoch, seq, frames, lost, lostLate
    (Spark compares offset JSON as text and stores it verbatim in the checkpoint); an offset
    written before ``frames`` existed still decodes (frames unknown) and re-encodes verbatim."""
    doc = encode_offsets({12: StreamPos(3, 7), 2: StreamPos(1, 5, 2, 1, 40)})
    assert json.dumps(doc) == (
        '{"2": {"epoch": 1, "seq": 5, "frames": 40, "lost": 2, "lostLate": 1}, '
        '"12": {"epoch": 3, "seq": 7, "frames": 0, "lost": 0, "lostLate": 0}}'
    )
    assert decode_offsets(json.loads(json.dumps(doc))) == {
        2: StreamPos(1, 5, 2, 1, 40),
        12: StreamPos(3, 7),
    }
    old = {"2": {"epoch": 1, "seq": 5, "lost": 2, "lostLate": 1}}
    assert decode_offsets(old) == {2: StreamPos(1, 5, 2, 1, None)}
    assert encode_offsets(decode_offsets(old)) == old
    with pytest.raises(OffsetError, match="differ from the query's streams"):
        decode_offsets(doc, [2])
    with pytest.raises(OffsetError, match="seq must be an integer"):
        decode_offsets({"1": {"epoch": 1, "seq": -1}})


def test_split_budget_is_proportional_and_deterministic():
    assert split_budget(10, [5, 3]) == [5, 3]
    assert split_budget(10, [30, 10]) == [8, 2]
    assert split_budget(3, [1, 1, 1, 1]) == [1, 1, 1, 0]
    assert sum(split_budget(7, [100, 50, 25])) == 7


def test_split_ranges_honours_min_partitions():
    """issue 6 §4 partitions: each stream range is split so that there are at least
    minPartitions tasks."""
    ranges = [Range(1, 1, 0, 100), Range(2, 1, 10, 20)]
    assert split_ranges(ranges, None) == ranges
    pieces = split_ranges(ranges, 5)
    assert len(pieces) >= 5
    for sid in (1, 2):
        mine = [p for p in pieces if p.stream_id == sid]
        assert mine[0].first == next(r.first for r in ranges if r.stream_id == sid)
        assert all(a.end == b.first for a, b in itertools.pairwise(mine))
    assert split_ranges([Range(1, 1, 0, 2)], 8) == [Range(1, 1, 0, 1), Range(1, 1, 1, 2)]


def test_planner_admission_and_planned_loss():
    """issue 6 §4 admission control (ReadMaxRows / ReadMaxBytes) and loss known at planning time."""
    pl = StreamPlanner([1, 2])
    start = {1: StreamPos(5, 0), 2: StreamPos(7, 10)}
    states = {1: RingState(5, 0, 100, 128), 2: RingState(7, 40, 60, 16)}
    plan = pl.plan(start, states, Limits(max_frames=30))
    # stream 2 lost 10..39 (overwritten); 100 + 20 wanted, 30 admitted proportionally
    assert plan.end[2].lost == 30 and plan.losses[0].count == 30
    assert (plan.losses[0].first_seq, plan.losses[0].last_seq) == (10, 39)
    assert (plan.end[1].seq - 0) + (plan.end[2].seq - 40) == 30
    assert plan.end[1].frames + plan.end[2].frames == 30 == plan.frames
    ranges = batch_ranges(start, plan.end)
    assert [r.expect for r in ranges] == [plan.end[1].frames, plan.end[2].frames]
    # the planned frames: the lost prefix is not among them
    assert plan.runs[2].tolist() == [[40, plan.end[2].seq]]
    # bytes: 10-byte frames, budget 35 bytes -> 3 frames; a huge frame still makes progress
    plan = pl.plan(
        {1: StreamPos(5, 0)} | {2: StreamPos(7, 60)},
        states,
        Limits(max_bytes=35),
        lambda sid, e, seqs: [10] * len(seqs),
    )
    assert plan.frames == 3
    plan = pl.plan(
        {1: StreamPos(5, 0), 2: StreamPos(7, 60)},
        states,
        Limits(max_bytes=5),
        lambda sid, e, seqs: [10] * len(seqs),
    )
    assert plan.frames == 1


def test_planner_epoch_change_is_a_transition_batch():
    """issue 6 §4 epoch change: read to the end of the old epoch -> no loss; the next batch starts
    at the new epoch's oldest frame; unread frames of the old epoch are counted (or unknown)."""
    pl = StreamPlanner([1])
    pl.plan({1: StreamPos(3, 0)}, {1: RingState(3, 0, 50, 64)}, Limits())
    plan = pl.plan({1: StreamPos(3, 50)}, {1: RingState(4, 0, 20, 64)}, Limits())
    assert plan.end[1] == StreamPos(4, 0, 0, 0, 0) and not plan.losses
    assert batch_ranges({1: StreamPos(3, 50)}, plan.end) == []
    # old epoch not finished: 10 frames of epoch 4 were never read
    pl.plan({1: StreamPos(4, 0)}, {1: RingState(4, 0, 30, 64)}, Limits())
    plan = pl.plan({1: StreamPos(4, 20)}, {1: RingState(5, 0, 5, 64)}, Limits())
    assert plan.end[1] == StreamPos(5, 0, 10, 0) and plan.losses[0].count == 10
    # a fresh planner (restarted query) never saw epoch 5's head: unknown loss
    fresh = StreamPlanner([1])
    plan = fresh.plan({1: StreamPos(5, 2)}, {1: RingState(6, 0, 3, 64)}, Limits())
    assert plan.unknown_epoch_loss and plan.end[1].epoch == 6


def test_planner_stream_that_appears_later_starts_without_loss():
    """issue 6 §4: a stream not announced when the query started (placeholder epoch 0) begins
    where startingOffsets says once it appears; earlier frames are not data loss."""
    pl = StreamPlanner([1, 2], {1: "earliest", 2: "latest"})
    start = {1: StreamPos(0, 0), 2: StreamPos(0, 0)}
    states = {1: RingState(4, 3, 10, 64), 2: RingState(9, 0, 7, 64)}
    plan = pl.plan(start, states, Limits())
    assert plan.end == {1: StreamPos(4, 3), 2: StreamPos(9, 7)}
    assert not plan.losses and not plan.unknown_epoch_loss
    assert batch_ranges(start, plan.end) == []


def test_planner_available_now_target():
    """issue 6 §4 Trigger.AvailableNow: never plan past the heads seen when the trigger started."""
    pl = StreamPlanner([1])
    pl.set_target({1: RingState(2, 0, 10, 64)})
    plan = pl.plan({1: StreamPos(2, 0)}, {1: RingState(2, 0, 50, 64)}, Limits())
    assert plan.end[1].seq == 10


def test_source_options_validation():
    """issue 6 §1 options: types, ranges, stream lists, offsets JSON, mode-specific options."""
    o = parse_source_options(
        {"streams": "3,1", "maxframespertrigger": "10", "failondataloss": "false"}
    )
    assert o.streams == (1, 3) and o.max_frames_per_trigger == 10 and not o.fail_on_data_loss
    with pytest.raises(TensorPoolOptionError, match=r"^endingOffsets:"):
        parse_source_options({"streams": "1", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(TensorPoolOptionError, match="did you mean maxBytesPerTrigger"):
        parse_source_options({"streams": "1", "maxbytepertrigger": "1"})
    with pytest.raises(TensorPoolOptionError, match=r"^headerNslots:"):
        parse_sink_options({"stream": "1", "headerNslots": "100"})
    with pytest.raises(TensorPoolOptionError, match="sink option"):
        parse_source_options({"streams": "1", "maxFrameBytes": "1"})
    with pytest.raises(TensorPoolOptionError, match=r"^stream:"):
        parse_sink_options({"stream": "1,2"})


def test_convert_helpers_copy_at_most_once():
    """issue 6 §2 helper: rows and columns back to numpy; an Arrow column of equal frames is viewed
    without copying, a pandas column is joined once."""
    frames = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(4)]
    col = pa.array([f.tobytes() for f in frames], pa.binary())
    stacked = stack(col, "float32", (2, 3))
    assert np.shares_memory(stacked, np.frombuffer(col.buffers()[2], np.uint8))
    assert np.array_equal(stacked, np.stack(frames))
    assert np.array_equal(stack(col.slice(1, 2), "float32", [2, 3]), np.stack(frames[1:3]))
    views = column_to_numpy(col, "float32", (2, 3))
    assert all(np.array_equal(v, f) for v, f in zip(views, frames, strict=True))
    row = {"payload": frames[2].tobytes(), "dtype": "float32", "shape": [3, 2], "strides": [4, 12]}
    assert np.array_equal(to_numpy(row), frames[2].T)
    with pytest.raises(ValueError):
        to_numpy({"payload": b"\0" * 4, "dtype": "float32", "shape": [2]})
