"""Sparse (relay) streams through the Spark source, end to end.

A rate limiter or bridge republishes frames under their source's seq numbers, so the stream's
seqs have gaps. The producer role's ``sparse N STEP`` command publishes exactly that
(``Producer.claim(seq=...)``). Real local SparkSession, real media driver, real producer
processes; the reader-level tests drive the streaming reader's driver calls directly (as the
Spark driver does) with a real attachment.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from spark_helpers import (
    BatchLog,
    check_payload,
    end_offsets,
    publish_sparse,
    source_options,
    start_query,
    wait_query,
)

from tensorpool.spark_source.options import parse_source_options
from tensorpool.spark_source.spark.source import TensorPoolDataLossError
from tensorpool.spark_source.spark.stream import TensorPoolStreamReader

pytestmark = pytest.mark.spark


class GatedLog(BatchLog):
    """Holds the first non-empty batch until released: the driver plans nothing meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, df: Any, batch_id: int) -> None:
        super().__call__(df, batch_id)
        if self.batches.get(batch_id) and not self.holding.is_set():
            self.holding.set()
            self.release.wait(120)


def test_sparse_micro_batches_spanning_more_seqs_than_slots_deliver_exactly_the_frames(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """Sparse stream: micro-batches whose seq span (84) is 5x the ring (16 slots) deliver exactly
    the published frames, intact, with no loss counted ('lost' and 'lostLate' stay 0) and the
    offsets' 'frames' equal to the number of frames delivered."""
    p = producers("--stream-id", "41", "--nslots", "16", "--shape", "64")
    sent = publish_sparse(p, 3, 7)
    sink = BatchLog()
    opts = source_options(spark_media_driver, tmp_shm, streams="41", startingOffsets="earliest")
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: len(sink.frames()) == 3, q)
        for _ in range(3):
            sent += publish_sparse(p, 12, 7)
            n = len(sent)
            wait_query(lambda n=n: len(sink.frames()) == n, q)
        q.processAllAvailable()
        off = end_offsets(q)["41"]
    finally:
        q.stop()
    assert sink.frames() == [(p.epoch, s) for s in sent]
    assert off["lost"] == 0 and off["lostLate"] == 0 and off["frames"] == len(sent)
    spans = [b[-1][1] - b[0][1] + 1 for b in sink.batches.values() if b]
    assert max(spans) > 16, spans
    assert not sink.bad


