"""#17 rules of the Spark source's policies, sans-IO with a driven clock: the minimum rule and
idleness, late frames, lag / jitter / rate admission, adaptive sizing thresholds, and the
offsets that make every decision replayable."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensorpool.spark_source.options import (
    PolicyOptions,
    TensorPoolOptionError,
    parse_source_options,
)
from tensorpool.spark_source.plan.admission import JitterMeter, TokenBucket, lag_count
from tensorpool.spark_source.plan.eventtime import Aligner, running_max
from tensorpool.spark_source.plan.offsets import (
    Limits,
    RingState,
    StreamPos,
    batch_ranges,
    decode_offsets,
    encode_offsets,
)
from tensorpool.spark_source.plan.planner import StreamPlanner
from tensorpool.spark_source.plan.policy import SourcePolicy
from tensorpool.spark_source.plan.sizing import (
    EMERGENCY,
    HIGH,
    INITIAL_BYTES,
    BatchSizer,
    SizingConfig,
    shed_oldest,
)

MS = 1_000_000
S = 1_000_000_000


def ring(epoch: int, first: int, n: int, t0_ns: int, step_ns: int, nslots: int = 256, size=64):
    """A dense ring holding seqs [first, first+n) stamped t0 + seq*step."""
    slot_seq = np.full(nslots, -1, np.int64)
    stamps = np.zeros(nslots, np.int64)
    lens = np.zeros(nslots, np.int64)
    for s in range(first, first + n):
        slot_seq[s % nslots] = s
        stamps[s % nslots] = t0_ns + s * step_ns
        lens[s % nslots] = size
    return RingState.from_slots(epoch, slot_seq, slot_seq >= 0, lens, stamps)


# --- event time --------------------------------------------------------------------------------
def test_minimum_rule_bound_and_idle_stream_release():
    a = Aligner(skew_ns=100 * MS, idle_ns=1 * S)
    a.observe(1, head=10, now_ns=0)
    a.observe(2, head=3, now_ns=0)
    delivered = {1: 5 * S, 2: 2 * S}
    assert a.bound(delivered, 0) == 2 * S + 100 * MS  # slowest live stream + skew
    a.observe(1, head=20, now_ns=S)  # stream 2 silent since t=0
    assert a.idle(2, S) and a.live(S) == [1]
    assert a.bound({1: 6 * S, 2: 2 * S}, S) == 6 * S + 100 * MS  # the idle one holds nobody
    a.observe(2, head=4, now_ns=S + 1)
    assert a.bound({1: 6 * S, 2: 2 * S + 1}, S + 1) == 2 * S + 1 + 100 * MS  # back


def test_aligner_with_no_frame_yet_holds_then_releases_and_zero_sources():
    a = Aligner(skew_ns=0, idle_ns=1 * S)
    assert a.bound({}, 0) is None  # zero sources: nothing to hold
    a.observe(1, head=5, now_ns=0)
    a.observe(2, head=None, now_ns=0)  # not there yet
    assert a.bound({1: 3 * S}, 0) < 0  # its first frames may be older than anything: hold
    a.observe(1, head=6, now_ns=S)
    assert a.bound({1: 4 * S}, S) == 4 * S  # silent for the idle timeout: no longer


def test_global_watermark_is_min_of_live_and_never_decreases():
    a = Aligner(skew_ns=0, idle_ns=10 * S)
    for sid in (1, 2):
        a.observe(sid, head=1, now_ns=0)
    assert a.advance({1: 5 * S, 2: 3 * S}, 0) == 3 * S
    assert a.advance({1: 5 * S, 2: 2 * S}, 0) == 3 * S  # monotone


def test_running_max_carries_on_from_the_watermark():
    t = np.array([1, 5, 3, 6, 7], np.int64)
    assert running_max(t).tolist() == [1, 5, 5, 6, 7]
    assert running_max(t, 6).tolist() == [6, 6, 6, 6, 7]


# --- admission ---------------------------------------------------------------------------------
def test_lag_sheds_the_aged_prefix():
    t = np.array([0, 10, 20, 30], np.int64) * MS
    assert lag_count(t, now_ns=40 * MS, max_lag_ns=15 * MS) == 3  # ages 40, 30, 20 > 15
    assert lag_count(t, now_ns=40 * MS, max_lag_ns=None) == 0


def test_token_bucket_rate_burst_across_triggers():
    b = TokenBucket(rate=100.0, burst=10)
    b.tick(0)
    assert b.available() == 10  # starts full
    b.take(10)
    b.tick(50 * MS)
    assert b.available() == 5  # 100/s for 50 ms
    b.take(5)
    b.tick(10 * S)
    assert b.available() == 995  # #31.1: a slow trigger's interval is earned in full ...
    b.tick(10 * S + 50 * MS)
    assert b.available() == 15  # ... but unspent tokens are saved only up to the burst


def test_jitter_percentiles_and_no_double_count():
    m = JitterMeter()
    seqs = np.arange(100, dtype=np.int64)
    t = seqs * 10 * MS
    t[50] += 4 * MS  # one stutter: intervals 14 and 6 ms around it
    m.observe(seqs[:60], t[:60])
    m.observe(seqs, t)  # the first 60 again (deferred frames): not counted twice
    assert m.count == 99
    p50, p99 = m.percentiles()
    assert p50 == 0.0 and 3.0 < p99 <= 4.0


# --- adaptive sizing ---------------------------------------------------------------------------
def test_sizing_meets_latency_target_from_cost():
    z = BatchSizer(SizingConfig(target_ns=100 * MS, max_memory=1 << 30))
    assert z.budget() == INITIAL_BYTES  # nothing measured yet
    z.planned(1 << 20, 0)
    z.triggered(30 * MS)
    z.planned(3 << 20, S)
    z.triggered(S + 70 * MS)  # 10 ms overhead + 20 ms per MiB: 4.5 MiB meets 100 ms
    assert z.model() == pytest.approx((10 * MS, 20 * MS / (1 << 20)))
    assert z.budget() == pytest.approx(4.5 * (1 << 20), rel=1e-6)
    z.planned(4 << 20, 2 * S)
    z.triggered(2 * S + 410 * MS)  # step change: frames now cost far more per byte
    assert z.budget() < 2 << 20


def test_sizing_overhead_over_target_sizes_for_throughput():
    z = BatchSizer(SizingConfig(target_ns=100 * MS, max_memory=1 << 30))
    z.planned(1 << 20, 0)
    z.triggered(300 * MS)
    z.planned(2 << 20, S)
    z.triggered(S + 320 * MS)  # 280 ms fixed cost: over the target whatever the size
    assert z.budget() == 8 << 20  # no size meets it: grow (capped), do not shrink for ever


def test_sizing_never_below_the_batch_that_keeps_up():
    mb = 1_000_000
    z = BatchSizer(SizingConfig(target_ns=1000 * MS, max_memory=1 << 30))
    z.owed(0, 0)
    z.owed(4 * mb, S)  # the producers add 4 MB/s
    assert z.arrival_bps == pytest.approx(4 * mb)
    z.planned(1 * mb, S)
    z.triggered(S + 1000 * MS)
    z.planned(2 * mb, 3 * S)
    z.triggered(3 * S + 1050 * MS)  # 950 ms overhead + 50 ns/B: 1 MB meets the target ...
    # ... but falls behind: a batch must hold what arrives while it runs, b = a r / (1 - c r)
    assert z.budget() == pytest.approx(0.95 * 4 * mb / 0.8, rel=1e-3)


def test_sizing_growth_is_capped_by_the_largest_recent_batch():
    z = BatchSizer(SizingConfig(target_ns=S, max_memory=1 << 30))
    z.planned(1024, 0)
    z.triggered(1 * MS)  # a tiny batch says little about a large one
    assert z.budget() == 4 * 1024


def test_sizing_high_water_shrinks():
    z = BatchSizer(SizingConfig(target_ns=S, max_memory=10 << 20, high_water=0.8))
    z.planned(8 << 20, 0)
    z.triggered(1 * MS)  # very cheap: the latency rule would ask for far more
    assert z.budget() == int((10 << 20) * 0.8)
    assert z.pressure == HIGH and z.high_water == 1


def test_sizing_emergency_sheds_oldest_to_high_water():
    z = BatchSizer(SizingConfig(target_ns=S, max_memory=1000, high_water=0.8, emergency=0.95))
    assert z.emergency_keep(950) is None
    assert z.emergency_keep(951) == 800 and z.pressure == EMERGENCY
    lens = [np.full(10, 60, np.int64), np.full(10, 40, np.int64)]  # owed 1000
    shed = shed_oldest(lens, 800)
    kept = [int(x[k:].sum()) for x, k in zip(lens, shed, strict=True)]
    assert sum(kept) <= 800 and shed[0] > 0 and shed[1] > 0


# --- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "name"),
    [
        ({"maxEventTimeSkewMs": "5"}, "maxEventTimeSkewMs"),
        ({"allowedLatenessMs": "5"}, "allowedLatenessMs"),
        ({"maxBurstFrames": "5"}, "maxBurstFrames"),
        ({"maxBatchMemory": "5000"}, "maxBatchMemory"),
        ({"lateFrames": "keep"}, "lateFrames"),
        ({"maxFramesPerSecond": "0"}, "maxFramesPerSecond"),
        ({"alignEventTime": "true", "batching": "pulse"}, "alignEventTime"),
        (
            {"maxBytesPerTrigger": "auto", "memoryHighWater": "0.9", "memoryEmergency": "0.8"},
            "memoryEmergency",
        ),
    ],
)
def test_policy_options_are_strict(extra, name):
    with pytest.raises(TensorPoolOptionError, match=f"^{name}:"):
        parse_source_options({"streams": "1", **extra}, streaming=True)


def test_policy_options_streaming_only_and_auto():
    with pytest.raises(TensorPoolOptionError, match=r"^maxLagMs: is for streaming"):
        parse_source_options({"streams": "1", "maxLagMs": "10"}, streaming=False)
    o = parse_source_options({"streams": "1", "maxBytesPerTrigger": "auto"}, streaming=True)
    assert o.max_bytes_per_trigger is None and o.policy is not None and o.policy.auto_bytes


# --- the planner with the policies: offsets record every decision -----------------------------
def _plan(pol: SourcePolicy, planner: StreamPlanner, start, states, now_wall, now_mono=0):
    pol.begin(start, states, {}, now_mono, now_wall)
    plan = planner.plan(
        start,
        states,
        pol.limits(Limits()),
        admit=pol.admit,
        align=pol.align if pol.p.align else None,
    )
    pol.finish(start, plan.end, plan.runs, states)
    return plan


def test_alignment_holds_the_stream_ahead_and_offsets_replay():
    pol = SourcePolicy(PolicyOptions(align=True, skew_ms=100, idle_ms=60_000))
    st = {1: ring(1, 0, 100, 0, 10 * MS), 2: ring(1, 0, 20, 0, 10 * MS)}  # 2 is behind
    planner = StreamPlanner((1, 2))
    start = {1: StreamPos(1, 0), 2: StreamPos(1, 0)}
    plan = _plan(pol, planner, start, st, now_wall=10 * S)
    # stream 2's newest is 190 ms: stream 1 may go to 290 ms (seqs 0..29)
    assert plan.end[1].seq == 30 and plan.end[2].seq == 20
    assert plan.end[1].event_ns == 290 * MS and plan.end[2].event_ns == 190 * MS
    doc = encode_offsets(plan.end)
    assert decode_offsets(doc) == plan.end
    r = {x.stream_id: (x.first, x.end, x.expect) for x in batch_ranges(start, decode_offsets(doc))}
    assert r == {1: (0, 30, 30), 2: (0, 20, 20)}


def test_lag_shed_and_late_drop_are_skipped_by_a_replay_and_never_lost():
    pol = SourcePolicy(
        PolicyOptions(max_lag_ms=500, late="drop", allowed_lateness_ms=0, idle_ms=60_000)
    )
    planner = StreamPlanner((1,))
    start = {1: StreamPos(1, 0)}
    st = {1: ring(1, 0, 100, 0, 10 * MS)}  # stamps 0..990 ms
    plan = _plan(pol, planner, start, st, now_wall=1200 * MS)  # frames older than 700 ms shed
    e = plan.end[1]
    assert e.shed_lag == 70 and e.frames == 30 and e.skip_to == 70 and e.lost == 0
    (rng,) = batch_ranges(start, decode_offsets(encode_offsets(plan.end)))
    assert (rng.first, rng.end, rng.expect) == (70, 100, 30)
    assert pol.aligner.global_ns == 990 * MS
    # late: frames 100.. stamped 800..890 ms, below the watermark, younger than maxLagMs
    st2 = {1: ring(1, 100, 10, -200 * MS, 10 * MS)}
    plan2 = _plan(pol, planner, plan.end, st2, now_wall=1200 * MS)
    e2 = plan2.end[1]
    assert e2.late == 10 and e2.frames == 30 and e2.skip_to == 110 and e2.shed_lag == 70


def test_late_flag_boundary_and_rate_deferral():
    pol = SourcePolicy(
        PolicyOptions(late="flag", idle_ms=60_000, max_fps=100.0, max_burst=5, max_jitter_ms=50)
    )
    pol.aligner.global_ns = 50 * MS  # a watermark already at 50 ms
    planner = StreamPlanner((1,))
    start = {1: StreamPos(1, 0)}
    st = {1: ring(1, 0, 20, 0, 10 * MS)}
    plan = _plan(pol, planner, start, st, now_wall=S)
    e = plan.end[1]
    assert e.frames == 5 and e.seq == 5  # the burst; the rest waits in the ring
    assert e.late == 5 and e.late_to == 5 and e.skip_to == 0  # 0..40 ms < 50 ms: flagged
    plan2 = _plan(pol, planner, plan.end, st, now_wall=S, now_mono=30 * MS)  # 3 tokens
    assert plan2.end[1].seq == 8 and plan2.end[1].late == 5  # 50 ms+ is not late
    per, src = pol.report([1])
    assert per[1]["jitterP99Ms"] == 0.0 and per[1]["tokens"] == 0 and src["watermarkMs"] == 70


def test_emergency_shed_counts_shed_memory():
    pol = SourcePolicy(
        PolicyOptions(auto_bytes=True, max_batch_memory=1000, high_water=0.8, emergency=0.95)
    )
    planner = StreamPlanner((1,))
    start = {1: StreamPos(1, 0)}
    st = {1: ring(1, 0, 20, 0, MS, size=100)}  # 2000 bytes owed > 950
    plan = _plan(pol, planner, start, st, now_wall=S)
    e = plan.end[1]
    assert e.shed_memory == 12 and e.skip_to == 12 and e.frames == 8  # kept 800 bytes
    assert e.lost == 0


def test_progress_helpers_read_shed_counters_and_watermark():
    from tensorpool.spark_source import shed_frames, source_watermark

    end = {"7": {"epoch": 1, "seq": 9, "lost": 1, "lostLate": 0, "late": 2, "shedLag": 3}}
    latest = {"source": {"watermarkMs": 5}}
    progress = {"sources": [{"endOffset": json.dumps(end), "latestOffset": json.dumps(latest)}]}
    assert shed_frames(progress) == {7: {"late": 2, "shedLag": 3, "shedMemory": 0}}
    assert source_watermark(progress) == 5
