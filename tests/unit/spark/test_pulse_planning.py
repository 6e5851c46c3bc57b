"""Sans-IO core of ``batching=pulse`` (issue 8 part 10): offsets, window -> runs, planning.

No SparkSession and no shared memory: rings are given as :class:`StreamScan` values (the
committed ``(seq, timestamp_ns)`` frames a driver-side scan would see), and Spark's loop is
played by hand: ``latestOffset`` = :meth:`PulsePlanner.advance`, the checkpoint = a JSON round
trip of the returned offset. The end-to-end behaviour is in
``tests/integration/spark/test_spark_pulse.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pytest

from tensorpool.batching import RateAwareMessageBatcher
from tensorpool.spark_source.options import TensorPoolOptionError, parse_source_options
from tensorpool.spark_source.plan.offsets import EPOCH_CHANGE, NOT_STARTED, OVERWRITTEN
from tensorpool.spark_source.plan.pulse import (
    PulseOffset,
    PulseOffsetError,
    PulsePlanner,
    StreamCursor,
    StreamScan,
    WindowRef,
    to_runs,
)
from tensorpool.spark_source.spark.pulse import pulse_schema_ddl

S = 1_000_000_000
T0 = 5_000 * S  # a monotonic-clock-like origin
DET, MON, LOG = 1, 2, 3  # 14 Hz gated, 5 Hz gated, ungated


def _train(hz: float, n: int, t0: int = T0) -> list[tuple[int, int]]:
    """(seq, ts) of a pulse train stamped like spark_roles.py's ``stamp`` command."""
    return [(seq, t0 + round(seq * S / hz)) for seq in range(n)]


def _scan(frames: list[tuple[int, int]], upto_ns: int, nslots: int = 1024, epoch: int = 1):
    """What a scan sees at time ``upto_ns``: committed frames, the newest ``nslots`` of them."""
    visible = [f for f in frames if f[1] <= upto_ns]
    return StreamScan.of(epoch, nslots, visible[-nslots:])


def _checkpoint(off: PulseOffset, streams: Iterable[int]) -> PulseOffset:
    """Spark stores the offset as JSON text and hands it back parsed."""
    return PulseOffset.from_json(json.loads(json.dumps(off.to_json())), list(streams))


def _run(
    planner: PulsePlanner,
    traffic: dict[int, list[tuple[int, int]]],
    start: PulseOffset,
    times_s: Iterable[float],
) -> tuple[list[PulseOffset], PulseOffset]:
    """Trigger at each time; run batches back to back until no window closes."""
    out: list[PulseOffset] = []
    for t in times_s:
        now = T0 + round(t * S)
        scans = {sid: _scan(frames, now) for sid, frames in traffic.items()}
        while True:
            adv = planner.advance(start, scans)
            if adv.offset is None:
                break
            start = _checkpoint(adv.offset, traffic)
            out.append(start)
    return out, start


def _frames_of(off: PulseOffset) -> dict[int, list[int]]:
    return {
        sid: [s for _, a, b in c.frames for s in range(a, b)]
        for sid, c in off.streams.items()
        if c.frames
    }


TRAFFIC = {DET: _train(14, 14 * 8), MON: _train(5, 5 * 8), LOG: _train(3, 3 * 8)}


def _planner() -> PulsePlanner:
    return PulsePlanner([DET, MON, LOG], [DET, MON], S)


def test_offset_json_has_a_stable_key_order_and_round_trips():
    """issue 8 p10 §2 offsets: ``window``, then streams by ascending id, then ``batcher``;
    each stream ``epoch, seq, lost, lostLate, frames`` (Spark compares offsets as text)."""
    off = PulseOffset(
        WindowRef(3, T0, T0 + S, "slot_gate", -7),
        {12: StreamCursor(2, 40, 1, 0, ((2, 30, 40),)), 2: StreamCursor(1, 9, 0, 2, ())},
        {"version": 1},
    )
    text = json.dumps(off.to_json())
    assert text == (
        '{"window": {"index": 3, "start_ns": 5000000000000, "end_ns": 5001000000000, '
        '"reason": "slot_gate", "wall_offset_ns": -7}, '
        '"2": {"epoch": 1, "seq": 9, "lost": 0, "lostLate": 2, "frames": []}, '
        '"12": {"epoch": 2, "seq": 40, "lost": 1, "lostLate": 0, "frames": [[2, 30, 40]]}, '
        '"batcher": {"version": 1}}'
    )
    assert PulseOffset.from_json(text, [2, 12]) == off
    assert PulseOffset.from_json(json.loads(text), [12, 2]).to_json() == off.to_json()


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"1": {"epoch": 1, "seq": 0, "lost": 0}}, "not written by a batching=pulse"),
        ({"window": None, "batcher": None, "2": {"epoch": 1, "seq": 0}}, "differ from the query"),
        ({"window": None, "batcher": None, "1": {"epoch": 1, "seq": -1}}, "seq must be"),
        ({"window": None, "batcher": None, "1": {"epoch": 1, "seq": 0, "frames": [[1, 5, 5]]}},
         "empty frame run"),
        ({"window": {"index": 0, "start_ns": 5, "end_ns": 5, "reason": "x"}, "batcher": None,
          "1": {"epoch": 1, "seq": 0}}, "start_ns < end_ns"),
        ({"window": None, "batcher": [], "1": {"epoch": 1, "seq": 0}}, "'batcher' must be"),
    ],
)  # fmt: skip
def test_offset_decoding_rejects_malformed_documents(doc, match):
    with pytest.raises(PulseOffsetError, match=match):
        PulseOffset.from_json(doc, [1])


