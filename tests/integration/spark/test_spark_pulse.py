"""``batching=pulse`` end to end (issue 8 part 10): one closed window per micro-batch.

Real local SparkSession, real media driver, real producer processes (spark_roles.py). The
producers stamp frames with simulated pulse trains (``stamp N HZ T0``: frame ``seq`` carries
``T0 + seq/HZ`` on the monotonic clock) so that seconds of 14 Hz / 5 Hz traffic are published
at once and the test does not wait for them. The sans-IO planning is tested in
``tests/unit/spark/test_pulse_planning.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from spark_helpers import check_payload, end_offsets, source_options, start_query, wait_query

import tensorpool.spark_source as tps
from tensorpool.spark_source.options import parse_source_options
from tensorpool.spark_source.rings import mapped_rings, spool
from tensorpool.spark_source.rings.attach import open_attachment
from tensorpool.spark_source.rings.local import LocalRead
from tensorpool.spark_source.spark.pulse import (
    PulsePartition,
    PulseStreamReader,
    pulse_arrow_schema,
    read_pulse_partition,
)
from tensorpool.spark_source.spark.source import TensorPoolDataLossError, arrow_schema

pytestmark = pytest.mark.spark

S = 1_000_000_000
COLS = (
    "stream_id",
    "epoch",
    "seq",
    "timestamp",
    "timestamp_ns",
    "window_start",
    "window_end",
    "window_start_ns",
    "window_end_ns",
    "payload",
)


class WindowLog:
    """Idempotent foreachBatch sink keyed by batchId; records every attempt."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: dict[int, list[tuple]] = {}
        self.attempts: list[tuple[int, list[tuple]]] = []
        self.bad: list[tuple[int, int]] = []
        self.fail_on = fail_on

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [tuple(r) for r in df.select(*COLS).collect()]
        self.bad += [(r[0], r[2]) for r in rows if not check_payload(r[9], r[2])]
        got = sorted(r[:9] for r in rows)
        self.attempts.append((batch_id, got))
        if self.fail_on is not None and batch_id == self.fail_on:
            self.fail_on = None
            raise RuntimeError(f"simulated crash in batch {batch_id}")
        self.batches[batch_id] = got

    def frames(self) -> list[tuple[int, int]]:
        return [(r[0], r[2]) for b in sorted(self.batches) for r in self.batches[b]]


def _stamp(p: Any, n: int, hz: float, t0: int) -> None:
    p.send(f"stamp {n} {hz} {t0}")
    p.next_event("produced")


def _raw(rows: list[tuple]) -> list[tuple]:
    """A batch without `timestamp` (converted to wall clock anew at every read)."""
    return [r[:3] + r[4:] for r in rows]


def _check_batch(rows: list[tuple], hz: dict[int, float], t0: int) -> tuple[int, int]:
    """One window per batch; window columns agree with the frames' clock; returns the window."""
    windows = {r[5:9] for r in rows}  # wall-clock and ns columns: one value for all streams
    assert len(windows) == 1, f"a micro-batch must hold exactly one window, got {windows}"
    ((w_start, w_end, ws, we),) = windows
    assert we - ws == S
    assert round((w_end - w_start).total_seconds() * 1e6) == S // 1000
    for sid, _epoch, seq, ts, ts_ns, *_ in rows:
        assert ts_ns == t0 + round(seq * S / hz[sid])
        # window_start is converted to wall clock like `timestamp`: the two conversions are
        # sampled at different moments (sub-ms apart), a missing or wrong one is off by days
        skew_s = (ts - w_start).total_seconds() - (ts_ns - ws) / 1e9
        assert abs(skew_s) < 1, skew_s
    return ws, we


