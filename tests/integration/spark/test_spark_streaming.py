"""Streaming semantics: data loss (fail / skip and count), checkpoint replay, epoch changes.

Real local SparkSession, real media driver, real producer processes (spark_roles.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from spark_helpers import check_payload, source_options

import tensorpool.spark_source as tps

pytestmark = pytest.mark.spark


class BatchLog:
    """An idempotent foreachBatch sink: results keyed by batchId (a replay overwrites)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: dict[int, list[tuple[int, int]]] = {}
        self.attempts: list[tuple[int, list[tuple[int, int]]]] = []
        self.bad: list[tuple[int, int]] = []
        self.fail_on = fail_on

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("epoch", "seq", "payload").collect()
        got = sorted((r.epoch, r.seq) for r in rows)
        self.bad += [(r.epoch, r.seq) for r in rows if not check_payload(r.payload, r.seq)]
        self.attempts.append((batch_id, got))
        if self.fail_on is not None and batch_id == self.fail_on and got:
            self.fail_on = None
            raise RuntimeError(f"simulated crash in batch {batch_id}")
        self.batches[batch_id] = got

    def frames(self) -> list[tuple[int, int]]:
        return [f for b in sorted(self.batches) for f in self.batches[b]]


def _start(spark: Any, opts: dict[str, str], sink: BatchLog, ckpt: str, **trigger: Any) -> Any:
    return (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(**(trigger or {"processingTime": "200 milliseconds"}))
        .option("checkpointLocation", ckpt)
        .start()
    )


def _wait(cond: Callable[[], bool], q: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if q.exception() is not None:
            raise AssertionError(f"query failed: {q.exception()}")
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for the query")


def _end_offsets(q: Any) -> dict[str, dict[str, int]]:
    progress = q.lastProgress
    if not progress or not progress["sources"]:
        return {}
    return json.loads(progress["sources"][0]["endOffset"] or "{}")


def test_fail_on_data_loss_true_fails_the_query(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 6 §4 failOnDataLoss=true (default): frames overwritten before they were read fail the
    query with a message naming the stream, the count and what to change."""
    p = producers("--stream-id", "31", "--nslots", "16")
    p.produce(100)
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="31",
        startingOffsets=json.dumps({"31": {"epoch": p.epoch, "seq": 0}}),
    )
    q = _start(spark, opts, BatchLog(), str(tmp_path / "ck"), availableNow=True)
    with pytest.raises(Exception) as info:
        q.awaitTermination(120)
    text = str(info.value)
    assert "stream 31: 84 frame(s) lost" in text
    assert "header_nslots" in text and "failOnDataLoss=false" in text


def test_fail_on_data_loss_false_skips_and_counts(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 6 §4 failOnDataLoss=false: an overrun ring keeps the query running; every frame is
    either delivered once or counted lost (offsets' lost + lostLate, visible in query progress)."""
    p = producers("--stream-id", "32", "--nslots", "16", "--shape", "64")
    p.produce(40)  # 24 of these are gone before the query starts
    sink = BatchLog()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="32",
        startingOffsets=json.dumps({"32": {"epoch": p.epoch, "seq": 0}}),
        failOnDataLoss="false",
        maxFramesPerTrigger=6,
    )
    q = _start(spark, opts, sink, str(tmp_path / "ck"))
    try:
        _wait(lambda: _end_offsets(q).get("32", {}).get("seq") == 40, q)
        assert _end_offsets(q)["32"]["lost"] == 24
        # now overrun it while it runs: 300 frames at 300 Hz into 16 slots, 6 per trigger
        p.produce_at(300, 300)
        p.wait("produced")

        def settled() -> bool:
            off = _end_offsets(q).get("32", {})
            return (
                off.get("seq") == 340 and len(sink.frames()) + off["lost"] + off["lostLate"] == 340
            )

        _wait(settled, q)
    finally:
        q.stop()
    frames = sink.frames()
    seqs = [s for _, s in frames]
    assert len(seqs) == len(set(seqs)), "a frame was delivered twice"
    assert set(seqs) <= set(range(340)) and seqs == sorted(seqs)
    lost = tps.lost_frames(q.lastProgress)[32]
    assert lost["total"] == 340 - len(frames)
    assert lost["total"] > 24, "the overrun should have lost frames"
    assert not sink.bad


def test_restart_from_checkpoint_replays_the_uncommitted_batch(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 6 §5: a query that dies mid-batch and restarts on its checkpoint replays exactly the
    logged batch (same frames) and continues without duplicates in an idempotent sink."""
    p = producers("--stream-id", "33", "--nslots", "256", "--shape", "32")
    p.produce(90)
    ckpt = str(tmp_path / "ck")
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="33",
        startingOffsets="earliest",
        maxFramesPerTrigger=25,
    )
    sink = BatchLog(fail_on=1)
    q = _start(spark, opts, sink, ckpt, availableNow=True)
    with pytest.raises(Exception, match="simulated crash in batch 1"):
        q.awaitTermination(120)
    failed = [got for bid, got in sink.attempts if bid == 1]
    assert len(failed) == 1 and len(failed[0]) == 25
    p.produce(10)  # new data while the query is down
    q = _start(spark, opts, sink, ckpt, availableNow=True)
    q.awaitTermination(120)
    assert q.exception() is None
    replayed = [got for bid, got in sink.attempts if bid == 1]
    assert replayed[1] == failed[0], "the replayed batch must hold exactly the same frames"
    assert sink.frames() == [(p.epoch, s) for s in range(100)]
    assert not sink.bad


def test_epoch_change_mid_stream(spark, spark_media_driver, tmp_shm, producers, tmp_path):
    """issue 6 §4 epoch change (Kafka: topic recreated): a producer restart moves the query to the
    new epoch from seq 0; nothing is lost when the old epoch was read to its end, so even
    failOnDataLoss=true keeps running. Unread frames of an epoch that ended while the query was
    down are an unknown loss: true fails, false moves on to the new epoch."""
    a = producers("--stream-id", "34", "--instance-id", "cam", "--nslots", "64")
    a.produce(20)
    ckpt = str(tmp_path / "ck")
    opts = source_options(spark_media_driver, tmp_shm, streams="34", startingOffsets="earliest")
    sink = BatchLog()
    q = _start(spark, opts, sink, ckpt)
    try:
        _wait(lambda: len(sink.frames()) == 20, q)
        a.close()
        b = producers("--stream-id", "34", "--instance-id", "cam", "--nslots", "64")
        assert b.epoch == a.epoch + 1
        b.produce(15)
        _wait(lambda: len(sink.frames()) == 35, q)
        q.processAllAvailable()  # the last batch is committed, not only delivered
    finally:
        q.stop()
    assert sink.frames() == [(a.epoch, s) for s in range(20)] + [(b.epoch, s) for s in range(15)]
    # While the query is down, epoch b gets 10 more frames and ends; epoch c begins.
    b.produce(10)
    b.close()
    c = producers("--stream-id", "34", "--instance-id", "cam", "--nslots", "64")
    c.produce(5)
    q = _start(spark, opts, BatchLog(), ckpt, availableNow=True)
    with pytest.raises(Exception, match=f"unknown number of frame.*epoch {b.epoch} from seq 15"):
        q.awaitTermination(120)
    tolerant = BatchLog()
    q = _start(spark, {**opts, "failOnDataLoss": "false"}, tolerant, ckpt, availableNow=True)
    q.awaitTermination(120)
    assert q.exception() is None
    assert tolerant.frames() == [(c.epoch, s) for s in range(5)]
