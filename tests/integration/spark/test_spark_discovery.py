"""#16.4 stream discovery: ``streams="*"`` / ``"lo-hi"`` reads every announced stream.

Real local SparkSession, real media driver, real producer processes (spark_roles.py).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from spark_helpers import check_payload, end_offsets, source_options, wait_query

pytestmark = pytest.mark.spark


class StreamLog:
    """Idempotent foreachBatch sink keyed by batchId: ``(stream_id, seq)`` per batch."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[int, int]]] = {}
        self.bad: list[tuple[int, int]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("stream_id", "seq", "payload").collect()
        self.bad += [(r.stream_id, r.seq) for r in rows if not check_payload(r.payload, r.seq)]
        self.batches[batch_id] = sorted((r.stream_id, r.seq) for r in rows)

    def frames(self) -> list[tuple[int, int]]:
        return [f for b in sorted(self.batches) for f in self.batches[b]]

    def seqs(self, sid: int) -> list[int]:
        return sorted(s for k, s in self.frames() if k == sid)


def _start(spark: Any, opts: dict[str, str], sink: StreamLog, ckpt: str) -> Any:
    return (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", ckpt)
        .start()
    )


def test_streams_star_discovers_streams_and_restarts_with_the_grown_set(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """#16.4 streams="*": two producers started before the query and one started after it are
    all read (the late one from its earliest frame); a restart from the checkpoint accepts the
    grown set, continues without duplicates and discovers a stream that appeared meanwhile."""
    a = producers("--stream-id", "1601")
    b = producers("--stream-id", "1602")
    a.produce(2)
    b.produce(2)
    sink = StreamLog()
    ckpt = str(tmp_path / "ck")
    opts = source_options(spark_media_driver, tmp_shm, streams="*", startingOffsets="earliest")
    q = _start(spark, opts, sink, ckpt)
    try:
        wait_query(lambda: len(sink.frames()) == 4, q)
        a.produce(3)
        b.produce(3)
        c = producers("--stream-id", "1603")
        c.produce(4)  # before the query sees stream 1603: it joins from its earliest frame
        wait_query(lambda: len(sink.frames()) == 14, q)
    finally:
        q.stop()
    assert sink.seqs(1601) == list(range(5))
    assert sink.seqs(1602) == list(range(5))
    assert sink.seqs(1603) == list(range(4))
    assert set(end_offsets(q)) == {"1601", "1602", "1603"}

    # restart: the checkpoint has 3 streams, the discovery finds 4 (1604 appeared meanwhile)
    a.produce(3)
    d = producers("--stream-id", "1604")
    d.produce(2)
    q = _start(spark, opts, sink, ckpt)
    try:
        wait_query(lambda: len(sink.frames()) == 19, q)
        time.sleep(1.0)  # a few more triggers: nothing is read twice
    finally:
        q.stop()
    assert q.exception() is None
    assert sink.seqs(1601) == list(range(8))
    assert sink.seqs(1604) == [0, 1]
    assert len(sink.frames()) == 19 and not sink.bad


def test_streams_range_reads_only_streams_in_the_range(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """#16.4 streams="lo-hi": streams announced in the range are read, including one that
    starts after the query; a stream outside the range is not."""
    inside = producers("--stream-id", "1611")
    outside = producers("--stream-id", "1620")
    sink = StreamLog()
    opts = source_options(
        spark_media_driver, tmp_shm, streams="1610-1619", startingOffsets="earliest"
    )
    inside.produce(3)
    outside.produce(3)
    q = _start(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: len(sink.frames()) >= 3, q)
        late = producers("--stream-id", "1612")
        late.produce(2)
        outside.produce(2)
        wait_query(lambda: len(sink.seqs(1612)) == 2, q)
    finally:
        q.stop()
    assert sink.seqs(1611) == [0, 1, 2]
    assert sink.seqs(1620) == []
    assert set(end_offsets(q)) == {"1611", "1612"}


def test_batch_read_of_a_range_reads_the_announced_streams(
    spark, spark_media_driver, tmp_shm, producers
):
    """#16.4 a batch read with streams="lo-hi" reads every stream announced in the range now."""
    for sid in (1631, 1632, 1640):
        producers("--stream-id", str(sid)).produce(3)
    df = (
        spark.read.format("tensorpool")
        .options(**source_options(spark_media_driver, tmp_shm, streams="1630-1639"))
        .load()
    )
    got = sorted((r.stream_id, r.seq) for r in df.select("stream_id", "seq").collect())
    assert got == [(1631, 0), (1631, 1), (1631, 2), (1632, 0), (1632, 1), (1632, 2)]
