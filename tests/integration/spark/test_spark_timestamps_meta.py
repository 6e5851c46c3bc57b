"""#16.4 startingOffsetsByTimestamp / endingOffsetsByTimestamp, includeStreamMetadata, and
#16.6 self-describing tensors, on a real local SparkSession with real producer processes.

Frames are stamped in simulated time (``stamp N HZ T0`` of spark_roles.py: frame ``seq`` at
``T0 + seq/HZ`` on CLOCK_MONOTONIC, 100 ms apart), so every frame's event time is known; the
test converts it to wall-clock milliseconds the way the ``timestamp`` column does (same host:
CLOCK_REALTIME - CLOCK_MONOTONIC) and asks for times 50 ms before a frame.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from spark_helpers import check_payload, source_options

import tensorpool.spark_source as tps

pytestmark = pytest.mark.spark

HZ = 10  # frames 100 ms apart in event time


def _stamp(p: Any, n: int) -> int:
    """Publish ``n`` frames stamped ``T0 + seq/HZ`` (T0 a minute ago); return T0 in wall ms."""
    t0_mono = time.monotonic_ns() - 60_000_000_000
    wall_shift = time.time_ns() - time.monotonic_ns()
    p.send(f"stamp {n} {HZ} {t0_mono}")
    p.next_event("produced")
    return (t0_mono + wall_shift) // 1_000_000


def _wall_ms(t0_ms: int, seq: int) -> int:
    return t0_ms + seq * 1000 // HZ


def _seqs(spark: Any, opts: dict[str, str]) -> list[int]:
    df = spark.read.format("tensorpool").options(**opts).load()
    return sorted(r.seq for r in df.select("seq").collect())


def _available_now(spark: Any, opts: dict[str, str], ckpt: str) -> list[Any]:
    rows: list[Any] = []

    def collect(df: Any, _batch_id: int) -> None:
        rows.extend(df.collect())

    q = (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(collect)
        .trigger(availableNow=True)
        .option("checkpointLocation", ckpt)
        .start()
    )
    q.awaitTermination(120)
    if q.exception() is not None:
        raise AssertionError(str(q.exception()))
    return rows


def test_offsets_by_timestamp_select_frames_by_event_time(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """#16.4 startingOffsetsByTimestamp / endingOffsetsByTimestamp: the first frame whose event
    time is >= the given ms starts (batch and streaming), the first >= the end ms ends (batch,
    exclusive); -2 is earliest; a start older than the ring is its oldest frame (no loss)."""
    p = producers("--stream-id", "61", "--shape", "64", "--nslots", "64")
    t0 = _stamp(p, 100)  # the ring (64 slots) holds seqs 36..99
    base = source_options(spark_media_driver, tmp_shm, streams="61")
    start = json.dumps({"61": _wall_ms(t0, 50) - 50})
    end = json.dumps({"61": _wall_ms(t0, 80) - 50})
    assert _seqs(
        spark, dict(base, startingOffsetsByTimestamp=start, endingOffsetsByTimestamp=end)
    ) == list(range(50, 80))
    # the timestamp option takes precedence over startingOffsets (Kafka's rule)
    assert _seqs(
        spark, dict(base, startingOffsets="earliest", startingOffsetsByTimestamp=start)
    ) == list(range(50, 100))
    # -2 = earliest; a time before the ring's oldest frame = the oldest frame, not data loss
    assert _seqs(spark, dict(base, startingOffsetsByTimestamp='{"61": -2}')) == list(range(36, 100))
    before = json.dumps({"61": _wall_ms(t0, 0) - 5000})
    assert _seqs(spark, dict(base, startingOffsetsByTimestamp=before)) == list(range(36, 100))
    # an end before every frame: nothing; an end after every frame: latest
    early_end = json.dumps({"61": _wall_ms(t0, 0)})
    assert _seqs(spark, dict(base, endingOffsetsByTimestamp=early_end)) == []
    late_end = json.dumps({"61": _wall_ms(t0, 500)})
    assert _seqs(spark, dict(base, endingOffsetsByTimestamp=late_end)) == list(range(36, 100))
    # streaming: the query starts at the resolved frame
    rows = _available_now(spark, dict(base, startingOffsetsByTimestamp=start), str(tmp_path / "ck"))
    assert sorted(r.seq for r in rows) == list(range(50, 100))
    assert all(check_payload(r.payload, r.seq) for r in rows)


def test_start_by_timestamp_after_every_frame_follows_the_strategy(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """#16.4 startingOffsetsByTimestampStrategy: no frame at or after the time fails the query
    naming the option and the stream (error, the default), or starts at latest."""
    from pyspark.errors import PySparkException

    p = producers("--stream-id", "62", "--shape", "64", "--nslots", "64")
    t0 = _stamp(p, 20)
    base = source_options(spark_media_driver, tmp_shm, streams="62")
    future = json.dumps({"62": _wall_ms(t0, 1000)})
    with pytest.raises(PySparkException, match="startingOffsetsByTimestamp: stream 62 has no"):
        _seqs(spark, dict(base, startingOffsetsByTimestamp=future))
    latest = dict(base, startingOffsetsByTimestamp=future)
    latest["startingOffsetsByTimestampStrategy"] = "latest"
    assert _seqs(spark, latest) == []
    with pytest.raises(PySparkException, match="startingOffsetsByTimestamp: stream 62 has no"):
        _available_now(spark, dict(base, startingOffsetsByTimestamp=future), str(tmp_path / "a"))
    p.produce(5)  # seqs 20..24, stamped now: after the query started at latest
    assert _available_now(spark, latest, str(tmp_path / "b")) == []


def test_include_stream_metadata_gives_the_producers_meta(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """#16.4 includeStreamMetadata: the producer's DataSourceAnnounce name and DataSourceMeta
    attributes (produce --meta k=v) in a metadata map<string,string> column, batch and
    streaming, per stream; without the option there is no such column."""
    pa = producers(
        "--stream-id", "63", "--shape", "16", "--name", "cam-a",
        "--meta", "site=lab 2", "--meta", "unit=K",
    )  # fmt: skip
    pb = producers("--stream-id", "64", "--shape", "16", "--name", "cam-b")
    pa.produce(5)
    pb.produce(3)
    opts = source_options(spark_media_driver, tmp_shm, streams="63,64")
    with_meta = dict(opts, includeStreamMetadata="true", includeTensorMetadata="false")
    df = spark.read.format("tensorpool").options(**with_meta).load()
    assert df.columns[-2:] == ["payload", "metadata"]
    assert df.schema["metadata"].dataType.simpleString() == "map<string,string>"
    rows = df.collect()
    want = {63: {"name": "cam-a", "site": "lab 2", "unit": "K"}, 64: {"name": "cam-b"}}
    assert sorted((r.stream_id, r.seq) for r in rows) == [(63, i) for i in range(5)] + [
        (64, i) for i in range(3)
    ]
    for r in rows:
        assert r.metadata == want[r.stream_id], r
        assert check_payload(r.payload, r.seq)
    assert "metadata" not in spark.read.format("tensorpool").options(**opts).load().columns
    # streaming (with the tensor columns too)
    stream_opts = dict(opts, includeStreamMetadata="true", startingOffsets="earliest")
    rows = _available_now(spark, stream_opts, str(tmp_path / "ck"))
    assert len(rows) == 8
    for r in rows:
        assert r.metadata == want[r.stream_id] and r.dtype == "uint32", r


def test_fixed_layout_is_in_the_payload_metadata(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """#16.6 self-describing tensors: one fixed layout -> dtype and shape in the payload field's
    metadata; tps.stack / tps.to_numpy use it without the dtype/shape columns (batch and in a
    micro-batch); streams with different layouts get none."""
    p = producers("--stream-id", "65", "--shape", "4", "16", "--dtype", "float32")
    q = producers("--stream-id", "66", "--shape", "8", "--dtype", "uint32")
    p.produce(6)
    q.produce(2)
    opts = source_options(spark_media_driver, tmp_shm, streams="65")
    df = spark.read.format("tensorpool").options(**opts, includeTensorMetadata="false").load()
    assert df.schema["payload"].metadata == {"dtype": "float32", "shape": [4, 16]}
    assert tps.tensor_layout(df) == ("float32", (4, 16))
    arr = tps.stack(df.orderBy("seq").select("payload"))
    assert arr.shape == (6, 4, 16) and arr.dtype == np.float32
    rows = df.orderBy("seq").collect()
    for i, r in enumerate(rows):
        assert arr[i].tobytes() == r.payload and check_payload(r.payload, r.seq)
        one = tps.to_numpy(r, schema=df.schema)
        assert one.shape == (4, 16) and one.tobytes() == r.payload
    with pytest.raises(ValueError, match="dtype and shape are needed"):
        tps.to_numpy(rows[0])
    # different layouts: no hint, and stack says what it needs
    both = spark.read.format("tensorpool").options(**dict(opts, streams="65,66")).load()
    assert both.schema["payload"].metadata == {}
    with pytest.raises(ValueError, match="dtype and shape are needed"):
        tps.stack(both.select("payload"))
    # a micro-batch DataFrame carries the schema too
    shapes: list[tuple[int, ...]] = []

    def per_batch(batch: Any, _batch_id: int) -> None:
        if batch.count():
            shapes.append(tps.stack(batch.select("payload")).shape)

    query = (
        spark.readStream.format("tensorpool")
        .options(**opts, startingOffsets="earliest")
        .load()
        .writeStream.foreachBatch(per_batch)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert shapes == [(6, 4, 16)]
