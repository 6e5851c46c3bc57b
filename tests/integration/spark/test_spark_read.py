"""Spark reads tensorpool streams: batch snapshot, AvailableNow, admission, pandas UDF, options.

Real local SparkSession, real media driver, real producer processes (spark_roles.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
import pandas as pd
import pytest
from spark_helpers import check_payload, source_options

import tensorpool.spark_source as tps

pytestmark = pytest.mark.spark


def _read(spark: Any, opts: dict[str, str]) -> list[Any]:
    df = spark.read.format("tensorpool").options(**opts).load()
    return sorted(df.collect(), key=lambda r: (r.stream_id, r.seq))


def test_batch_read_snapshot_content_order_metadata(spark, spark_media_driver, tmp_shm, producers):
    """issue 6 §3 batch read: exactly the committed frames in the ring, with content and metadata
    (Wire §8.3: every frame passes the seqlock check; §15.21a.5: regions under shmBaseDir)."""
    p1 = producers(
        "--stream-id", "11", "--shape", "4", "16", "--dtype", "float32", "--nslots", "64"
    )
    p2 = producers("--stream-id", "12", "--shape", "100", "--dtype", "uint8", "--nslots", "16")
    assert p1.produce(40) == 40
    assert p2.produce(30) == 30  # ring of 16: only seqs 14..29 are still there
    opts = source_options(spark_media_driver, tmp_shm, streams="11,12", minPartitions=3)
    rows = _read(spark, opts)
    by_stream = {s: [r for r in rows if r.stream_id == s] for s in (11, 12)}
    assert [r.seq for r in by_stream[11]] == list(range(40))
    assert [r.seq for r in by_stream[12]] == list(range(14, 30))
    for r in rows:
        assert check_payload(r.payload, r.seq), (r.stream_id, r.seq)
    r = by_stream[11][5]
    assert (r.dtype, r.shape, r.strides, r.epoch) == ("float32", [4, 16], [64, 4], p1.epoch)
    assert r.meta_version == 0 and r.timestamp_ns > 0 and r.timestamp is not None
    arr = tps.to_numpy(r)
    assert arr.shape == (4, 16) and arr.dtype == np.float32
    assert by_stream[12][0].dtype == "uint8" and by_stream[12][0].shape == [100]
    # endingOffsets / JSON startingOffsets select a sub-range of the snapshot
    sub = dict(
        opts,
        streams="11",
        startingOffsets=json.dumps({"11": {"epoch": p1.epoch, "seq": 10}}),
        endingOffsets=json.dumps({"11": {"epoch": p1.epoch, "seq": 13}}),
    )
    assert [r.seq for r in _read(spark, sub)] == [10, 11, 12]
    # without tensor metadata the columns are the bare ones
    bare = spark.read.format("tensorpool").options(**opts, includeTensorMetadata="false").load()
    assert bare.columns == ["stream_id", "epoch", "seq", "timestamp", "timestamp_ns", "payload"]


def _run_available_now(spark: Any, opts: dict[str, str], ckpt: str) -> list[tuple[int, list[int]]]:
    batches: list[tuple[int, list[int]]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append((batch_id, sorted(r.seq for r in df.select("seq").collect())))

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
    assert q.exception() is None
    return batches


def test_available_now_reads_exactly_the_frames_produced(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 6 §4 Trigger.AvailableNow: every frame produced before the trigger, once, nothing more;
    issue 6 §4 admission control: maxFramesPerTrigger caps every micro-batch."""
    p = producers("--stream-id", "21", "--shape", "64", "--nslots", "256")
    p.produce(100)
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="21",
        startingOffsets="earliest",
        maxFramesPerTrigger=30,
    )
    ckpt = str(tmp_path / "ck")
    batches = _run_available_now(spark, opts, ckpt)
    seqs = [s for _, b in batches for s in b]
    assert seqs == list(range(100))
    sizes = [len(b) for _, b in batches if b]
    assert sizes == [30, 30, 30, 10]
    # a second AvailableNow run on the same checkpoint picks up only the new frames
    p.produce(25)
    again = _run_available_now(spark, opts, ckpt)
    assert [s for _, b in again for s in b] == list(range(100, 125))


