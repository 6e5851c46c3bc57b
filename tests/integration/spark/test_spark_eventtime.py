"""#17 against a real local SparkSession and real producers: aligned event time (the minimum
rule), late frames flagged, progress watermarks, and seed 004 §7's pipeline
(examples/eventtime_join.py) stopped and restarted mid-way without double counting."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import source_options, wait_query

pytestmark = pytest.mark.spark

MS = 1_000_000
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "eventtime_join.py"


def stamp(p: Any, n: int, hz: int, t0: int) -> None:
    """Publish ``n`` frames now, frame ``seq`` stamped ``t0 + seq/hz`` (simulated time)."""
    p.send(f"stamp {n} {hz} {t0}")
    p.next_event("produced")


class Rows:
    """foreachBatch sink keeping (stream_id, seq, is_late) per batch id (a replay overwrites)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[int, int, bool]]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("stream_id", "seq", "is_late").collect()
        self.batches[batch_id] = [(r.stream_id, r.seq, r.is_late) for r in rows]

    def of(self, sid: int) -> list[tuple[int, bool]]:
        return sorted((s, late) for b in self.batches.values() for i, s, late in b if i == sid)


def test_aligned_event_time_holds_the_leader_and_flags_late(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """alignEventTime: stream 191 runs 1.5 s ahead of 192 in event time; the source admits 191
    only up to 192's newest + maxEventTimeSkewMs until 192 catches up. lateFrames=flag: frames
    stamped below the aligned watermark - allowedLatenessMs arrive with is_late=true, counted in
    'late'. A stream silent for idleStreamTimeoutMs stops holding the other back."""
    a = producers("--stream-id", "191", "--nslots", "512", "--shape", "16")
    b = producers("--stream-id", "192", "--nslots", "512", "--shape", "16")
    t0 = time.monotonic_ns()
    stamp(a, 200, 100, t0)  # 0 .. 1990 ms
    stamp(b, 50, 100, t0)  # 0 .. 490 ms
    rows = Rows()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="191,192",
        startingOffsets="earliest",
        earliestMarginMs="0",  # every frame from seq 0: the policies, not #16.1's margin
        alignEventTime="true",
        maxEventTimeSkewMs="100",
        idleStreamTimeoutMs="6000",
        lateFrames="flag",
        allowedLatenessMs="100",
        includeTensorMetadata="false",
    )
    q = (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(rows)
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        wait_query(lambda: len(rows.of(192)) == 50 and len(rows.of(191)) > 0, q)
        # the first batch with rows of 191 stops at 192's newest + skew (<= 490 + 100 ms); the
        # rest waits (192 is idle after 6 s without a frame, so later batches may take it)
        first = min(b for b, r in rows.batches.items() if any(i == 191 for i, _, _ in r))
        assert sorted(s for i, s, _ in rows.batches[first] if i == 191) == list(range(60))
        stamp(b, 150, 100, t0)  # 192 catches up: 500 .. 1990 ms
        wait_query(lambda: len(rows.of(191)) == 200 and len(rows.of(192)) == 200, q)
        stamp(b, 10, 100, t0 - 10_000 * MS)  # 10 frames far below the watermark
        wait_query(lambda: len(rows.of(192)) == 210, q)
        late = [s for s, is_late in rows.of(192) if is_late]
        assert late == list(range(200, 210))
        assert not any(is_late for _, is_late in rows.of(191))

        def end() -> dict[str, Any]:
            return json.loads(q.lastProgress["sources"][0]["endOffset"])

        wait_query(lambda: end()["192"].get("late") == 10, q)  # progress follows the sink
        assert end()["192"]["lost"] == 0 and "late" not in end()["191"]
        report = json.loads(q.lastProgress["sources"][0]["latestOffset"])
        assert report["source"]["watermarkMs"] is not None
        assert report["191"]["watermarkMs"] is not None and "idle" in report["191"]
        # 192 publishes one frame (2.1 s) and goes silent; 191 runs ahead (2.0 .. 2.49 s): held
        # above 2.2 s, then released once 192 has been idle for idleStreamTimeoutMs
        t_silent = time.monotonic()
        stamp(b, 1, 100, t0)  # seq 210: 2.1 s (above the watermark: not late)
        stamp(a, 50, 100, t0)
        wait_query(lambda: len(rows.of(191)) >= 221, q)
        assert len(rows.of(191)) < 250  # held at 192's newest + skew
        wait_query(lambda: len(rows.of(191)) == 250, q)
        assert time.monotonic() - t_silent > 3.0  # held for (most of) the idle timeout
    finally:
        q.stop()


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("eventtime_join_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_pipeline_restart_no_double_counting(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """Seed 004 §7: two live streams -> admission -> aligned event time -> withWatermark ->
    windowed stream-stream join on a key -> aggregation -> checkpoint -> parquet sink. The query
    is stopped mid-way and restarted from its checkpoint: every window's pair count is exact
    and appears once."""
    ex = _example()
    a = producers("--stream-id", "193", "--nslots", "1024", "--shape", "16")
    b = producers("--stream-id", "194", "--nslots", "1024", "--shape", "16")
    shift = time.time_ns() - time.monotonic_ns()
    win = 500 * MS
    base = time.monotonic_ns()
    t0 = base - (base + shift) % win + 5 * MS  # frames 5 ms past window starts: no edge cases
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    conn = source_options(spark_media_driver, tmp_shm)
    opts = ex.source_options((193, 194), **conn)

    def run() -> Any:
        return ex.start(spark, ex.build(spark, (193, 194), opts), out, ck, "300 milliseconds")

    def frames(q: Any) -> int:
        p = q.lastProgress
        if not p or not p["sources"][0]["endOffset"]:
            return 0
        end = json.loads(p["sources"][0]["endOffset"])
        return sum(v["frames"] for v in end.values())

    for p in (a, b):
        stamp(p, 100, 100, t0)  # windows 0, 1
    q = run()
    try:
        wait_query(lambda: frames(q) == 200, q, timeout=120)
    finally:
        q.stop()  # mid-way: windows in the join / aggregation state, not emitted yet
    for p in (a, b):
        stamp(p, 100, 100, t0)  # seqs 100..199: windows 2, 3
    q = run()
    try:
        wait_query(lambda: frames(q) >= 200, q, timeout=120)
        for p in (a, b):
            stamp(p, 10, 100, t0 + 10_000 * MS)  # later event time: closes windows 0..3

        def emitted() -> list[Any]:
            try:
                return spark.read.parquet(out).collect()
            except Exception:  # nothing written yet
                return []

        first = (t0 + shift) // 1000  # us, the sink's timestamps
        wait_query(
            lambda: (
                len([r for r in emitted() if r.window_start.timestamp() * 1e6 < first + 2e6]) >= 4
            ),
            q,
            timeout=120,
        )
    finally:
        q.stop()
    got: dict[int, list[int]] = {}
    for r in emitted():
        w = round((r.window_start.timestamp() * 1e6 - (first - 5000)) / 500_000)
        got.setdefault(w, []).append(r.pairs)
    want: dict[int, int] = {}
    for w in range(4):
        seqs = range(50 * w, 50 * w + 50)
        per_key = [sum(1 for s in seqs if s % ex.KEYS == k) for k in range(ex.KEYS)]
        want[w] = sum(n * n for n in per_key)
    assert {w: got[w] for w in range(4)} == {w: [n] for w, n in want.items()}


class Batches:
    """foreachBatch sink keeping the seqs of each batch id (a replay overwrites)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[int]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = sorted(r.seq for r in df.select("seq").collect())

    def seqs(self) -> list[int]:
        return sorted(s for b in self.batches.values() for s in b)

    def sizes(self) -> list[int]:
        return [len(self.batches[k]) for k in sorted(self.batches) if self.batches[k]]


def _query(spark: Any, opts: dict[str, str], sink: Any, ck: str) -> Any:
    return (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", ck)
        .start()
    )


def test_admission_sheds_by_lag_defers_by_rate_and_reports_jitter(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """maxLagMs sheds frames older than the budget (shedLag, never a data-loss failure);
    maxFramesPerSecond/maxBurstFrames defer the rest across triggers (every frame delivered
    once, no batch above the tokens); jitter p50/p99 appear in progress."""
    p = producers("--stream-id", "195", "--nslots", "1024", "--shape", "16")
    stamp(p, 100, 100, time.monotonic_ns() - 120_000 * MS)  # 2 minutes old: over maxLagMs
    stamp(p, 400, 1000, time.monotonic_ns() - 100 * 1_000_000)  # fresh, 1 kHz
    sink = Batches()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="195",
        startingOffsets="earliest",
        earliestMarginMs="0",  # every frame from seq 0: the policies, not #16.1's margin
        maxLagMs="30000",
        maxFramesPerSecond="400",
        maxBurstFrames="80",
        maxJitterMs="1000",
        includeTensorMetadata="false",
    )
    q = _query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: len(sink.seqs()) == 400, q)
        assert sink.seqs() == list(range(100, 500))  # shed 0..99, the rest exactly once
        sizes = sink.sizes()
        assert max(sizes) <= 80 + 400 and len(sizes) >= 2  # rate: deferred across triggers

        def end() -> dict[str, int]:
            return json.loads(q.lastProgress["sources"][0]["endOffset"])["195"]

        wait_query(lambda: end()["frames"] == 400, q)  # progress follows the sink
        assert end()["shedLag"] == 100 and end()["lost"] == 0
        report = json.loads(q.lastProgress["sources"][0]["latestOffset"])["195"]
        assert report["jitterP99Ms"] is not None and report["jitterExceeded"] is False
    finally:
        q.stop()


def test_adaptive_batches_adapt_and_the_memory_emergency_sheds_oldest(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """maxBytesPerTrigger=auto: the first batch takes the initial budget (1 MiB), later ones
    are sized from the measured cost, never above the high water of maxBatchMemory. A backlog
    over the emergency threshold sheds the oldest frames (shedMemory), not a loss."""
    p = producers("--stream-id", "196", "--nslots", "4096", "--shape", "1024")  # 4 KiB frames
    p.produce(800)  # 3.2 MiB: under the emergency threshold (0.95 x 4 MiB)
    sink = Batches()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="196",
        startingOffsets="earliest",
        earliestMarginMs="0",  # every frame from seq 0: the policies, not #16.1's margin
        maxBytesPerTrigger="auto",
        targetBatchLatencyMs="3000",
        maxBatchMemory=str(4 << 20),
        includeTensorMetadata="false",
    )
    q = _query(spark, opts, sink, str(tmp_path / "ck"))

    def end() -> dict[str, int]:
        return json.loads(q.lastProgress["sources"][0]["endOffset"])["196"]

    try:
        wait_query(lambda: len(sink.seqs()) == 800, q)
        sizes = sink.sizes()
        assert sizes[0] == (1 << 20) // 4096  # the initial budget
        high = int((4 << 20) * 0.8) // 4096
        assert max(sizes) <= high and len(sizes) > 1
        assert sink.seqs() == list(range(800))
        p.produce(2000)  # 8 MiB owed: over the emergency threshold
        wait_query(lambda: end()["frames"] + end().get("shedMemory", 0) == 2800, q)
        e = end()
        assert e["shedMemory"] > 0 and e["lost"] == 0
        seqs = sink.seqs()  # each trigger over the threshold sheds its oldest pending frames
        assert seqs[:800] == list(range(800)) and len(set(seqs)) == len(seqs)
        assert len(seqs) == e["frames"] and set(seqs) <= set(range(2800))
        # a trigger may plan while the 2000 frames are still being produced (under the
        # threshold: nothing shed yet); what is shed is counted exactly, and is older than
        # the frames delivered after it
        shed = sorted(set(range(2800)) - set(seqs))
        assert len(shed) == e["shedMemory"] and shed[-1] < seqs[-1]
        assert max(sink.sizes()) <= high
        src = json.loads(q.lastProgress["sources"][0]["latestOffset"])["source"]
        assert src["emergencies"] >= 1 and src["costNsPerByte"] is not None
    finally:
        q.stop()


class Seqs:
    """foreachBatch sink keeping (stream_id, seq) per batch id (a replay overwrites); for
    queries without the is_late column (lateFrames=drop)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[int, int]]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("stream_id", "seq").collect()
        self.batches[batch_id] = [(r.stream_id, r.seq) for r in rows]

    def of(self, sid: int) -> list[int]:
        return sorted(s for b in self.batches.values() for i, s in b if i == sid)


def test_late_frames_dropped_and_a_stuttering_producer_flagged(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """lateFrames=drop: frames stamped below the source's watermark - allowedLatenessMs are
    skipped, counted in 'late' (never 'lost', the query goes on past them). maxJitterMs: a
    producer whose frames come in bursts 0.5 s apart (simulated stamps: |interval - median|
    is 500 ms for 9 of 199 intervals, so p99 is 500 ms) is flagged in progress; a steady one
    beside it is not."""
    a = producers("--stream-id", "197", "--nslots", "512", "--shape", "16")
    b = producers("--stream-id", "198", "--nslots", "512", "--shape", "16")
    t0 = time.monotonic_ns()
    for k in range(10):  # 197 stutters: 10 bursts of 20 frames at 100 Hz, 0.5 s between them
        stamp(a, 20, 100, t0 + k * 500 * MS)
    stamp(b, 200, 100, t0)  # 198 is steady: 0 .. 1990 ms, every interval 10 ms
    seen = Seqs()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="197,198",
        startingOffsets="earliest",
        earliestMarginMs="0",  # every frame from seq 0: the policies, not #16.1's margin
        lateFrames="drop",
        allowedLatenessMs="100",
        maxJitterMs="100",
        includeTensorMetadata="false",
    )
    q = _query(spark, opts, seen, str(tmp_path / "ck"))

    def end() -> dict[str, Any]:
        return json.loads(q.lastProgress["sources"][0]["endOffset"])

    def frames(sid: str) -> int:
        if not q.lastProgress or not q.lastProgress["sources"][0]["endOffset"]:
            return 0
        return int(end().get(sid, {}).get("frames", 0))

    try:
        wait_query(lambda: frames("197") == 200 and frames("198") == 200, q)
        assert seen.of(197) == list(range(200)) and seen.of(198) == list(range(200))
        # the progress of the batch that planned the last frames has measured all of them
        report = json.loads(q.lastProgress["sources"][0]["latestOffset"])
        stutter, steady = report["197"], report["198"]
        assert stutter["jitterExceeded"] is True
        assert stutter["jitterP99Ms"] == pytest.approx(500.0, abs=1.0)
        assert stutter["jitterP50Ms"] == pytest.approx(0.0, abs=1.0)
        assert steady["jitterExceeded"] is False
        assert steady["jitterP50Ms"] is not None and steady["jitterP99Ms"] < 1.0
        # the source's watermark is now the minimum rule's: 198's newest, ~1.99 s
        stamp(b, 10, 100, t0 - 10_000 * MS)  # seqs 200..209, stamped ~8 s below it: late
        wait_query(lambda: end()["198"].get("late") == 10, q)
        stamp(b, 20, 100, t0 + 20_000 * MS)  # seqs 210..229, far ahead: delivered
        wait_query(lambda: frames("198") >= 220, q)
        assert seen.of(198) == list(range(200)) + list(range(210, 230))  # 200..209 dropped
        e = end()
        assert e["198"]["late"] == 10 and e["198"]["lost"] == 0
        assert e["197"].get("late", 0) == 0 and e["197"]["lost"] == 0
        assert q.exception() is None and q.isActive
    finally:
        q.stop()


def test_adaptive_budget_is_clamped_at_the_high_water(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """maxBytesPerTrigger=auto with a latency target no batch comes near (10 minutes): the
    latency budget outgrows memoryHighWater x maxBatchMemory (256 KiB = 64 frames here), and
    every batch is cut there (seed 001's high water: shrink, counted 'highWater'). The backlog
    (240 frames, 960 KiB) stays under memoryEmergency x maxBatchMemory: nothing is shed. No
    timing: the backlog is there before the query starts, the sizes follow from bytes alone."""
    p = producers("--stream-id", "199", "--nslots", "512", "--shape", "1024")  # 4 KiB frames
    p.produce(240)
    sink = Batches()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="199",
        startingOffsets="earliest",
        earliestMarginMs="0",  # every frame from seq 0: the policies, not #16.1's margin
        maxBytesPerTrigger="auto",
        targetBatchLatencyMs="600000",
        maxBatchMemory=str(1 << 20),
        memoryHighWater="0.25",
        memoryEmergency="0.99",
        includeTensorMetadata="false",
    )
    q = _query(spark, opts, sink, str(tmp_path / "ck"))

    def end() -> dict[str, int]:
        return json.loads(q.lastProgress["sources"][0]["endOffset"])["199"]

    try:
        wait_query(lambda: len(sink.seqs()) == 240, q)
        # the first batch: the initial 1 MiB capped at the high water; then measured budgets
        # (4 x the largest batch at least, by the model) shrunk to it
        assert sink.sizes() == [64, 64, 64, 48]
        assert sink.seqs() == list(range(240))
        wait_query(lambda: end()["frames"] == 240, q)
        assert end().get("shedMemory", 0) == 0 and end()["lost"] == 0
        src = json.loads(q.lastProgress["sources"][0]["latestOffset"])["source"]
        assert src["highWater"] >= 3 and src["emergencies"] == 0
        assert src["batchBudgetBytes"] == 64 * 4096 and src["pressure"] == "high"
    finally:
        q.stop()
