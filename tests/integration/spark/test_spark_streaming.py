"""Streaming semantics: data loss (fail / skip and count), checkpoint replay, epoch changes.

Real local SparkSession, real media driver, real producer processes (spark_roles.py).
"""

from __future__ import annotations

import json

import pytest
from spark_helpers import (
    BatchLog,
    end_offsets,
    publish_sparse,
    source_options,
    start_query,
    wait_query,
)

import tensorpool.spark_source as tps

pytestmark = pytest.mark.spark


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
    q = start_query(spark, opts, BatchLog(), str(tmp_path / "ck"), availableNow=True)
    with pytest.raises(Exception) as info:
        q.awaitTermination(120)
    text = str(info.value)
    assert "stream 31: 84 frame(s) lost" in text
    # #16.3: an explicit start older than the ring is not "the query fell behind"
    assert "startingOffsets asked for stream 31 from seq 0" in text
    assert "failOnDataLoss=false" in text and "fell behind" not in text


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
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: end_offsets(q).get("32", {}).get("seq") == 40, q)
        assert end_offsets(q)["32"]["lost"] == 24
        # now overrun it while it runs: 300 frames at 300 Hz into 16 slots, 6 per trigger
        p.produce_at(300, 300)
        p.next_event("produced")

        def settled() -> bool:
            off = end_offsets(q).get("32", {})
            return (
                off.get("seq") == 340 and len(sink.frames()) + off["lost"] + off["lostLate"] == 340
            )

        wait_query(settled, q)
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


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_restart_from_checkpoint_replays_the_uncommitted_batch(
    spark, spark_media_driver, tmp_shm, producers, tmp_path, sparse
):
    """issue 6 §5: a query that dies mid-batch and restarts on its checkpoint replays exactly the
    logged batch (same frames) and continues without duplicates in an idempotent sink. Sparse:
    a relay's seqs (step 7: a span of 414 seqs > 256 slots, all 60 frames still in the ring);
    the restarted reader has no descriptor history and finds the batch's frames in the ring by
    the logged seq range, checked against the logged frame count."""
    sid = "45" if sparse else "33"  # a stream id per case: the media driver is shared
    p = producers("--stream-id", sid, "--nslots", "256", "--shape", "32")

    def publish(n: int) -> list[int]:
        if sparse:
            return publish_sparse(p, n, 7)
        end = p.produce(n)
        return list(range(end - n, end))

    sent = publish(60 if sparse else 90)
    ckpt = str(tmp_path / "ck")
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams=sid,
        startingOffsets="earliest",
        maxFramesPerTrigger=25,
    )
    sink = BatchLog(fail_on=1)
    q = start_query(spark, opts, sink, ckpt, availableNow=True)
    with pytest.raises(Exception, match="simulated crash in batch 1"):
        q.awaitTermination(120)
    failed = [got for bid, got in sink.attempts if bid == 1]
    assert len(failed) == 1 and len(failed[0]) == 25
    sent += publish(10)  # new data while the query is down
    q = start_query(spark, opts, sink, ckpt, availableNow=True)
    q.awaitTermination(120)
    assert q.exception() is None
    replayed = [got for bid, got in sink.attempts if bid == 1]
    assert replayed[1] == failed[0], "the replayed batch must hold exactly the same frames"
    assert sink.frames() == [(p.epoch, s) for s in sent]
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
    q = start_query(spark, opts, sink, ckpt)
    try:
        wait_query(lambda: len(sink.frames()) == 20, q)
        a.close()
        b = producers("--stream-id", "34", "--instance-id", "cam", "--nslots", "64")
        assert b.epoch == a.epoch + 1
        b.produce(15)
        wait_query(lambda: len(sink.frames()) == 35, q)
        q.processAllAvailable()  # the last batch is committed, not only delivered
    finally:
        q.stop()
    assert sink.frames() == [(a.epoch, s) for s in range(20)] + [(b.epoch, s) for s in range(15)]
    # While the query is down, epoch b gets 10 more frames and ends; epoch c begins.
    b.produce(10)
    b.close()
    c = producers("--stream-id", "34", "--instance-id", "cam", "--nslots", "64")
    c.produce(5)
    q = start_query(spark, opts, BatchLog(), ckpt, availableNow=True)
    with pytest.raises(Exception, match=f"unknown number of frame.*epoch {b.epoch} from seq 15"):
        q.awaitTermination(120)
    tolerant = BatchLog()
    q = start_query(spark, {**opts, "failOnDataLoss": "false"}, tolerant, ckpt, availableNow=True)
    q.awaitTermination(120)
    assert q.exception() is None
    assert tolerant.frames() == [(c.epoch, s) for s in range(5)]