def test_to_runs_groups_consecutive_seqs_per_epoch():
    """issue 8 p10 §2: a window's frames are recorded as runs ``[epoch, first, end)``."""
    assert to_runs([]) == ()
    assert to_runs([(1, 5), (1, 3), (1, 4)]) == ((1, 3, 6),)
    assert to_runs([(1, 3), (1, 5), (1, 6)]) == ((1, 3, 4), (1, 5, 7))  # a relay's seq gap
    assert to_runs([(2, 0), (1, 9), [2, 1], (1, 9)]) == ((1, 9, 10), (2, 0, 2))


def test_each_offset_is_one_window_and_every_frame_is_delivered_once():
    """issue 8 p10 §1: two gated streams (14 Hz, 5 Hz) and an ungated one; every offset the
    planner returns is one closed window with its frames; across windows every frame is
    delivered exactly once, windows strictly increase, and a gated stream's frames sit on the
    window's pulse slots (raw ts within 3/4 period before start .. 1/4 period after end)."""
    planner = _planner()
    start = planner.initial({sid: _scan(f, T0) for sid, f in TRAFFIC.items()}, lambda s: "earliest")
    assert start.window is None and start.batcher is None
    offsets, last = _run(planner, TRAFFIC, start, [0.3 * k for k in range(1, 28)])
    assert len(offsets) >= 6
    seen: dict[int, list[int]] = {sid: [] for sid in TRAFFIC}
    prev_end = None
    for off in offsets:
        w = off.window
        assert w is not None and w.end_ns - w.start_ns == S
        assert prev_end is None or w.start_ns >= prev_end
        prev_end = w.end_ns
        assert w.index == offsets.index(off)
        frames = _frames_of(off)
        assert frames, "a delivered window is never empty"
        for sid, seqs in frames.items():
            seen[sid] += seqs
            ts = dict(TRAFFIC[sid])
            for seq in seqs:
                if sid == DET:
                    assert w.start_ns - 3 * S // 56 <= ts[seq] < w.end_ns + S // 56
                elif sid == LOG:
                    assert ts[seq] < w.end_ns
    for sid, frames in TRAFFIC.items():
        assert seen[sid] == sorted(set(seen[sid])), f"stream {sid}: duplicate or out of order"
        # everything but what the batcher still holds (the last, incomplete window)
        assert set(seen[sid]) <= {s for s, _ in frames}
        assert len(seen[sid]) >= len(frames) - {DET: 15, MON: 6, LOG: 4}[sid]
    # the ungated stream rode along in the windows, it did not hold any open
    assert any(LOG in _frames_of(o) for o in offsets)
    assert any(o.window is not None and o.window.reason == "slot_gate" for o in offsets)
    assert last.streams[DET].seq == 14 * 8