def test_max_bytes_per_trigger_caps_batches(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """issue 6 §4 admission control: maxBytesPerTrigger (ReadMaxBytes) bounds each micro-batch's
    bytes."""
    p = producers("--stream-id", "22", "--shape", "1024", "--dtype", "uint8", "--nslots", "64")
    p.produce(20)
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="22",
        startingOffsets="earliest",
        maxBytesPerTrigger=4 * 1024 + 100,
    )
    batches = _run_available_now(spark, opts, str(tmp_path / "ck"))
    sizes = [len(b) for _, b in batches if b]
    assert sizes == [4, 4, 4, 4, 4]
    assert [s for _, b in batches for s in b] == list(range(20))


def test_pandas_udf_per_frame_statistic(spark, spark_media_driver, tmp_shm, producers):
    """issue 6 §2 helper + docs example: a pandas UDF computes a per-frame statistic from the
    payloads."""
    from pyspark.sql.functions import pandas_udf

    p = producers("--stream-id", "23", "--shape", "8", "8", "--dtype", "uint32", "--nslots", "64")
    p.produce(12)

    @pandas_udf("double")
    def frame_mean(payload: pd.Series, dtype: pd.Series, shape: pd.Series) -> pd.Series:
        arrays = tps.column_to_numpy(payload, dtype, shape)
        return pd.Series([float(a.mean()) for a in arrays])

    df = (
        spark.read.format("tensorpool")
        .options(**source_options(spark_media_driver, tmp_shm, streams="23"))
        .load()
    )
    got = {
        r.seq: r.m
        for r in df.select("seq", frame_mean("payload", "dtype", "shape").alias("m")).collect()
    }
    assert sorted(got) == list(range(12))
    for seq, mean in got.items():
        arr = np.full(64, seq % 251 * 0x01010101, np.uint32)
        arr[:2] = np.frombuffer(seq.to_bytes(8, "little"), np.uint32)
        arr[-2:] = arr[:2]
        assert mean == pytest.approx(float(arr.mean()))


BAD_OPTIONS = [
    ({}, "streams"),
    ({"streams": "1", "maxFramePerTrigger": "5"}, "maxFramePerTrigger"),
    ({"streams": "x"}, "streams"),
    ({"streams": "1", "maxFramesPerTrigger": "0"}, "maxFramesPerTrigger"),
    ({"streams": "1", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"streams": "1", "startingOffsets": "{bad json"}, "startingOffsets"),
    ({"streams": "1,2", "startingOffsets": '{"1": {"epoch": 1, "seq": 0}}'}, "startingOffsets"),
    ({"streams": "1", "aeronDir": "relative/dir"}, "aeronDir"),
    ({"streams": "1", "controlChannel": "udp://x"}, "controlChannel"),
    ({"streams": "1", "stream": "1"}, "stream"),
]


@pytest.mark.parametrize(("opts", "name"), BAD_OPTIONS)
def test_bad_options_fail_at_load_naming_the_option(spark, opts, name):
    """issue 6 §1: unknown or invalid options fail at load() with a message naming the option."""
    from pyspark.errors import PySparkException

    # readStream goes through the same validation; check it for a few cases only (each
    # load() costs a Python worker round trip)
    readers = (
        (spark.read, spark.readStream)
        if name in ("streams", "maxFramePerTrigger")
        else (spark.read,)
    )
    for reader in readers:
        with pytest.raises(PySparkException) as info:
            reader.format("tensorpool").options(**opts).load()
        # Spark lower-cases option keys before the source sees them
        assert f"{name.lower()}:" in str(info.value).lower()


def test_stream_only_and_batch_only_options(spark, spark_media_driver, tmp_shm):
    """issue 6 §1: endingOffsets is batch-only; 'latest' cannot start a batch read."""
    from pyspark.errors import PySparkException

    opts = source_options(spark_media_driver, tmp_shm, streams="1", startingOffsets="latest")
    with pytest.raises(PySparkException, match="startingOffsets:"):
        spark.read.format("tensorpool").options(**opts).load().collect()
    sopts = source_options(spark_media_driver, tmp_shm, streams="1", endingOffsets="latest")
    q = None
    with pytest.raises(PySparkException, match="endingOffsets:"):
        q = (
            spark.readStream.format("tensorpool")
            .options(**sopts)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", f"{tmp_shm}/ck-{uuid.uuid4().hex}")
            .start()
        )
        q.awaitTermination(60)
        raise q.exception()  # type: ignore[misc]
