"""The write path: Spark rows become frames that a plain tensorpool consumer reads.

Real local SparkSession, real publisher process, real consumer (tests/integration/roles.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from spark_helpers import ProducerProc, source_options

from tensorpool.spark_source.options import parse_sink_options
from tensorpool.spark_source.spark.sink import (
    TensorPoolStreamWriter,
    ensure_publisher,
    stage_batches,
    stop_publisher,
)

pytestmark = pytest.mark.spark


def pattern(seq: int, n_u32: int) -> bytes:
    """The roles.py checksum pattern for frame ``seq`` (n_u32 uint32 elements)."""
    u8 = np.full(n_u32 * 4, seq % 251, np.uint8)
    u8[:8] = np.frombuffer(seq.to_bytes(8, "little"), np.uint8)
    u8[-8:] = u8[:8]
    return u8.tobytes()


def sink_options(md_dir: str, shm: str, stream: int, **extra: object) -> dict[str, str]:
    opts = {
        "stream": str(stream),
        "aeronDir": md_dir,
        "shmBaseDir": shm,
        "maxFrameBytes": "4096",
        "headerNslots": "256",
        "announcePeriodMs": "200",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def test_write_round_trip_to_a_plain_consumer(spark, media_driver, shm_base, roles):
    """issue 6 §6 write path: df.write publishes rows (payload+dtype+shape) as frames, in order, on
    a stream that any tensorpool consumer reads."""
    opts = sink_options(media_driver.dir, shm_base, 41)
    ensure_publisher(parse_sink_options(opts))  # so the consumer maps before the frames come
    try:
        consumer = roles(
            "consumer", "--stream-id", "41", "--shape", "256", "--count", "60", "--record"
        )
        consumer.wait_event("mapped")
        rows = [(pattern(s, 256), "uint32", [256]) for s in range(60)]
        df = spark.createDataFrame(rows, "payload binary, dtype string, shape array<int>")
        # two tasks (local[2]) stage their partitions; one publisher writes them in order
        df.write.format("tensorpool").options(**opts).mode("append").save()
        done = consumer.wait_event("done", timeout=60)
    finally:
        stop_publisher(opts)
    assert done["accepted"] == 60 and done["n_bad"] == 0
    assert sorted(s for _, s in done["seen"]) == list(range(60))


def test_write_rejects_bad_rows_and_modes(spark, media_driver, shm_base):
    """issue 6 §6: rows the wire cannot carry fail the write naming the column/option; nothing is
    published for a failed job."""
    from pyspark.errors import PySparkException

    opts = sink_options(media_driver.dir, shm_base, 42)
    short = spark.createDataFrame(
        [(b"\x00" * 10, "float32", [4])], "payload binary, dtype string, shape array<int>"
    )
    with pytest.raises(Exception, match="payload: row 0 has 10 bytes"):
        short.write.format("tensorpool").options(**opts).mode("append").save()
    big = spark.createDataFrame(
        [(b"\x00" * 8192, "uint8", [8192])], "payload binary, dtype string, shape array<int>"
    )
    with pytest.raises(Exception, match="maxFrameBytes:"):
        big.write.format("tensorpool").options(**opts).mode("append").save()
    with pytest.raises(PySparkException, match="mode:"):
        short.write.format("tensorpool").options(**opts).mode("overwrite").save()
    stop_publisher(opts)


def test_write_stream_relay_is_idempotent_per_batch_id(
    spark, media_driver, shm_base, roles, tmp_path
):
    """issue 6 §6 writeStream: Spark relays stream 43 into stream 44 (rows of the tensorpool source
    written back as is); a replayed batchId is acknowledged without publishing again."""
    src = ProducerProc(media_driver.dir, shm_base, "--stream-id", "43", "--shape", "256")
    src.produce(40)
    ckpt = str(tmp_path / "ck")
    opts = sink_options(media_driver.dir, shm_base, 44, checkpointLocation=ckpt)
    ensure_publisher(parse_sink_options(opts))
    try:
        consumer = roles(
            "consumer", "--stream-id", "44", "--shape", "256", "--count", "43", "--record"
        )
        consumer.wait_event("mapped")
        read_opts = source_options(
            media_driver, shm_base, streams="43", startingOffsets="earliest", maxFramesPerTrigger=16
        )
        q = (
            spark.readStream.format("tensorpool")
            .options(**read_opts)
            .load()
            .writeStream.format("tensorpool")
            .options(**{k: v for k, v in opts.items() if k != "checkpointLocation"})
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None
        # A replay of batch 0 (same sink id = checkpoint) must not publish again ...
        writer = TensorPoolStreamWriter(parse_sink_options(opts), None)  # type: ignore[arg-type]
        staged = stage_batches(iter([_three_rows(40)]), writer.opts, writer.max_bytes)
        writer.commit([staged], 0)
        assert writer.last_reply is not None and writer.last_reply["skipped"] is True
        # ... while a new batch id publishes its 3 rows (seqs 40..42 on stream 44).
        staged = stage_batches(iter([_three_rows(40)]), writer.opts, writer.max_bytes)
        writer.commit([staged], 10_000)
        assert writer.last_reply["published"] == 3
        done = consumer.wait_event("done", timeout=60)
    finally:
        stop_publisher(opts)
        src.close()
    assert done["n_bad"] == 0 and done["accepted"] == 43
    assert [s for _, s in done["seen"]] == list(range(43))


def _three_rows(first: int) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_pydict(
        {
            "payload": [pattern(s, 256) for s in range(first, first + 3)],
            "dtype": ["uint32"] * 3,
            "shape": [[256]] * 3,
        },
        schema=pa.schema(
            [("payload", pa.binary()), ("dtype", pa.string()), ("shape", pa.list_(pa.int32()))]
        ),
    )