def test_each_micro_batch_is_one_window_and_a_restart_replays_it(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 8 p10 §1/§2/§6: a 14 Hz and a 5 Hz gated stream plus an ungated 3 Hz stream; with
    Trigger.AvailableNow every micro-batch is exactly one window (window columns in wall clock,
    the raw ns too), every frame is delivered once across batches, the ungated stream rides
    along. The query crashes in batch 2; restarted on its checkpoint it replays batch 2 with the
    same frames, then continues (with frames produced while it was down) without duplicates."""
    det = producers("--stream-id", "51", "--nslots", "256", "--shape", "16")
    mon = producers("--stream-id", "52", "--nslots", "256", "--shape", "16")
    log_ = producers("--stream-id", "53", "--nslots", "256", "--shape", "16")
    hz = {51: 14.0, 52: 5.0, 53: 3.0}
    t0 = time.monotonic_ns()
    for p, sid in ((det, 51), (mon, 52), (log_, 53)):
        _stamp(p, int(4 * hz[sid]), hz[sid], t0)
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="51,52,53",
        batching="pulse",
        batchLengthS="1",
        gatedStreams="51,52",
        startingOffsets="earliest",
        includeTensorMetadata="false",
    )
    ckpt = str(tmp_path / "ck")
    sink = WindowLog(fail_on=2)
    q = start_query(spark, opts, sink, ckpt, availableNow=True)
    with pytest.raises(Exception, match="simulated crash in batch 2"):
        q.awaitTermination(180)
    failed = [got for bid, got in sink.attempts if bid == 2]
    assert len(failed) == 1 and failed[0]
    for p, sid in ((det, 51), (mon, 52), (log_, 53)):  # 2 more seconds while it is down
        _stamp(p, int(2 * hz[sid]), hz[sid], t0)
    q = start_query(spark, opts, sink, ckpt, availableNow=True)
    q.awaitTermination(180)
    assert q.exception() is None
    replayed = [got for bid, got in sink.attempts if bid == 2]
    # same window, same frames (wall-clock columns are converted at each read, like `timestamp`)
    assert _raw(replayed[1]) == _raw(failed[0]), "the replay must hold exactly the same window"
    assert sorted(sink.batches) == list(range(len(sink.batches)))
    windows = [_check_batch(sink.batches[b], hz, t0) for b in sorted(sink.batches)]
    assert [w[0] for w in windows] == sorted({w[0] for w in windows}), "windows must increase"
    assert windows[0][0] == t0 and len(windows) >= 5
    frames = sink.frames()
    assert len(frames) == len(set(frames)), "a frame was delivered twice"
    produced = {(sid, s) for sid in hz for s in range(int(6 * hz[sid]))}
    assert set(frames) <= produced
    # everything but the trailing window (AvailableNow does not flush an incomplete window)
    assert {(sid, s) for sid, s in produced if s / hz[sid] < 5} <= set(frames)
    for b in sink.batches.values():
        ws, we = b[0][7], b[0][8]
        by_stream = {sid: [r for r in b if r[0] == sid] for sid in hz}
        assert all(r[4] < we for r in by_stream[53]), "ungated frames never run ahead"
        if ws - t0 >= 2 * S:  # gridded once the rates are confirmed: full pulse trains
            assert len(by_stream[51]) == 14 and len(by_stream[52]) == 5
    assert any(r[0] == 53 for b in sink.batches.values() for r in b)
    assert not sink.bad
    end = json.loads(q.lastProgress["sources"][0]["endOffset"])
    assert list(end)[:1] == ["window"] and list(end)[-1] == "batcher"
    assert end["51"]["frames"] and end["window"]["end_ns"] - end["window"]["start_ns"] == S


def test_no_batch_runs_until_a_window_closes(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 8 p10 §3: with a processing-time trigger and traffic arriving in steps, Spark runs a
    micro-batch only when a window closed (no empty batches in between); each holds one
    window."""
    det = producers("--stream-id", "54", "--nslots", "128", "--shape", "16")
    t0 = time.monotonic_ns()
    _stamp(det, 7, 14.0, t0)  # half a window: nothing can close yet
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="54",
        batching="pulse",
        startingOffsets="earliest",
        includeTensorMetadata="false",
    )
    sink = WindowLog()
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: q.lastProgress is not None, q)
        triggers = q.recentProgress
        _stamp(det, 14 * 3 - 7, 14.0, t0)  # up to 3 s
        wait_query(lambda: len(sink.batches) >= 2, q)
        q.processAllAvailable()
    finally:
        q.stop()
    assert triggers and all(p["numInputRows"] == 0 for p in triggers)
    # Spark runs batch 0 of a new query even when the source's offset did not move (there is
    # no committed offset to compare with): it is empty. Every later batch is one window.
    assert all(got for bid, got in sink.attempts if bid > 0), "an empty micro-batch ran"
    sink.batches = {bid: got for bid, got in sink.batches.items() if got}
    for bid in sorted(sink.batches):
        _check_batch(sink.batches[bid], {54: 14.0}, t0)
    frames = sink.frames()
    assert frames == sorted(set(frames)) and frames[0] == (54, 0)