def test_no_window_closed_means_no_new_offset():
    """issue 8 p10 §3: when no window closes ``advance`` returns None (the reader then returns
    ``start`` unchanged) and the next call feeds the same frames again from the same state."""
    planner = _planner()
    start = planner.initial({}, lambda s: "earliest")
    assert start.streams[DET] == StreamCursor(NOT_STARTED, 0)
    scans = {DET: _scan(TRAFFIC[DET], T0 + S // 2)}
    adv = planner.advance(start, scans)
    assert adv.offset is None and adv.fed == 8
    assert planner.advance(start, scans).fed == 8  # nothing of the call was remembered


def test_replay_and_restart_reproduce_the_same_windows():
    """issue 8 p10 §2 replay: the same start offset and rings give the same next offset (text
    equal), and a run that restarts from a checkpointed offset continues exactly like an
    uninterrupted one (the batcher state travels in the offset)."""
    times = [0.3 * k for k in range(1, 28)]
    planner = _planner()
    start = planner.initial({sid: _scan(f, T0) for sid, f in TRAFFIC.items()}, lambda s: "earliest")
    straight, _ = _run(planner, TRAFFIC, start, times)
    first, mid = _run(_planner(), TRAFFIC, start, times[:9])
    rest, _ = _run(_planner(), TRAFFIC, mid, times[9:])  # a new process, from the checkpoint
    assert [o.to_json() for o in first + rest] == [o.to_json() for o in straight]
    scans = {sid: _scan(f, T0 + 5 * S) for sid, f in TRAFFIC.items()}
    a = _planner().advance(mid, scans).offset
    b = _planner().advance(mid, scans).offset
    assert a is not None and json.dumps(a.to_json()) == json.dumps(b.to_json())


def test_windows_closed_together_are_delivered_one_per_offset_in_order():
    """issue 8 p10 §2: windows that closed at once wait in the batcher state's ``closed`` list
    and come out one per offset, oldest first, without feeding anything new."""
    b: RateAwareMessageBatcher[int, tuple[int, int]] = RateAwareMessageBatcher(S, gated=[DET])
    msgs = sorted((ts, DET, seq) for seq, ts in TRAFFIC[DET][:60])
    for ts, sid, seq in msgs:
        b.offer(sid, ts, (1, seq))
    b.settle()
    assert b.stats["batches_timeout"] + b.stats["batches_slot_gate"] >= 3
    state = b.snapshot()  # closed windows not taken: they are in the state
    n_closed = len(state["closed"])
    assert n_closed >= 3
    planner = PulsePlanner([DET], [DET], S)
    start = _checkpoint(PulseOffset(None, {DET: StreamCursor(1, 60)}, state), [DET])
    scans = {DET: _scan(TRAFFIC[DET], T0 + 100 * S)}  # more frames exist: must not be fed yet
    got = []
    for _ in range(n_closed):
        adv = planner.advance(start, scans)
        assert adv.offset is not None and adv.fed == 0
        start = _checkpoint(adv.offset, [DET])
        got.append(start)
    assert [o.window.index for o in got if o.window] == list(range(n_closed))
    assert [len(o.batcher["closed"]) for o in got if o.batcher] == list(range(n_closed - 1, -1, -1))
    seqs = [s for o in got for s in _frames_of(o)[DET]]
    assert seqs == sorted(set(seqs)) and all(o.streams[DET].seq == 60 for o in got)
    assert planner.advance(start, scans).fed > 0  # queue empty: feeding resumes at seq 60


def test_frames_overwritten_before_they_were_fed_are_planned_loss():
    """issue 8 p10 §4: a dense stream whose next seq to feed is below the ring's oldest frame
    lost the difference; the loss is reported (stream, epoch, first seq, count) and, when a
    window closes, counted in the offset's cumulative ``lost``. A new epoch restarts at seq 0
    (what its ring no longer holds is lost, and so is the never-fed rest of the old epoch); a
    stream absent at the start begins at its oldest frame without loss."""
    frames = _train(14, 14 * 6)
    planner = PulsePlanner([DET], [DET], S)
    start = PulseOffset(None, {DET: StreamCursor(1, 0, 5, 0)}, None)
    adv = planner.advance(start, {DET: _scan(frames, T0 + 6 * S, nslots=64)})
    assert [(ls.stream_id, ls.epoch, ls.first_seq, ls.count, ls.reason) for ls in adv.losses] == [
        (DET, 1, 0, 20, OVERWRITTEN)
    ]
    assert adv.offset is not None and adv.offset.streams[DET].lost == 25
    assert min(_frames_of(adv.offset)[DET]) >= 20
    new_ring = {DET: _scan(frames[3:], T0 + 6 * S, epoch=2)}
    # the unread rest of epoch 1 is lost with it: its size is the highest head seen of epoch 1,
    # unknown when this process never scanned epoch 1 (a restart)
    new_epoch = planner.advance(start, new_ring)
    assert [(ls.epoch, ls.first_seq, ls.count) for ls in new_epoch.losses] == [
        (1, 0, None),
        (2, 0, 3),
    ]
    new_epoch = planner.advance(start, new_ring, heads={(DET, 1): 84})
    assert [(ls.epoch, ls.first_seq, ls.count, ls.reason) for ls in new_epoch.losses] == [
        (1, 0, 84, EPOCH_CHANGE),
        (2, 0, 3, OVERWRITTEN),
    ]
    done = PulseOffset(None, {DET: StreamCursor(1, 84, 5, 0)}, None)  # epoch 1 fully fed
    new_epoch = planner.advance(done, new_ring, heads={(DET, 1): 84})
    assert [(ls.epoch, ls.count) for ls in new_epoch.losses] == [(2, 3)]
    late = PulseOffset(None, {DET: StreamCursor(NOT_STARTED, 0)}, None)
    joined = planner.advance(late, {DET: _scan(frames, T0 + 6 * S, nslots=64)})
    assert joined.losses == [] and joined.offset is not None
    assert min(_frames_of(joined.offset)[DET]) == 20


def test_read_time_losses_are_folded_into_lost_late():
    """issue 8 p10 §4: executor-reported losses since ``start`` land in the next offset."""
    planner = _planner()
    start = planner.initial({sid: _scan(f, T0) for sid, f in TRAFFIC.items()}, lambda s: "earliest")
    scans = {sid: _scan(f, T0 + 4 * S) for sid, f in TRAFFIC.items()}
    adv = planner.advance(start, scans, late={MON: 3}, wall_offset_ns=-123)
    assert adv.offset is not None and adv.offset.window is not None
    assert adv.offset.window.wall_offset_ns == -123  # sampled once, recorded for replays
    assert [adv.offset.streams[s].lost_late for s in (DET, MON, LOG)] == [0, 3, 0]


def test_available_now_target_caps_what_is_fed():
    """issue 8 p10 §6: with an AvailableNow target, frames at or past the target head are not
    fed, so the run ends with the windows that close on the frames that existed at its start."""
    planner = PulsePlanner([DET], [DET], S)
    start = PulseOffset(None, {DET: StreamCursor(1, 0)}, None)
    scans = {DET: _scan(TRAFFIC[DET], T0 + 8 * S)}
    target = {DET: (1, 30)}
    seqs: list[int] = []
    while (adv := planner.advance(start, scans, target=target)).offset is not None:
        start = _checkpoint(adv.offset, [DET])
        seqs += _frames_of(start)[DET]
    assert start.streams[DET].seq <= 30 and seqs and max(seqs) < 30
    assert planner.advance(start, scans, target={DET: (0, 99)}).fed == 0  # newer epoch: stop


def test_batch_length_change_across_a_restart_applies_from_the_next_window():
    planner = _planner()
    start = planner.initial({sid: _scan(f, T0) for sid, f in TRAFFIC.items()}, lambda s: "earliest")
    offsets, mid = _run(planner, TRAFFIC, start, [1.0, 2.0, 3.0])
    assert offsets and mid.batcher is not None
    longer = PulsePlanner([DET, MON, LOG], [DET, MON], 2 * S)
    adv = longer.advance(mid, {sid: _scan(f, T0 + 8 * S) for sid, f in TRAFFIC.items()})
    assert adv.offset is not None and adv.offset.window is not None
    assert adv.offset.window.end_ns - adv.offset.window.start_ns == S  # the active one keeps 1 s
    assert adv.offset.batcher is not None and adv.offset.batcher["batch_length_ns"] == 2 * S


def test_pulse_options_validation():
    """issue 8 p10 options: fail naming the option; pulse is streaming-only and excludes the
    per-trigger admission limits (a window is the unit)."""
    base = {"streams": "1,2"}
    o = parse_source_options({**base, "batching": "pulse"}, streaming=True)
    assert (o.batching, o.batch_length_ns, o.gated_streams) == ("pulse", S, (1, 2))
    o = parse_source_options(
        {**base, "batching": "PULSE", "batchlengths": "0.5", "gatedstreams": "2"}, streaming=True
    )
    assert (o.batch_length_ns, o.gated_streams) == (S // 2, (2,))
    assert parse_source_options(base).batching == "none"
    bad = [
        ({"batching": "bogus"}, True, "batching:"),
        ({"batching": "pulse", "batchLengthS": "0"}, True, "batchLengthS:"),
        ({"batching": "pulse", "batchLengthS": "nan"}, True, "batchLengthS:"),
        ({"batching": "pulse", "batchLengthS": "x"}, True, "batchLengthS:"),
        ({"batching": "pulse", "gatedStreams": "1,9"}, True, r"gatedStreams: stream\(s\) \[9\]"),
        ({"batching": "pulse", "maxFramesPerTrigger": "5"}, None, "maxFramesPerTrigger:"),
        ({"batching": "pulse", "maxBytesPerTrigger": "5"}, True, "maxBytesPerTrigger:"),
        ({"batching": "pulse", "minPartitions": "2"}, True, "minPartitions:"),
        ({"batching": "pulse"}, False, "batching: 'pulse' is for streaming"),
        ({"batchLengthS": "2"}, True, "batchLengthS: only applies with batching=pulse"),
    ]
    for extra, streaming, match in bad:
        with pytest.raises(TensorPoolOptionError, match=match):
            parse_source_options({**base, **extra}, streaming=streaming)
    assert pulse_schema_ddl(False).endswith(
        "payload binary, window_start timestamp, window_end timestamp, window_start_ns long, "
        "window_end_ns long"
    )
