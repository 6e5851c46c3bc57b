"""The two uses the API was shaped for (issue #7): the rate limiter's pending frame and the
Spark source's descriptor intake. Real buffers, synthetic descriptors."""

from __future__ import annotations

from dataclasses import dataclass

from tensorpool.ingest import IngestResult, IngressBuffer, ReplaceInfo


@dataclass(frozen=True)
class Descriptor:
    stream_id: int
    seq: int


def test_rate_limiter_pending_frame_is_a_one_slot_latest_by_key_buffer() -> None:
    """Hold only the most recent frame until the next rate slot opens (RateLimiter spec:
    "publish the most recent frame available"); superseded frames are counted, not lost
    silently."""
    skipped: list[ReplaceInfo] = []
    slot = IngressBuffer(
        "rl.mapping.7",
        mode="latest_by_key",
        capacity=1,
        key=lambda d: d.stream_id,
        on_replace=skipped.append,
    )
    published: list[Descriptor] = []
    replaced_seen = 0
    for seq in range(1, 11):  # source at 10x the destination rate
        res = slot.ingest(Descriptor(stream_id=1000, seq=seq))
        assert res is (IngestResult.ENQUEUED if seq % 5 == 1 else IngestResult.REPLACED)
        if seq % 5 == 0:  # the rate slot opens
            stats = slot.drain(1, published.append)
            replaced_seen += stats.replaced
            assert (stats.processed, stats.pending) == (1, 0)
    assert [d.seq for d in published] == [5, 10]
    assert replaced_seen == len(skipped) == 8
    assert slot.drain(1, published.append).processed == 0  # nothing new: nothing published


def test_spark_intake_is_a_queue_per_stream_drained_by_max_frames_per_trigger() -> None:
    """Lane = stream id, tick = micro-batch planning, budget = max frames per trigger.
    Equal streams share the budget; a short stream's share flows to the others; overflow is
    counted per stream (the source reports it as data loss)."""
    intake = IngressBuffer("spark.intake", mode="queue", capacity=12, lane=lambda d: d.stream_id)
    for seq in range(6):
        intake.ingest(Descriptor(10, seq))
        intake.ingest(Descriptor(20, seq))
    intake.ingest(Descriptor(30, 0))
    # capacity 12 with 13 arrivals: one overflow, charged to the first stream in rotation
    batch: list[Descriptor] = []
    stats = intake.drain(6, batch.append)
    assert stats.dropped == 1
    assert [d.stream_id for d in batch] == [10, 20, 30, 10, 20, 10]
    per_stream = {lane: lm.pending for lane, lm in intake.metrics().lanes.items()}
    assert per_stream == {10: 2, 20: 4, 30: 0}
    assert intake.metrics().lanes[10].dropped_total == 1
    nxt: list[Descriptor] = []
    intake.drain(6, nxt.append)
    assert [d.stream_id for d in nxt] == [20, 10, 20, 10, 20, 20]
    # within a stream, order is arrival order (offsets stay monotonic per stream)
    seqs_20 = [d.seq for d in batch + nxt if d.stream_id == 20]
    assert seqs_20 == sorted(seqs_20)