def test_frames_overwritten_before_they_were_fed(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 8 p10 §4: frames overwritten in the ring before the reader fed them to the batcher
    are data loss: failOnDataLoss=true fails the query naming stream, count and fixes;
    false skips them, counts them in the offsets' ``lost`` (tps.lost_frames reads it), and
    delivers the rest in windows."""
    det = producers("--stream-id", "55", "--nslots", "64", "--shape", "16")
    t0 = time.monotonic_ns()
    _stamp(det, 14 * 6, 14.0, t0)  # 84 frames, 64 slots: seq 0..19 are gone
    start = json.dumps({"55": {"epoch": det.epoch, "seq": 0}})
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="55",
        batching="pulse",
        startingOffsets=start,
        includeTensorMetadata="false",
    )
    q = start_query(spark, opts, WindowLog(), str(tmp_path / "ck1"), availableNow=True)
    with pytest.raises(Exception) as info:
        q.awaitTermination(120)
    text = str(info.value)
    assert "stream 55: 20 frame(s) lost" in text and "seq 0..19" in text
    assert "failOnDataLoss=false" in text and "batchLengthS" in text
    sink = WindowLog()
    q = start_query(
        spark, {**opts, "failOnDataLoss": "false"}, sink, str(tmp_path / "ck2"), availableNow=True
    )
    q.awaitTermination(120)
    assert q.exception() is None
    seqs = [s for _, s in sink.frames()]
    assert seqs and min(seqs) == 20 and seqs == sorted(set(seqs))
    assert tps.lost_frames(q.lastProgress)[55]["lost"] == 20


def test_window_frames_overwritten_before_the_read(spark_media_driver, tmp_shm, producers):
    """issue 8 p10 §4 read-time loss (executor path, driven directly: no Spark scheduler can
    make the overrun deterministic): a window's frames overwritten before the partition is
    read fail it naming the stream (failOnDataLoss=true), or are skipped and reported through
    the spool, which the driver folds into ``lostLate`` (false)."""
    det = producers("--stream-id", "56", "--nslots", "16", "--shape", "16")
    t0 = time.monotonic_ns()
    _stamp(det, 20, 14.0, t0)  # frames 0..3 were overwritten by 16..19
    opts = parse_source_options(
        source_options(spark_media_driver, tmp_shm, streams="56", batching="pulse"),
        streaming=True,
    )
    settings = opts.connection.client_settings(freshness_ms=opts.freshness_ms)
    with open_attachment((56,), settings, driver=False, intake_capacity=None) as att:
        spec = mapped_rings.RegionSpec.from_layout(att.wait_for_layouts(20)[56])
    base, schema = arrow_schema(False), pulse_arrow_schema(False)

    def part(fail: bool, spool_dir: str | None) -> PulsePartition:
        return PulsePartition(
            spec, 56, det.epoch, 0, 14, fail, False, spool_dir, np.array([[0, 14]]),
            reader=LocalRead(opts.connection.base_dirs),
            window_index=0, window_start_ns=t0, window_end_ns=t0 + S,
        )  # fmt: skip

    with pytest.raises(TensorPoolDataLossError, match="stream 56: frame 0 of epoch"):
        list(read_pulse_partition(part(True, None), base, schema))
    reader = PulseStreamReader(opts)
    reader._attach()  # the driver side: opens the attachment and the loss spool
    try:
        batches = list(read_pulse_partition(part(False, reader._spool), base, schema))
        rows = [r for b in batches for r in b.to_pylist()]
        assert [r["seq"] for r in rows] == list(range(4, 14))
        assert {(r["window_start_ns"], r["window_end_ns"]) for r in rows} == {(t0, t0 + S)}
        assert spool.collect(reader._spool, (56,))[0] == {56: 4}
    finally:
        reader.stop()


def test_bad_pulse_options_fail_naming_the_option(spark, spark_media_driver, tmp_shm):
    """issue 8 p10 options: bad ``batching`` / ``batchLengthS`` / ``gatedStreams``, pulse with a
    per-trigger limit fail at load(); pulse in a batch read fails when the query is planned."""
    from pyspark.errors import PySparkException

    base = source_options(spark_media_driver, tmp_shm, streams="1,2")
    cases = [
        ({"batching": "bogus"}, "batching:"),
        ({"batching": "pulse", "batchLengthS": "0"}, "batchlengths:"),
        ({"batching": "pulse", "gatedStreams": "3"}, "gatedstreams:"),
        ({"batching": "pulse", "maxFramesPerTrigger": "10"}, "maxframespertrigger:"),
    ]
    for extra, name in cases:
        with pytest.raises(PySparkException) as info:
            spark.readStream.format("tensorpool").options(**base, **extra).load()
        assert name in str(info.value).lower()
    with pytest.raises(PySparkException, match="'pulse' is for streaming queries"):
        spark.read.format("tensorpool").options(**base, batching="pulse").load().collect()


def test_epoch_change_mid_stream_continues_windows(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 8 p10 with an epoch change (a producer restart, Kafka's topic recreation): the
    reader moves to the new epoch from its first frame, the windows keep increasing across the
    change and each micro-batch is still one window. The old producer's clean exit removes its
    regions while its last window is still open (only newer pulses close it), so the tail of
    epoch a is lost; every frame of epoch a is either delivered exactly once or counted in the
    offsets (``lost`` for frames never fed, ``lostLate`` for fed frames whose regions were gone
    at reading), and epoch b's closed windows are delivered in full."""
    hz = 14.0
    a = producers("--stream-id", "57", "--instance-id", "pcam", "--nslots", "128", "--shape", "16")
    t0 = time.monotonic_ns()
    _stamp(a, 28, hz, t0)  # 2 s of pulses in epoch a
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="57",
        batching="pulse",
        startingOffsets="earliest",
        includeTensorMetadata="false",
        failOnDataLoss="false",
    )
    sink = WindowLog()
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: any(sink.batches.values()), q)
        a.close()
        b = producers(
            "--stream-id", "57", "--instance-id", "pcam", "--nslots", "128", "--shape", "16"
        )
        assert b.epoch == a.epoch + 1
        t1 = t0 + round(28 * S / hz)  # epoch b goes on where a stopped, from its seq 0
        _stamp(b, 42, hz, t1)  # 3 more seconds: windows 2, 3, 4 (its last slot is seq 41)
        wait_query(lambda: sum(r[1] == b.epoch for g in sink.batches.values() for r in g) >= 42, q)
        q.processAllAvailable()
        offsets = end_offsets(q)
    finally:
        q.stop()
    assert q.exception() is None
    origin = {a.epoch: t0, b.epoch: t1}
    windows = []
    for bid in sorted(sink.batches):
        rows = sink.batches[bid]
        if not rows:
            continue
        ((ws, we),) = {r[7:9] for r in rows}
        assert we - ws == S
        for _sid, epoch, seq, _ts, ts_ns, *_ in rows:
            assert ts_ns == origin[epoch] + round(seq * S / hz)
            assert ws <= ts_ns < we
        windows.append(ws)
    assert windows == sorted(set(windows)) and windows[0] == t0
    got = [(r[1], r[2]) for bid in sorted(sink.batches) for r in sink.batches[bid]]
    assert len(got) == len(set(got)), "a frame was delivered twice"
    from_a = [s for e, s in got if e == a.epoch]
    assert from_a == list(range(len(from_a))) and len(from_a) >= 14  # window 0 at least
    counted = offsets["57"]["lost"] + offsets["57"]["lostLate"]
    assert len(from_a) + counted == 28, (from_a, offsets)
    assert [s for e, s in got if e == b.epoch] == list(range(42))  # windows 2, 3 and 4
    assert not sink.bad