def test_sparse_admission_control_caps_frames_not_seq_span(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 6 §4 admission control on a sparse stream: maxFramesPerTrigger=6 gives batches of 6
    frames (each spanning 66 seqs > 64 slots), not of 6 seqs; Trigger.AvailableNow reads all 40
    exactly once."""
    p = producers("--stream-id", "42", "--nslots", "64", "--shape", "32")
    sent = publish_sparse(p, 40, 13)
    sink = BatchLog()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="42",
        startingOffsets="earliest",
        maxFramesPerTrigger=6,
    )
    q = start_query(spark, opts, sink, str(tmp_path / "ck"), availableNow=True)
    q.awaitTermination(120)
    assert q.exception() is None
    sizes = [len(b) for _, b in sorted(sink.batches.items()) if b]
    assert sizes == [6, 6, 6, 6, 6, 6, 4]
    assert sink.frames() == [(p.epoch, s) for s in sent]
    assert not sink.bad


@pytest.mark.parametrize("fail", [True, False])
def test_sparse_overrun_counts_lost_frames_not_seqs(
    spark, spark_media_driver, tmp_shm, producers, tmp_path, fail
):
    """Real loss on a sparse stream: while the query holds a batch, 40 frames (every 7th seq) go
    into a 16-slot ring; 24 are overwritten before it plans again. The loss is counted in
    frames (24, from the descriptors the driver received; the seq span is 7x that):
    failOnDataLoss=true fails naming 24 frames, false keeps going with lost=24 in the offsets
    and the 16 readable frames delivered."""
    sid = "43" if fail else "44"
    p = producers("--stream-id", sid, "--nslots", "16", "--shape", "64")
    first = publish_sparse(p, 3, 7)
    sink = GatedLog()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams=sid,
        startingOffsets="earliest",
        failOnDataLoss=str(fail).lower(),
    )
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        assert sink.holding.wait(90), "the first batch never arrived"
        burst = publish_sparse(p, 40, 7)
        sink.release.set()
        if fail:
            with pytest.raises(Exception) as info:
                q.awaitTermination(120)
            text = str(info.value)
            assert f"stream {sid}: 24 frame(s) lost" in text, text
            assert f"seq {burst[0]}..{burst[23]}" in text
            return
        wait_query(lambda: len(sink.frames()) == 3 + 16, q)
        q.processAllAvailable()
        off = end_offsets(q)[sid]
    finally:
        sink.release.set()
        q.stop()
    assert sink.frames() == [(p.epoch, s) for s in first + burst[24:]]
    assert (off["lost"], off["lostLate"], off["frames"]) == (24, 0, 19)
    assert not sink.bad


def _reader(md: Any, shm: str, **extra: object) -> TensorPoolStreamReader:
    return TensorPoolStreamReader(
        parse_source_options(source_options(md, shm, **extra), streaming=True)
    )


def _read_seqs(reader: TensorPoolStreamReader, parts: list) -> list[int]:
    return sorted(
        s for part in parts for b in reader.read(part) for s in b.column("seq").to_pylist()
    )


@pytest.mark.parametrize("fail", [True, False])
def test_sparse_replay_counts_frames_gone_since_the_plan(
    spark_media_driver, tmp_shm, producers, fail
):
    """issue 6 §5 replay with loss: a new reader process gets a logged batch of 10 frames (seq
    range 0..27, every 3rd seq); meanwhile 14 more frames overwrote 8 of them. The replay reads
    the 2 left and counts the 8 gone -- in frames, from end.frames - start.frames: true fails
    naming them, false reports them as lostLate in the next offset."""
    sid = 46 if fail else 47
    p = producers("--stream-id", str(sid), "--nslots", "16", "--shape", "16")
    batch = publish_sparse(p, 10, 3)
    later = publish_sparse(p, 14, 3)  # these reuse the slots of 8 of the batch's frames
    slots = {q & 15: q for q in batch + later}
    kept = [q for q in batch if slots[q & 15] == q]
    assert len(kept) == 2
    reader = _reader(
        spark_media_driver, tmp_shm, streams=str(sid), failOnDataLoss=str(fail).lower()
    )
    try:
        e = p.epoch
        start = {str(sid): {"epoch": e, "seq": 0, "frames": 0, "lost": 0, "lostLate": 0}}
        end = {str(sid): {"epoch": e, "seq": 28, "frames": 10, "lost": 0, "lostLate": 0}}
        if fail:
            with pytest.raises(TensorPoolDataLossError, match=f"stream {sid}: 8 frame"):
                reader.partitions(start, end)
            return
        parts = reader.partitions(start, end)
        assert _read_seqs(reader, parts) == kept
        nxt = reader.latestOffset(end, ReadAllAvailable())
        assert nxt[str(sid)]["lostLate"] == 8
    finally:
        reader.stop()


def test_intake_budget_keeps_later_descriptors_pending(spark_media_driver, tmp_shm, producers):
    """issue 7 part 7 (bounded ingest), integration path: the reader's attachment queues every
    descriptor; each latestOffset with ReadMaxRows(5) drains only the 5 the batch covers, the
    rest stay pending in the stream's IngressBuffer for the next trigger; the batches read
    exactly the published frames in order."""
    p = producers("--stream-id", "48", "--nslots", "256", "--shape", "16")
    reader = _reader(spark_media_driver, tmp_shm, streams="48", startingOffsets="latest")
    try:
        start = reader.initialOffset()
        sent = publish_sparse(p, 30, 5)
        att = reader._att
        assert att is not None
        deadline = time.monotonic() + 30
        while att.pending(48) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert att.pending(48) == 30
        got: list[int] = []
        for left in (25, 20):
            end = reader.latestOffset(start, ReadMaxRows(5))
            assert att.pending(48) == left
            assert end["48"]["frames"] - start["48"]["frames"] == 5
            got += _read_seqs(reader, reader.partitions(start, end))
            start = end
        assert got == sent[:10]
        assert json.loads(json.dumps(end)) == end
    finally:
        reader.stop()


def test_batch_read_of_a_sparse_stream_returns_exactly_the_ring(
    spark, spark_media_driver, tmp_shm, producers
):
    """issue 6 §3 on a sparse stream: spark.read returns exactly the frames in the ring (the last
    16 of 40, seq span 105 over 16 slots), no false loss -- also from an explicit seq 0, where
    the missing seqs cannot be told apart and are only logged as a possible loss."""
    p = producers("--stream-id", "49", "--nslots", "16", "--shape", "64")
    sent = publish_sparse(p, 40, 7)
    base = source_options(spark_media_driver, tmp_shm, streams="49")
    for starting in ("earliest", json.dumps({"49": {"epoch": p.epoch, "seq": 0}})):
        rows = (
            spark.read.format("tensorpool")
            .options(**base, startingOffsets=starting, minPartitions=3)
            .load()
            .select("seq", "payload")
            .collect()
        )
        assert sorted(r.seq for r in rows) == sent[24:]
        assert all(check_payload(r.payload, r.seq) for r in rows)
